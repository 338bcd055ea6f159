"""Switch processes (``ina-switch`` or BMv2) in namespaces of their own as targets of the packet-level suite.

``SwitchProcesses`` keeps one switch process per index for a whole run (started on first use, started again if
it died); ``ProcessTarget`` is one test's view of one of them: a pipeline pushed afresh over P4Runtime (every
table, multicast group, counter and register starts empty, as on a switch just started), control over
P4Runtime, frames through raw sockets on the host ends, and ``receive`` synchronised by barrier frames instead
of sleeps.
"""
from __future__ import annotations

import itertools
import struct
import time
from pathlib import Path

from inaproto import wire
from tests.integration.ptfutil import HostPorts
from topologies.switch_process import SwitchNetwork, SwitchProcess

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
    """The packet-level suite's Target on a running switch process: a fresh pipeline, P4Runtime control, raw-socket
    ports 1..10."""

    ports = tuple(range(1, 11))
    BARRIER_TIMEOUT = 10.0

    def __init__(self, switch: SwitchProcess, host: HostPorts, kind: str, device_config: bytes, *,
                 used: bool = True) -> None:
        from tests.p4rt_client import P4RuntimeTestClient

        self.kind = kind
        self.switch = switch
        self.host = host  # the host ends' raw sockets, open for the whole run (closing one takes the kernel ~10 ms)
        self.client = None
        try:
            self.client = P4RuntimeTestClient(switch.address, switch.device_id, 1)
            # Pushing the pipeline empties every table, counter and register; BMv2 keeps its multicast groups
            # in its replication engine (while its P4Runtime layer forgets them), so those of an earlier test go
            # first (``used``: an earlier test pushed a pipeline).
            groups = self.client.switch.read_groups() if used else []
            if groups:
                self.client.switch.delete(*groups)
            self.client.set_forwarding_pipeline(device_config)
            # Barrier routes: 203.0.113.<p>/32 goes back out of port p.
            self.client.switch.insert(*(
                self.client.schema.entry("MyIngress.ipv4_lpm", ((BARRIER_NET + p, 32),), "MyIngress.ipv4_forward",
                                         (int.from_bytes(BARRIER_MAC, "big"), p))
                for p in self.ports
            ))
        except BaseException:
            self._release()
            raise
        self._unsendable = 0
        # Whatever an earlier test left in flight comes out before a barrier on every port.
        self._used: set[int] = set(self.ports)
        self.receive()

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
        back out of its own port once the switch has processed everything before it. BMv2 then gets a second
        round on every port: its egress runs on other threads than its one ingress thread, so a replica of an
        earlier frame to another port may still wait in that port's queue when the first round is back, but it
        is queued there ahead of the second round's barrier. With ``expect=N``, it then also waits (up to
        ``timeout``) until N frames are there.
        """
        if self._unsendable and not self._used:
            import pytest

            pytest.skip("frames shorter than an Ethernet header cannot be sent through a veth (Linux refuses them): "
                        "model-only case")
        self._unsendable = 0
        t0 = time.monotonic()
        deadline = t0 + max(timeout, self.BARRIER_TIMEOUT)
        got = self._barrier(sorted(self._used), deadline)
        if self.kind == "bmv2" and self._used:
            got += self._barrier(self.ports, deadline)
        self._used.clear()
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

    def _barrier(self, ports, deadline: float) -> list[tuple[int, bytes]]:
        """A barrier frame into each of ``ports``; the other frames that came out until every one was back."""
        got: list[tuple[int, bytes]] = []
        waiting: dict[int, int] = {}
        for port in ports:
            nonce = next(_barrier_nonce)
            self.host.send(port, barrier_frame(port, nonce))
            waiting[port] = nonce
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
        return got

    def _release(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def close(self) -> None:
        """Close this test's client; the switch process and the host ends go on (an error if it died meanwhile)."""
        self._release()
        if not self.switch.process.alive():
            raise RuntimeError(f"{self.kind} exited during the test: {self.switch.process.describe()}")


class SwitchProcesses:
    """The switch processes of one kind for a whole run: index 0 on the suite's switch network, each other index
    (chains, trees) on one of its own; a process is started on first use and again if it died."""

    def __init__(self, kind: str, log_dir: Path, program: Path | None = None) -> None:
        from topologies.netns import sweep_stale

        self.kind, self.log_dir, self.program = kind, log_dir, program
        self.device_config = program.read_bytes() if program is not None else b""
        self.networks: dict[int, SwitchNetwork] = {}
        self.hosts: dict[int, HostPorts] = {}
        self.switches: dict[int, SwitchProcess] = {}
        sweep_stale()

    def target(self, index: int = 0) -> ProcessTarget:
        """A fresh target on switch ``index``."""
        from topologies.netns import Network

        net = self.networks.get(index)
        if net is None:
            net = self.networks[index] = SwitchNetwork(Network("pkt" if index == 0 else f"pk{index}"), ProcessTarget.ports)
            self.hosts[index] = HostPorts(net.hosts)
        switch = self.switches.get(index)
        used = switch is not None and switch.process.alive()
        if not used:
            if switch is not None:
                switch.stop()
            log_dir = self.log_dir / f"s{index}"
            log_dir.mkdir(parents=True, exist_ok=True)
            switch = self.switches[index] = SwitchProcess(
                net, log_dir, kind=self.kind, program=str(self.program) if self.program is not None else None)
        return ProcessTarget(switch, self.hosts[index], self.kind, self.device_config, used=used)

    def close(self) -> None:
        """Stop every switch (an error if ina-switch did not exit cleanly), then remove the namespaces."""
        errors = []
        for switch in self.switches.values():
            code = switch.stop()
            if code not in (0, -15, 143) and self.kind == "ina-switch":
                errors.append(RuntimeError(f"ina-switch exited with {code}: {switch.process.describe()}"))
        for host in self.hosts.values():
            host.close()
        for net in self.networks.values():
            net.network.close()
        if errors:
            raise errors[0]
