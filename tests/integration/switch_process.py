"""A switch process (``ina-switch`` or BMv2) in its own namespace as a test target (``topologies.switch_process``).

``ProcessTarget`` is the packet-level suite's ``Target`` on top of a ``SwitchProcess``:
control over P4Runtime, frames through raw sockets on the host ends, and ``receive`` synchronised by
barrier frames instead of sleeps.
"""
from __future__ import annotations

import itertools
import os
import shutil
import struct
import time
from pathlib import Path

from inaproto import wire
from tests.integration.ptfutil import HostPorts
from topologies.switch_process import SwitchNetwork, SwitchProcess

ROOT = Path(__file__).resolve().parents[2]
BMV2_JSON = ROOT / "build" / "ina.json"

# Barrier frames: UDP to 203.0.113.<port> (TEST-NET-3, which no test uses), routed back out of the same port.
BARRIER_NET = 0xCB007100  # 203.0.113.0
BARRIER_UDP_PORT = 9
BARRIER_MAGIC = b"ina-barrier"
BARRIER_MAC = bytes.fromhex("02000000bbbb")
_barrier_nonce = itertools.count(1)


def barrier_frame(port: int, nonce: int) -> bytes:
    payload = BARRIER_MAGIC + struct.pack("!Q", nonce)
    dst = struct.pack("!I", BARRIER_NET + port)
    return wire.udp_frame(BARRIER_MAC, bytes.fromhex("0200000000fe"), bytes([10, 255, 255, 254]), dst,
                          BARRIER_UDP_PORT, BARRIER_UDP_PORT, payload)


def barrier_nonce(frame: bytes) -> int | None:
    """The nonce of a barrier frame after the switch forwarded it, or None for any other frame."""
    if len(frame) != 42 + len(BARRIER_MAGIC) + 8 or frame[42 : 42 + len(BARRIER_MAGIC)] != BARRIER_MAGIC:
        return None
    if frame[23] != 17 or struct.unpack_from("!I", frame, 30)[0] & 0xFFFFFF00 != BARRIER_NET:
        return None
    return struct.unpack_from("!Q", frame, 42 + len(BARRIER_MAGIC))[0]


