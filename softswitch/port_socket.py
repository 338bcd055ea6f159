"""A switch port's raw AF_PACKET socket: bound to one interface, promiscuous, blind to its own sends."""
from __future__ import annotations

import fcntl
import socket
import struct

from softswitch.errors import SoftSwitchError

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_IGNORE_OUTGOING = 23  # Linux >= 4.20: a packet socket does not see its own (or anyone's) outgoing frames
PACKET_OUTGOING = 4
PACKET_STATISTICS = 6  # struct tpacket_stats: tp_packets, tp_drops (reset by each read)
SOCKET_BUFFER = 4 << 20
SIOCGIFFLAGS = 0x8913


class DataPlaneError(SoftSwitchError, RuntimeError):
    """A port that cannot be opened (no such interface, no permission)."""


def open_port_socket(iface: str, *, promiscuous: bool = True) -> tuple[socket.socket, bool]:
    """A raw AF_PACKET socket bound to ``iface``, and whether the kernel hides outgoing frames from it.

    Where it cannot (kernels before 4.20), the caller must skip frames whose pkttype is PACKET_OUTGOING.
    """
    try:
        # Protocol 0 at creation, ETH_P_ALL at bind: no frame of another interface is ever queued on it.
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except PermissionError:
        raise DataPlaneError("raw AF_PACKET sockets need root (or CAP_NET_RAW)") from None
    try:
        try:
            sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            ignores_outgoing = True
        except OSError:  # kernels before 4.20: outgoing frames are filtered by pkttype instead
            ignores_outgoing = False
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        try:
            sock.bind((iface, ETH_P_ALL))
        except OSError as e:
            raise DataPlaneError(f"cannot open interface {iface!r}: {e.strerror or e}") from None
        if promiscuous:  # as BMv2 (libpcap) does; the membership ends with the socket
            ifindex = socket.if_nametoindex(iface)
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b""))
    except BaseException:
        sock.close()
        raise
    return sock, ignores_outgoing


def interface_is_up(sock: socket.socket, iface: str) -> bool:
    """IFF_UP of an interface (SIOCGIFFLAGS on any socket of its namespace)."""
    try:
        flags = struct.unpack_from("16sH", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, struct.pack("16sH22x", iface.encode(), 0)))[1]
    except OSError:
        return True  # cannot tell: say nothing
    return bool(flags & 0x1)


def receive_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped at a packet socket since the last call (its receive buffer full:
    PACKET_STATISTICS, which each read resets)."""
    try:
        return struct.unpack("=II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
    except OSError:
        return 0
