"""UDP I/O of the agent's sockets: runs of equal-size datagrams sent, datagrams drained into one buffer.

The worker's stream sends and receives one datagram per system call (``batched=False``: a window of INA packets
is bound by the switch's round trip, and batching gave it nothing measurable). A Rina host member's copy, which
forwards every frame of its chain and is CPU-bound, batches (``batched=True``): a run of K packets of one size
to one address goes to the kernel as one ``sendmsg`` with a ``UDP_SEGMENT`` control message (UDP generic
segmentation offload; at most ``GSO_MAX_SEGMENTS``, 64, under 64 KiB), and ``UDP_GRO`` hands over coalesced
datagrams of one sender in one read, with their segment size in a control message. Where the kernel lacks
either option (checked once, at setup) or a segmented send fails (an old kernel refusing GSO on a device
without checksum offload), the socket sends and reads one datagram per call, and says so once in the log.
docs/agent.md, "I/O".
"""
from __future__ import annotations

import errno
import logging
import socket
import struct
import sys
from collections.abc import Callable

__all__ = ["GSO_MAX_SEGMENTS", "DatagramIo", "gso_supported"]

log = logging.getLogger("host_agent.udp_io")

SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # linux/udp.h
UDP_GRO = getattr(socket, "UDP_GRO", 104)
GSO_MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS: the kernel refuses more per call
GSO_MAX_BYTES = 65_000  # one IPv4 datagram: payload + headers < 64 KiB
_GRO_CMSG_SPACE = socket.CMSG_SPACE(4)
_INT = struct.Struct("=i")  # UDP_GRO's control message: the segment size, a native int
# errors of a segmented send that mean "not here" (the batch is then sent per packet)
_GSO_UNSUPPORTED = {errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT, errno.EMSGSIZE}


def _refused(exc: OSError) -> bool:
    """The socket cannot take the datagram now (its buffer full: EAGAIN or ENOBUFS; an interrupted call; a
    pending ICMP error): it is dropped, as on the link."""
    return isinstance(exc, (BlockingIOError, ConnectionRefusedError, InterruptedError)) or exc.errno == errno.ENOBUFS


def gso_supported(sock: socket.socket) -> bool:
    """Whether the kernel knows UDP_SEGMENT on this socket (a send can still be refused: see DatagramIo)."""
    try:
        sock.getsockopt(SOL_UDP, UDP_SEGMENT)
        return True
    except OSError:
        return False


def _set_gro(sock: socket.socket, on: bool) -> bool:
    """UDP_GRO on or off; False where the kernel has no such option."""
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, int(on))
        return on
    except OSError:
        return False