class ProcessTarget:
    """The packet-level suite's Target on a switch process: P4Runtime control, raw-socket ports 1..10."""

    ports = tuple(range(1, 11))
    BARRIER_TIMEOUT = 10.0

    def __init__(self, net: SwitchNetwork, log_dir: str | Path, kind: str = "ina-switch") -> None:
        from tests.p4rt_client import P4RuntimeTestClient

        self.kind = kind
        self.host = HostPorts(net.hosts)
        self.switch: SwitchProcess | None = None
        self.client = None
        try:
            program = str(BMV2_JSON) if kind == "bmv2" else None
            self.switch = SwitchProcess(net, log_dir, kind=kind, program=program)
            device_config = BMV2_JSON.read_bytes() if kind == "bmv2" else b""
            self.client = P4RuntimeTestClient(self.switch.address, self.switch.device_id, 1, device_config=device_config)
            # Barrier routes: 203.0.113.<p>/32 goes back out of port p.
            self.client.switch.insert(*(
                self.client.schema.entry("MyIngress.ipv4_lpm", ((BARRIER_NET + p, 32),), "MyIngress.ipv4_forward",
                                         (int.from_bytes(BARRIER_MAC, "big"), p))
                for p in self.ports
            ))
        except BaseException:
            self.close()
            raise
        self._used: set[int] = set()
        self._unsendable = 0
        # BMv2 runs egress on other threads than ingress: let a barrier's earlier replicas land.
        self._settle = 0.05 if kind == "bmv2" else 0.0

    # --- control (forwarded to the P4Runtime client) --------------------------------------------------
    def insert_entry(self, table, match, action, params=()):
        self.client.insert_entry(table, match, action, params)

    def modify_entry(self, table, match, action, params=()):
        self.client.modify_entry(table, match, action, params)

    def set_multicast_group(self, group, replicas):
        self.client.set_multicast_group(group, replicas)

    def read_counter(self, name, index):
        return self.client.read_counter(name, index)

    # --- data plane ------------------------------------------------------------------------------------
    def send(self, port: int, frame: bytes) -> None:
        """Send a frame into ``port``. Linux refuses frames shorter than an Ethernet header on an Ethernet
        link, so those never reach a switch process: they are counted and left out, and ``receive`` skips the
        test if such frames were all it sent."""
        if len(frame) < wire.ETH_LEN:
            self._unsendable += 1
            return
        self.host.send(port, frame)
        self._used.add(port)

    def receive(self, expect: int | None = None, timeout: float = 2.0) -> list[tuple[int, bytes]]:
        """Everything the switch emitted for the frames sent so far, in arrival order.

        A barrier frame goes in on every port used since the last call, behind the test's frames; each comes
        back out of its own port once the switch has processed everything before it. With ``expect=N``,
        it then also waits (up to ``timeout``) until N frames are there.
        """
        if self._unsendable and not self._used:
            import pytest

            pytest.skip("frames shorter than an Ethernet header cannot be sent through a veth (Linux refuses them): "
                        "model-only case")
        self._unsendable = 0
        t0 = time.monotonic()
        got: list[tuple[int, bytes]] = []
        waiting: dict[int, int] = {}
        for port in sorted(self._used):
            nonce = next(_barrier_nonce)
            self.host.send(port, barrier_frame(port, nonce))
            waiting[port] = nonce
        self._used.clear()
        deadline = t0 + max(timeout, self.BARRIER_TIMEOUT)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                self.switch.process.check_alive()
                raise AssertionError(f"barrier frames on ports {sorted(waiting)} did not come back within "
                                     f"{self.BARRIER_TIMEOUT} s: {self.switch.process.describe()}")
            for port, frame in self.host.poll(left):
                nonce = barrier_nonce(frame)
                if nonce is None:
                    got.append((port, frame))
                elif waiting.get(port) == nonce:
                    del waiting[port]
        if self._settle:
            time.sleep(self._settle)
        end = t0 + timeout
        while expect is not None and len(got) < expect:
            left = end - time.monotonic()
            if left <= 0:
                break
            got += [(p, f) for p, f in self.host.poll(left) if barrier_nonce(f) is None]
        self.host.drain()
        got += [(p, f) for p, f in self.host.pending if barrier_nonce(f) is None]
        self.host.pending.clear()
        return got

    def close(self) -> None:
        errors = []
        if self.client is not None:
            try:
                self.client.close()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
            self.client = None
        if self.switch is not None:
            code = self.switch.stop()
            if code not in (0, -15, 143) and self.kind == "ina-switch":
                errors.append(RuntimeError(f"ina-switch exited with {code}: {self.switch.process.describe()}"))
            self.switch = None
        self.host.close()
        if errors:
            raise errors[0]


def process_target(kind: str, request) -> ProcessTarget:
    """A fresh switch process for one test; the namespaces are made once per session and removed at its end."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip(f"--target {kind} needs root (network namespaces and raw sockets)")
    if kind == "bmv2":
        if shutil.which("simple_switch_grpc") is None:
            pytest.skip("--target bmv2: simple_switch_grpc is not on PATH")
        if not BMV2_JSON.exists():
            pytest.skip(f"--target bmv2: {BMV2_JSON.relative_to(ROOT)} is missing (make p4 compiles it with p4c)")
    config = request.config
    net = getattr(config, "_ina_switch_network", None)
    if net is None:
        from topologies.netns import Network, sweep_stale

        sweep_stale()
        network = Network("pkt")
        config.add_cleanup(network.close)
        net = SwitchNetwork(network, ProcessTarget.ports)
        config._ina_switch_network = net
    log_dir = request.getfixturevalue("tmp_path")
    return ProcessTarget(net, log_dir, kind)
