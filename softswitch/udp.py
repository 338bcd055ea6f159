"""The switch pipeline model behind a UDP socket: an INA switch for agents on 127.0.0.x, without root.

``UdpSwitch`` runs ``p4src.ina_model.InaPipeline`` on a UDP socket: each datagram it receives becomes an
Ethernet/IPv4/UDP frame on the ingress port of its sender, and each frame the pipeline emits is sent as
a datagram to the frame's destination IP and UDP port. Seeded faults (drop, duplicate, reorder) in both
directions make loss recovery testable. The agent's tests and ``bench/agent_bench.py`` use it.
"""
from __future__ import annotations

import heapq
import ipaddress
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from p4src.ina_model import InaPipeline

__all__ = ["SWITCH_MAC", "Faults", "UdpSwitch", "UdpWorker", "make_switches"]


class UdpWorker(Protocol):
    """What the switch needs of a worker (``host_agent.grant.Worker`` is one)."""

    worker_id: int
    ip: str
    udp_port: int


SWITCH_MAC = bytes.fromhex("0200000000fe")
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # each read says how many datagrams the kernel dropped so far
_CMSG_SPACE = socket.CMSG_SPACE(16) + socket.CMSG_SPACE(4)


def _mac_bytes(worker_id: int) -> bytes:
    return bytes.fromhex(f"0200000001{worker_id + 1:02x}")