class DatagramIo:
    """The send and receive paths of one UDP socket (non-blocking).

    Args:
        sock: the socket; with GRO on, every read of it must go through ``drain`` (a read could
            return several datagrams at once).
        batched: GSO sends and GRO reads where the kernel has them; False: one datagram per system call.
        name: for the log line saying which paths are in use.
    """

    def __init__(self, sock: socket.socket, *, batched: bool, name: str = "agent") -> None:
        self.sock = sock
        self.name = name
        self.gso = batched and gso_supported(sock)
        self.gro = _set_gro(sock, batched)  # off explicitly: an earlier user may have set it
        self._cmsg_cache: dict[int, list] = {}
        self.unsent = 0  # datagrams of the last ``send_run(..., in_order=True)`` that did not go
        log.info("%s: UDP send %s, receive %s", name,
                 "in GSO batches (UDP_SEGMENT)" if self.gso else "per packet (sendto)",
                 "with GRO (UDP_GRO)" if self.gro else "per datagram")
        if batched and not (self.gso and self.gro):
            log.info("%s: the kernel lacks %s: per-packet fallback for it", name,
                     " and ".join(n for n, ok in (("UDP_SEGMENT", self.gso), ("UDP_GRO", self.gro)) if not ok))

    def send_run(self, buf: memoryview, size: int, count: int, addr: tuple[str, int], *, in_order: bool = False) -> int:
        """Send ``count`` datagrams of ``size`` bytes, back to back in ``buf``, to ``addr``; returns the
        system calls made. A datagram the socket cannot take now (buffer full) is dropped, like a lost
        packet: the caller's retransmission recovers it.

        ``in_order``: stop at the first datagram the socket refuses (a GSO call takes all its datagrams or
        none) and leave in ``unsent`` how many of the run, from that one on, did not go (0: all went). A
        caller that numbers its datagrams (``Flags.TX_COUNTED``) gives those numbers back: a receiver would
        otherwise read the refused ones as lost on the way (docs/agent.md, "Loss signals")."""
        self.unsent = 0
        if count <= 0:
            return 0
        if not self.gso or count == 1:
            return self._send_each(buf, size, 0, count, addr, in_order)
        per_call = max(1, min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size))
        cmsg = self._cmsg_cache.get(size)
        if cmsg is None:
            cmsg = self._cmsg_cache[size] = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))]
        sendmsg = self.sock.sendmsg
        calls = 0
        first = 0
        while first < count:
            k = min(per_call, count - first)
            calls += 1
            if k == 1:
                calls += self._send_each(buf, size, first, 1, addr, in_order) - 1
                if self.unsent:
                    self.unsent = count - first
                    return calls
            else:
                try:
                    sendmsg([buf[first * size : (first + k) * size]], cmsg, 0, addr)
                except OSError as exc:
                    if not _refused(exc):
                        if exc.errno not in _GSO_UNSUPPORTED:
                            raise
                        self.gso = False
                        log.warning("%s: a segmented UDP send failed (%s): sending per packet from now on", self.name, exc)
                        return calls + self._send_each(buf, size, first, count - first, addr, in_order)
                    if in_order:  # the call took none of its datagrams
                        self.unsent = count - first
                        return calls
            first += k
        return calls

    def _send_each(self, buf: memoryview, size: int, first: int, count: int, addr: tuple[str, int],
                   in_order: bool = False) -> int:
        """One ``sendto`` per datagram; returns the calls made (with ``in_order``, up to the first refused one,
        and ``unsent`` counts it and the rest)."""
        sendto = self.sock.sendto
        for j in range(first, first + count):
            try:
                sendto(buf[j * size : (j + 1) * size], addr)
            except OSError as exc:
                if not _refused(exc):
                    raise
                if in_order:
                    self.unsent = first + count - j
                    return j - first + 1
        return count

    def drain(self, view: memoryview, on_run: Callable[[int, int, int], int]) -> int:
        """Read every datagram waiting, until the socket would block or ``view`` has no room for another read.

        Reads land back to back in ``view``. ``on_run(offset, size, count)`` is called for each read: ``count``
        datagrams of ``size`` bytes at ``offset`` (several where the kernel coalesced them; the last one of
        a coalesced read may be shorter, and comes as a run of its own). It returns how many bytes at
        ``offset`` to keep (it may compact what it keeps to the front); the next read goes after them.
        Returns the bytes kept; the caller drains again if that filled ``view`` (``len(view) - room``).
        """
        sock = self.sock
        room = self.read_room
        end = len(view) - room
        off = 0
        if not self.gro:
            recv_into = sock.recv_into
            while off <= end:
                try:
                    n = recv_into(view[off:], room)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:
                    continue
                off += on_run(off, n, 1)
            return off
        recvmsg_into = sock.recvmsg_into
        while off <= end:
            try:
                n, anc, _flags, _src = recvmsg_into([view[off : off + room]], _GRO_CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:
                continue
            seg = _gro_segment(anc, n)
            if not 0 < seg < n:
                off += on_run(off, n, 1)
                continue
            full, tail = divmod(n, seg)
            keep = on_run(off, seg, full)
            if tail:
                if keep != full * seg:
                    view[off + keep : off + keep + tail] = view[off + full * seg : off + n]
                keep += on_run(off + keep, tail, 1)
            off += keep
        return off

    def drain_sources(self, view: memoryview, on_read: Callable[[int, int, int, tuple[str, int]], None]) -> int:
        """``drain`` for a socket that hears several senders (a Rina host member's copy): reads land back to
        back in ``view`` and are all kept; ``on_read(offset, length, segment, source)`` is called for each read
        (one sender's datagrams: ``length // segment`` of ``segment`` bytes, then a shorter one for the rest;
        ``segment == length`` without coalescing). Returns the bytes read; the caller drains again if that
        left less than ``read_room`` free."""
        room = self.read_room
        end = len(view) - room
        off = 0
        recvmsg_into = self.sock.recvmsg_into
        space = _GRO_CMSG_SPACE if self.gro else 0
        while off <= end:
            try:
                n, anc, _flags, src = recvmsg_into([view[off : off + room]], space)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:
                continue
            seg = _gro_segment(anc, n)
            if n:
                on_read(off, n, seg if 0 < seg < n else n, src)
            off += n
        return off

    @property
    def read_room(self) -> int:
        """Room one read needs in the drain buffer."""
        return 65_536 if self.gro else 2048


def _gro_segment(ancillary: list, length: int) -> int:
    """The segment size of a coalesced read (its ``UDP_GRO`` control message), or ``length`` without one."""
    for level, kind, data in ancillary:
        if level == SOL_UDP and kind == UDP_GRO and len(data) >= 2:
            return int.from_bytes(data[:2], sys.byteorder) if len(data) < 4 else _INT.unpack_from(data)[0]
    return length
