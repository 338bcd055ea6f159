"""PTF-style data-plane helpers: host ports as raw sockets in their namespaces, send and verify with masks.

Names and shapes follow PTF's ``ptf.testutils`` and ``ptf.mask`` so a PTF user recognises them; the first
argument is a ``HostPorts`` (PTF's ``test.dataplane``) instead of the test object:

    ports = HostPorts({1: (h1, "eth0"), 2: (h2, "eth0")})
    send_packet(ports, 1, pkt)
    exp = Mask(expected_pkt)
    exp.set_do_not_care_scapy(IP, "chksum")
    verify_packets(ports, exp, [1, 2])
    verify_no_other_packets(ports)
"""
from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterable

from scapy.packet import Packet, raw

from topologies.netns import Namespace

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
DEFAULT_TIMEOUT = 2.0
NEGATIVE_TIMEOUT = 0.1


class HostPorts:
    """Raw AF_PACKET sockets on host ends of veth pairs, each opened inside its own namespace.

    Frames received are kept (``pending``) until a verify function or ``poll`` consumes them; the sockets
    ignore the frames they send themselves.
    """

    def __init__(self, ports: dict[int, tuple[Namespace, str]]) -> None:
        self.sockets: dict[int, socket.socket] = {}
        self.pending: list[tuple[int, bytes]] = []
        self._epoll = select.epoll()
        self._by_fd: dict[int, int] = {}
        try:
            for port, (ns, iface) in ports.items():
                s = ns.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                self.sockets[port] = s
                s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.bind((iface, ETH_P_ALL))
                s.setblocking(False)
                self._epoll.register(s.fileno(), select.EPOLLIN)
                self._by_fd[s.fileno()] = port
        except BaseException:
            self.close()
            raise

    def send(self, port: int, frame: bytes | Packet) -> None:
        data = raw(frame) if isinstance(frame, Packet) else frame
        self.sockets[port].send(data)

    def _read(self, timeout: float) -> int:
        n = 0
        for fd, _ in self._epoll.poll(max(0.0, timeout)):
            port = self._by_fd[fd]
            sock = self.sockets[port]
            while True:
                try:
                    self.pending.append((port, sock.recv(65536)))
                    n += 1
                except BlockingIOError:
                    break
        return n

    def drain(self) -> None:
        """Read whatever has arrived, without waiting."""
        while self._read(0):
            pass

    def poll(self, timeout: float) -> list[tuple[int, bytes]]:
        """Wait up to ``timeout`` for at least one frame; return and forget everything received so far."""
        deadline = time.monotonic() + timeout
        self.drain()
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._read(left)
        out, self.pending = self.pending, []
        return out

    def wait_for(self, predicate, timeout: float) -> tuple[int, bytes] | None:
        """Remove and return the first pending frame ``(port, frame)`` that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            for i, item in enumerate(self.pending):
                if predicate(*item):
                    return self.pending.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._read(left)

    def close(self) -> None:
        for s in self.sockets.values():
            s.close()
        self.sockets.clear()
        self._epoll.close()


class Mask:
    """An expected packet with don't-care bits (``ptf.mask.Mask``)."""

    def __init__(self, exp_pkt: Packet | bytes, ignore_extra_bytes: bool = False) -> None:
        self.exp_pkt = exp_pkt
        self.exp = raw(exp_pkt) if isinstance(exp_pkt, Packet) else bytes(exp_pkt)
        self.mask = bytearray(b"\xff" * len(self.exp))
        self.ignore_extra_bytes = ignore_extra_bytes

    def set_do_not_care(self, offset: int, bitwidth: int) -> None:
        """Ignore ``bitwidth`` bits from bit ``offset`` of the packet."""
        for bit in range(offset, offset + bitwidth):
            self.mask[bit // 8] &= ~(0x80 >> (bit % 8)) & 0xFF

    def set_do_not_care_scapy(self, hdr_type, field_name: str) -> None:
        """Ignore one field of one scapy layer of the expected packet (e.g. ``IP, "chksum"``)."""
        if not isinstance(self.exp_pkt, Packet):
            raise TypeError("set_do_not_care_scapy needs the expected packet as a scapy Packet")
        offset = 0
        layer = self.exp_pkt
        while layer is not None and not isinstance(layer, hdr_type):
            offset += len(raw(layer)) - len(raw(layer.payload))
            layer = layer.payload if layer.payload else None
        if layer is None:
            raise ValueError(f"no {hdr_type.__name__} layer in the expected packet")
        bit = 0
        for f in layer.fields_desc:
            width = round(f.sz * 8)  # scapy: bytes, fractional for bit fields
            if f.name == field_name:
                self.set_do_not_care(offset * 8 + bit, width)
                return
            bit += width
        raise ValueError(f"{hdr_type.__name__} has no field {field_name}")

    def set_ignore_extra_bytes(self) -> None:
        self.ignore_extra_bytes = True

    def pkt_match(self, pkt: bytes | Packet) -> bool:
        data = raw(pkt) if isinstance(pkt, Packet) else pkt
        if len(data) != len(self.exp) and not (self.ignore_extra_bytes and len(data) > len(self.exp)):
            return False
        return all((a & m) == (b & m) for a, b, m in zip(data, self.exp, self.mask))

    def __str__(self) -> str:
        return f"Mask({self.exp.hex()} / {self.mask.hex()})"


def _matches(expected, frame: bytes) -> bool:
    if isinstance(expected, Mask):
        return expected.pkt_match(frame)
    return (raw(expected) if isinstance(expected, Packet) else bytes(expected)) == frame


def send_packet(ports: HostPorts, port: int, pkt: Packet | bytes, count: int = 1) -> None:
    """Send ``pkt`` into the switch from the host end of ``port`` (``ptf.testutils.send_packet``)."""
    for _ in range(count):
        ports.send(port, pkt)


def verify_packet(ports: HostPorts, pkt, port: int, timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """A frame matching ``pkt`` (a packet, bytes or Mask) arrives on ``port``; returns it."""
    got = ports.wait_for(lambda p, f: p == port and _matches(pkt, f), timeout)
    if got is None:
        seen = [(p, f.hex()) for p, f in ports.pending]
        raise AssertionError(f"expected packet not received on port {port} within {timeout} s; other frames: {seen[:5]}")
    return got[1]


def verify_packets(ports: HostPorts, pkt, port_list: Iterable[int], timeout: float = DEFAULT_TIMEOUT) -> dict[int, bytes]:
    """A frame matching ``pkt`` on every port of ``port_list`` (and no check of other ports)."""
    return {p: verify_packet(ports, pkt, p, timeout) for p in port_list}


def verify_no_packet(ports: HostPorts, pkt, port: int, timeout: float = NEGATIVE_TIMEOUT) -> None:
    """No frame matching ``pkt`` arrives on ``port`` within ``timeout``."""
    got = ports.wait_for(lambda p, f: p == port and _matches(pkt, f), timeout)
    if got is not None:
        raise AssertionError(f"unexpected packet on port {port}: {got[1].hex()}")


def verify_no_other_packets(ports: HostPorts, timeout: float = NEGATIVE_TIMEOUT) -> None:
    """Nothing else arrived (waits ``timeout`` for latecomers): ``ptf.testutils.verify_no_other_packets``."""
    extra = ports.poll(timeout)
    if extra:
        raise AssertionError(f"{len(extra)} unexpected packet(s): " + ", ".join(f"port {p}: {f[:64].hex()}" for p, f in extra[:5]))
