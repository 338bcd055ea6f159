"""Linux PACKET_MMAP rings on one AF_PACKET socket: a TPACKET_V3 receive ring of blocks and a transmit ring.

Receive (Documentation/networking/packet_mmap.rst, "TPACKET_V3"): the kernel fills a block with frames and
hands it over (``block_status`` TP_STATUS_USER) when it is full or when the retire timer fires
(``RETIRE_MS``, rounded up to a jiffy); user space reads every frame of it (``tpacket3_hdr`` chained by
``tp_next_offset``) and gives it back (TP_STATUS_KERNEL). No syscall per frame, and one poll() wake-up
brings every block filled meanwhile.

Transmit (same socket, so same TPACKET_V3 header): fixed-size frame slots; a frame is copied into the
next AVAILABLE slot and marked TP_STATUS_SEND_REQUEST, and one ``send()`` per port per batch hands every
marked slot to the kernel, which sets it AVAILABLE again once the frame has left (after the interface's
qdisc: shaped links keep their shaping). The flush does not wait (MSG_DONTWAIT); only a full ring, or a
socket buffer that is full, waits for the kernel, as a blocking send() would for one frame.

Anything the kernel refuses while setting up raises ``RingUnavailable`` with the reason, so the caller
can fall back to one recv()/send() per frame.
"""
from __future__ import annotations

import errno
import mmap
import socket
import struct

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_VERSION = 10
PACKET_TX_RING = 13
PACKET_LOSS = 14  # a malformed transmit slot is skipped instead of stopping the flush
TPACKET_V3 = 2

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_AVAILABLE = 0
TP_STATUS_SEND_REQUEST = 1
TP_STATUS_WRONG_FORMAT = 4

RX_BLOCK_SIZE = 1 << 14  # 16 KiB: about 60 INA frames; a block is handed over when full or retired
RX_BLOCKS = 64
RETIRE_MS = 1  # a partly filled block waits at most this long (one jiffy at least: 4 ms at HZ=250)
TX_FRAME_SIZE = 1 << 11  # one slot per frame: frames up to TX_FRAME_SIZE - TX_DATA_OFFSET bytes
TX_FRAMES = 1024
TX_BLOCK_SIZE = 1 << 16

# struct tpacket_req3: block_size, block_nr, frame_size, frame_nr, retire_blk_tov, sizeof_priv, feature_req_word
_REQ3 = struct.Struct("=7I")
# struct tpacket_block_desc: version, offset_to_priv, then tpacket_hdr_v1: block_status, num_pkts, offset_to_first_pkt
_BLOCK_STATUS = struct.Struct("=I")
_BLOCK_STATUS_OFFSET = 8
_BLOCK_HEAD = struct.Struct("=8xIII")  # block_status, num_pkts, offset_to_first_pkt
# struct tpacket3_hdr: tp_next_offset, tp_sec, tp_nsec, tp_snaplen, tp_len, tp_status, tp_mac, tp_net, ...
_FRAME_HEAD = struct.Struct("=I8xII4xH")  # tp_next_offset, tp_snaplen, tp_len, tp_mac
_TX_LEN_STATUS = struct.Struct("=III")  # tp_snaplen, tp_len, tp_status, at offset 12
_TX_STATUS_OFFSET = 20
TPACKET3_HDR_SIZE = 48
TX_DATA_OFFSET = TPACKET3_HDR_SIZE  # TPACKET3_HDRLEN - sizeof(struct sockaddr_ll), without PACKET_TX_HAS_OFF


class RingUnavailable(OSError):
    """The kernel (or its configuration) does not give this socket PACKET_MMAP rings."""