@dataclass
class Faults:
    """Per-datagram fault probabilities, applied independently to packets into and out of the switch."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # held back for up to reorder_delay seconds, so later packets overtake it
    reorder_delay: float = 0.002


class UdpSwitch:
    """The pipeline model behind a UDP socket at ``address``; a daemon thread forwards until ``close``.

    Args:
        name: switch name (as in SwitchGrant.switch).
        ip, port: where workers send INA packets (port 0: any free port).
        faults: fault injection; change it any time with ``set_faults``.
        seed: the fault generator's seed.
        pipeline: an existing pipeline (e.g. one the real controller programs over P4Runtime).
    """

    def __init__(self, name: str = "s1", ip: str = "127.0.0.1", port: int = 0, *, faults: Faults | None = None,
                 seed: int = 0, pipeline: InaPipeline | None = None) -> None:
        self.name = name
        self.pipeline = pipeline if pipeline is not None else InaPipeline()  # or one a controller programs
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
        self.sock.bind((ip, port))
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.ip_bytes = ipaddress.IPv4Address(ip).packed
        self.faults = faults or Faults()
        self.rng = random.Random(seed)
        self.ports: dict[tuple[str, int], int] = {}  # sender address -> switch port
        self.macs: dict[tuple[str, int], bytes] = {}  # sender address -> the source MAC its frames carry
        self.hosts: dict[str, tuple[int, bytes]] = {}  # sender IP -> (switch port, MAC), for any of its UDP ports
        self.received = 0
        self.forwarded = 0
        self.dropped = 0
        self.kernel_drops = 0  # datagrams the kernel dropped before the switch read them (its socket's buffer full)
        self._queue: list = []  # heap of (release time, order, "in"/"out", payload, address)
        self._order = 0
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, _SO_RXQ_OVFL, 1)
        except OSError:  # pragma: no cover - every Linux since 2.6.33 has it
            pass
        self._stop = threading.Event()
        self._held = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"udp-switch-{name}", daemon=True)
        self._thread.start()

    # --- control plane, as the controller writes it --------------------------------------------------
    def attach(self, ip: str, udp_port: int, switch_port: int | None = None, mac: str | bytes | None = None) -> int:
        """The switch port of the worker at ``ip:udp_port`` (``switch_port``, or allocated on first use from 1);
        its frames carry source MAC ``mac`` (default: one derived from the port), as a host's NIC would."""
        key = (ip, udp_port)
        if switch_port is not None:
            self.ports[key] = switch_port
        elif key not in self.ports:
            self.ports[key] = len(self.ports) + 1
        if mac is not None:
            self.macs[key] = bytes.fromhex(mac.replace(":", "")) if isinstance(mac, str) else mac
        return self.ports[key]

    def attach_host(self, ip: str, switch_port: int, mac: str | bytes) -> None:
        """Every UDP port of ``ip`` (a host, or a switch, behind ``switch_port``) sends from that port with source
        MAC ``mac``, unless :meth:`attach` says otherwise for one of them."""
        self.hosts[ip] = (switch_port, bytes.fromhex(mac.replace(":", "")) if isinstance(mac, str) else mac)

    def port_of(self, ip: str, udp_port: int) -> int:
        """The switch port frames from ``ip:udp_port`` come in on (0: unknown)."""
        port = self.ports.get((ip, udp_port))
        if port is None:
            port = self.hosts.get(ip, (0, b""))[0]
        return port

    def source_mac(self, ip: str, udp_port: int) -> bytes:
        """The source MAC of frames from ``ip:udp_port`` (what the ingress binding checks)."""
        key = (ip, udp_port)
        if key not in self.macs and key not in self.ports and ip in self.hosts:
            return self.hosts[ip][1]
        return self.macs.get(key) or _mac_bytes(self.ports.get(key, 0))

    def install_job(self, job_id: int, workers: Sequence[UdpWorker], base: int, num_slots: int, generation: int,
                    mcast_grp: int | None = None) -> int:
        """``ina_job`` entry, multicast group and ``ina_worker`` entries for ``workers``; returns the group."""
        addresses = [WorkerAddress(w.worker_id, self.attach(w.ip, w.udp_port), self.source_mac(w.ip, w.udp_port), w.ip,
                                   w.udp_port) for w in workers]
        entries = job_entries(job_id, addresses, base_slot=base, num_slots=num_slots, generation=generation,
                              mcast_grp=mcast_grp)
        p = self.pipeline
        p.set_multicast_group(entries.group.group_id, list(entries.group.replicas))
        for e in entries.table_entries:
            if e.match in p.table(e.table).entries:
                p.modify_entry(e.table, e.match, e.action, e.params)
            else:
                p.insert_entry(e.table, e.match, e.action, e.params)
        return entries.group.group_id

    def remove_job(self, job_id: int) -> None:
        p = self.pipeline
        if (job_id,) in p.table("MyIngress.ina_job").entries:
            p.delete_entry("MyIngress.ina_job", (job_id,))
        for table in ("MyEgress.ina_worker", "MyIngress.ina_binding"):
            for match in [m for m in p.table(table).entries if m[0] == job_id]:
                p.delete_entry(table, match)

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults

    def hold(self) -> None:
        """Stop processing and forwarding: frames queue up until :meth:`release` (a test acts at a known point
        of a job, e.g. a reallocation mid-call that no worker can finish the call before noticing)."""
        self._held.set()

    def release(self) -> None:
        self._held.clear()

    def counter(self, name: str, index: int) -> int:
        return self.pipeline.counter(name)[index]

    # --- data plane ----------------------------------------------------------------------------------
    # Every datagram goes through one queue ordered by release time: its kernel receive time (ingress)
    # or its emission time (egress), plus a random hold of at most `reorder_delay` when the reorder
    # fault picks it. So a packet is overtaken only by packets that arrived less than reorder_delay
    # after it, however long the switch's socket queue is: bounded reordering, which the agent's
    # optional reorder_guard can be set against (docs/agent.md, "Loss recovery").

    def _schedule(self, kind: str, payload: bytes, addr: tuple[str, int], at: float) -> None:
        f = self.faults
        r = self.rng.random
        if f.drop and r() < f.drop:
            self.dropped += 1
            return
        copies = 2 if f.duplicate and r() < f.duplicate else 1
        for _ in range(copies):
            hold = r() * f.reorder_delay if f.reorder and r() < f.reorder else 0.0
            self._order += 1
            heapq.heappush(self._queue, (at + hold, self._order, kind, payload, addr))

    def _ingress(self, data: bytes, src: tuple[str, int]) -> None:
        port = self.port_of(*src)
        frame = wire.udp_frame(self.source_mac(*src), SWITCH_MAC, ipaddress.IPv4Address(src[0]).packed, self.ip_bytes,
                               src[1], wire.INA_UDP_PORT, data)
        now = time.time()
        for _port, out in self.pipeline.process(port, frame):
            if len(out) < wire.INA_OFFSET:
                continue
            dst_ip = socket.inet_ntoa(out[30:34])
            dport = int.from_bytes(out[36:38], "big")
            self._schedule("out", out[wire.INA_OFFSET :], (dst_ip, dport), now)

    def _run(self) -> None:
        sock = self.sock
        sock.setblocking(False)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        queue_ = self._queue
        while not self._stop.is_set():
            while True:  # everything waiting in the socket, stamped with its kernel receive time
                try:
                    data, anc, _flags, src = sock.recvmsg(4096, _CMSG_SPACE)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    if self._stop.is_set():
                        return
                    break
                at = time.time()
                for level, kind, cdata in anc:
                    if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(cdata) >= 16:
                        sec, nsec = struct.unpack("qq", cdata[:16])
                        at = sec + nsec * 1e-9
                    elif level == socket.SOL_SOCKET and kind == _SO_RXQ_OVFL and len(cdata) >= 4:
                        self.kernel_drops = struct.unpack("I", cdata[:4])[0]  # a running count
                self.received += 1
                self._schedule("in", data, src, at)
            if self._held.is_set():
                poller.poll(5)
                continue
            now = time.time()
            while queue_ and queue_[0][0] <= now:
                _, _, kind, payload, addr = heapq.heappop(queue_)
                if kind == "in":
                    self._ingress(payload, addr)
                else:
                    try:
                        sock.sendto(payload, addr)
                        self.forwarded += 1
                    except OSError:
                        pass
            if queue_:
                wait = max(queue_[0][0] - time.time(), 0.0)
                if wait == 0.0:
                    continue
                poller.poll(wait * 1000.0)
            else:
                poller.poll(50)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_switches(names: list[str], **kwargs) -> list[UdpSwitch]:
    """One UdpSwitch per name, on 127.0.1.1, 127.0.1.2, ... and one common port (the grant's ina_port)."""
    for _ in range(50):
        first = UdpSwitch(names[0], "127.0.1.1", 0, **kwargs)
        port = first.address[1]
        out = [first]
        try:
            for i, name in enumerate(names[1:], start=2):
                out.append(UdpSwitch(name, f"127.0.1.{i}", port, **kwargs))
            return out
        except OSError:
            for s in out:
                s.close()
    raise OSError("could not bind the switches on a common port")