class PacketRing:
    """The receive and transmit rings of one bound AF_PACKET socket (which stays owned by the caller).

    ``receive(limit)`` returns the frames of every block handed over so far (at least one block, at most
    about ``limit`` frames) and gives those blocks back; ``send(frame)`` queues a frame; ``flush()`` hands
    the queued frames to the kernel with one syscall.
    """

    def __init__(self, sock: socket.socket, *, rx_block_size: int = RX_BLOCK_SIZE, rx_blocks: int = RX_BLOCKS,
                 tx_frames: int = TX_FRAMES, retire_ms: int = RETIRE_MS) -> None:
        self.sock = sock
        self.truncated = 0  # frames longer than a receive block could hold (dropped)
        self.tx_dropped = 0  # frames the kernel would not take on a flush (interface down, ...)
        self._rx_block_size, self._rx_blocks = rx_block_size, rx_blocks
        tx_per_block = TX_BLOCK_SIZE // TX_FRAME_SIZE
        tx_blocks = max(1, -(-tx_frames // tx_per_block))
        self._tx_frames = tx_blocks * tx_per_block
        try:
            sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            sock.setsockopt(SOL_PACKET, PACKET_LOSS, 1)
            rx_frame = 1 << 11
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, _REQ3.pack(
                rx_block_size, rx_blocks, rx_frame, rx_blocks * (rx_block_size // rx_frame), retire_ms, 0, 0))
            sock.setsockopt(SOL_PACKET, PACKET_TX_RING, _REQ3.pack(
                TX_BLOCK_SIZE, tx_blocks, TX_FRAME_SIZE, self._tx_frames, 0, 0, 0))
            self._rx_size = rx_block_size * rx_blocks
            self._mm = mmap.mmap(sock.fileno(), self._rx_size + tx_blocks * TX_BLOCK_SIZE, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise RingUnavailable(e.errno, f"PACKET_MMAP rings refused: {e.strerror or e}") from None
        self._rx_next = 0  # the next block to read
        self._tx_next = 0  # the next transmit slot
        self._queued = 0  # slots marked SEND_REQUEST since the last flush
        self._tx_max = TX_FRAME_SIZE - TX_DATA_OFFSET

    @property
    def mapped_bytes(self) -> int:
        return len(self._mm)

    # --- receive -------------------------------------------------------------------------------------------
    def receive(self, limit: int = 1024) -> list[bytes]:
        """Every frame of the blocks the kernel has handed over (in order), up to about ``limit`` frames."""
        mm, frames = self._mm, []
        unpack_block, unpack_frame = _BLOCK_HEAD.unpack_from, _FRAME_HEAD.unpack_from
        size, nblocks = self._rx_block_size, self._rx_blocks
        append = frames.append
        while len(frames) < limit:
            base = self._rx_next * size
            status, count, off = unpack_block(mm, base)
            if not status & TP_STATUS_USER:
                break
            off += base
            for _ in range(count):
                next_off, snaplen, length, mac = unpack_frame(mm, off)
                if snaplen == length:
                    append(mm[off + mac : off + mac + snaplen])
                else:
                    self.truncated += 1
                off += next_off
            _BLOCK_STATUS.pack_into(mm, base + _BLOCK_STATUS_OFFSET, TP_STATUS_KERNEL)
            self._rx_next = (self._rx_next + 1) % nblocks
        return frames

    # --- transmit ------------------------------------------------------------------------------------------
    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for the next flush (frames too big for a slot go out at once, after the queue)."""
        n = len(frame)
        if n > self._tx_max:
            self.flush()
            self.sock.send(frame)
            return
        mm = self._mm
        off = self._rx_size + self._tx_next * TX_FRAME_SIZE
        status = _BLOCK_STATUS.unpack_from(mm, off + _TX_STATUS_OFFSET)[0]
        if status != TP_STATUS_AVAILABLE and status != TP_STATUS_WRONG_FORMAT:
            self._wait()  # the ring is full: every slot queued or still leaving
            status = _BLOCK_STATUS.unpack_from(mm, off + _TX_STATUS_OFFSET)[0]
            if status != TP_STATUS_AVAILABLE and status != TP_STATUS_WRONG_FORMAT:
                raise OSError(errno.ENOBUFS, "transmit ring full")
        mm[off + TX_DATA_OFFSET : off + TX_DATA_OFFSET + n] = frame
        _TX_LEN_STATUS.pack_into(mm, off + 12, n, n, TP_STATUS_SEND_REQUEST)
        self._tx_next = (self._tx_next + 1) % self._tx_frames
        self._queued += 1

    def flush(self) -> None:
        """Hand every queued frame to the kernel (one send()); waits only if the socket buffer is full."""
        if not self._queued:
            return
        try:
            self.sock.send(b"", socket.MSG_DONTWAIT)
        except BlockingIOError:
            self._wait()
        except OSError:
            self._discard_queued()
            raise
        self._queued = 0

    def _wait(self) -> None:
        """A blocking flush: returns once the kernel has taken and sent every queued frame."""
        try:
            self.sock.send(b"")
        except OSError:
            self._discard_queued()
            raise
        self._queued = 0

    def _discard_queued(self) -> None:
        """After a failed flush (e.g. ENETDOWN), frames still queued are dropped, as a failed send() drops one."""
        mm, base = self._mm, self._rx_size
        for i in range(self._tx_frames):
            off = base + i * TX_FRAME_SIZE + _TX_STATUS_OFFSET
            if _BLOCK_STATUS.unpack_from(mm, off)[0] == TP_STATUS_SEND_REQUEST:
                _BLOCK_STATUS.pack_into(mm, off, TP_STATUS_AVAILABLE)
                self.tx_dropped += 1
        self._queued = 0

    def close(self) -> None:
        """Unmap the rings (the socket is closed by its owner)."""
        try:
            self._mm.close()
        except BufferError:  # a frame view still alive; the mapping goes with the process
            pass
