"""The switch benchmark's workers' I/O: Linux PACKET_MMAP rings (TPACKET_V2) on one AF_PACKET socket.

A worker of bench/switch_bench.py keeps a window of chunks in flight at a rate a per-frame Python sender cannot
offer (7-11 us of CPU per frame): both rings are arrays of fixed-size frame slots (``FRAME_SIZE`` bytes, a
``tpacket2_hdr`` at the start of each; Documentation/networking/packet_mmap.rst) seen as 2-D numpy arrays, so
every result ready is read with one strided copy and the next chunks are written as rows with one copy and
handed to the kernel with one ``send()``. TPACKET_V2 signals each frame as it lands (V3 holds a block until it
is full or its timer fires). Anything the kernel refuses while setting up raises ``RingUnavailable``.
"""
from __future__ import annotations

import errno
import mmap
import socket
import struct

import numpy as np

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_VERSION = 10
PACKET_TX_RING = 13
PACKET_LOSS = 14  # a malformed transmit slot is skipped instead of stopping the flush
TPACKET_V2 = 1

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_AVAILABLE = 0
TP_STATUS_SEND_REQUEST = 1
TP_STATUS_SENDING = 2
TP_STATUS_WRONG_FORMAT = 4

FRAME_SIZE = 1 << 11  # one slot per frame, both rings
BLOCK_SIZE = 1 << 16  # the kernel allocates the rings in blocks of this size (32 slots each)
RX_FRAMES = 4096  # 8 MiB: what arrives while the switch works on a batch
TX_FRAMES = 1024
# struct tpacket2_hdr: tp_status, tp_len, tp_snaplen (u32), tp_mac, tp_net (u16), tp_sec, tp_nsec, vlan, padding
HDR_WORDS = 8  # 32 bytes as u32 words: [0] status, [1] len, [2] snaplen, [3] mac | net << 16
TX_DATA_OFFSET = 32  # TPACKET2_HDRLEN - sizeof(struct sockaddr_ll), without PACKET_TX_HAS_OFF
_REQ = struct.Struct("=4I")  # struct tpacket_req: block_size, block_nr, frame_size, frame_nr
_W_STATUS, _W_LEN, _W_SNAPLEN, _W_MAC = 0, 1, 2, 3
_RX_HEAD = struct.Struct("=IIIH")  # tp_status, tp_len, tp_snaplen, tp_mac
_U32 = struct.Struct("=I")
_TX_LEN = struct.Struct("=II")  # tp_len, tp_snaplen
SMALL_BATCH = 8  # fewer ready frames than this are read with struct, one at a time (numpy's fixed cost is larger)


class RingUnavailable(OSError):
    """The kernel (or its configuration) does not give this socket PACKET_MMAP rings."""


def _slots(start: int, count: int, total: int) -> list[slice]:
    """Consecutive ring slots from ``start`` as at most two slices (the ring wraps)."""
    end = start + count
    if end <= total:
        return [slice(start, end)]
    return [slice(start, total), slice(0, end - total)]


class PacketRing:
    """The receive and transmit rings of one bound AF_PACKET socket (which stays owned by the caller).

    ``receive_batch(limit)`` returns the frames ready so far (at most ``limit``) as one 2-D uint8 array when
    they all have one length (the common case), else as a list of bytes, and gives their slots back;
    ``send(frame)`` and ``send_rows(rows)`` queue frames; ``flush()`` hands them to the kernel in one syscall.
    """

    def __init__(self, sock: socket.socket, *, rx_frames: int = RX_FRAMES, tx_frames: int = TX_FRAMES) -> None:
        self.sock = sock
        self.truncated = 0  # frames longer than a slot could hold (dropped)
        self.tx_dropped = 0  # frames the kernel would not take on a flush (interface down, ...)
        per_block = BLOCK_SIZE // FRAME_SIZE
        rx_blocks, tx_blocks = max(1, -(-rx_frames // per_block)), max(1, -(-tx_frames // per_block))
        self._rx_frames, self._tx_frames = rx_blocks * per_block, tx_blocks * per_block
        try:
            sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
            sock.setsockopt(SOL_PACKET, PACKET_LOSS, 1)
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, _REQ.pack(BLOCK_SIZE, rx_blocks, FRAME_SIZE, self._rx_frames))
            sock.setsockopt(SOL_PACKET, PACKET_TX_RING, _REQ.pack(BLOCK_SIZE, tx_blocks, FRAME_SIZE, self._tx_frames))
            self._mm = mmap.mmap(sock.fileno(), (self._rx_frames + self._tx_frames) * FRAME_SIZE, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise RingUnavailable(e.errno, f"PACKET_MMAP rings refused: {e.strerror or e}") from None
        whole = np.frombuffer(self._mm, np.uint8).reshape(-1, FRAME_SIZE)
        self._rx, self._tx = whole[: self._rx_frames], whole[self._rx_frames :]
        words = whole.view(np.uint32)
        self._rx_words, self._tx_words = words[: self._rx_frames], words[self._rx_frames :]
        self._rx_next = 0  # the next receive slot
        self._tx_next = 0  # the next transmit slot
        self._queued = 0  # slots marked SEND_REQUEST since the last flush
        self._tx_max = FRAME_SIZE - TX_DATA_OFFSET

    # --- receive -------------------------------------------------------------------------------------------
    def receive_batch(self, limit: int = 1024) -> np.ndarray | list[bytes]:
        """The frames handed over so far, in order, at most ``limit``: an (n, length) uint8 array (a copy)
        when they share one length and data offset, else a list of bytes. Their slots go back to the kernel."""
        start, total = self._rx_next, self._rx_frames
        count = min(limit, total)
        # A few frames (low rates: latency matters) one at a time with struct, no numpy's fixed cost.
        mm, head, few = self._mm, _RX_HEAD.unpack_from, []
        for k in range(min(SMALL_BATCH, count)):
            off = ((start + k) % total) * FRAME_SIZE
            status, length, snaplen, mac = head(mm, off)
            if not status & TP_STATUS_USER:
                break
            few.append((off, length, snaplen, mac))
        else:
            few = None  # a busy ring: the whole ready run with numpy
        if few is not None:
            frames = []
            for off, length, snaplen, mac in few:
                if snaplen == length:
                    frames.append(mm[off + mac : off + mac + length])
                else:
                    self.truncated += 1
                _U32.pack_into(mm, off, TP_STATUS_KERNEL)
            self._rx_next = (start + len(few)) % total
            return frames
        parts = _slots(start, count, total)
        status = self._rx_words[parts[0], _W_STATUS] if len(parts) == 1 else np.concatenate(
            [self._rx_words[p, _W_STATUS] for p in parts])
        idle = np.flatnonzero(status & TP_STATUS_USER == 0)
        n = int(idle[0]) if len(idle) else count
        parts = _slots(start, n, total)
        heads = [self._rx_words[p, _W_LEN:_W_MAC + 1] for p in parts]
        length, snaplen, mac = (int(v) for v in heads[0][0])
        mac &= 0xFFFF
        if snaplen == length and all((h == heads[0][0]).all() for h in heads) and mac + length <= FRAME_SIZE:
            rows = [self._rx[p, mac : mac + length] for p in parts]
            frames: np.ndarray | list[bytes] = np.ascontiguousarray(rows[0]) if len(rows) == 1 else np.concatenate(rows)
        else:
            frames = self._receive_each(parts)
        for p in parts:
            self._rx_words[p, _W_STATUS] = TP_STATUS_KERNEL
        self._rx_next = (start + n) % total
        return frames

    def _receive_each(self, parts: list[slice]) -> list[bytes]:
        """Frames of different lengths, one at a time (truncated ones are counted and dropped)."""
        frames = []
        for p in parts:
            for i in range(p.start, p.stop):
                length, snaplen, mac = (int(v) for v in self._rx_words[i, _W_LEN:_W_MAC + 1])
                mac &= 0xFFFF
                if snaplen == length:
                    frames.append(self._rx[i, mac : mac + length].tobytes())
                else:
                    self.truncated += 1
        return frames

    # --- transmit ------------------------------------------------------------------------------------------
    def _take_slots(self, count: int) -> list[slice] | None:
        """The next ``count`` transmit slots if they are all free (after waiting once for a full ring)."""
        parts = _slots(self._tx_next, count, self._tx_frames)
        for attempt in (0, 1):
            if all(not (self._tx_words[p, _W_STATUS] & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING)).any() for p in parts):
                return parts
            if attempt == 0:
                self._wait()  # the ring is full: every slot queued or still leaving
        return None

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for the next flush (frames too big for a slot go out at once, after the queue)."""
        n = len(frame)
        if n > self._tx_max:
            self.flush()
            self.sock.send(frame)
            return
        i = self._tx_next
        mm, off = self._mm, (self._rx_frames + i) * FRAME_SIZE
        if _U32.unpack_from(mm, off)[0] & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING):
            self._wait()  # the ring is full: every slot queued or still leaving
            if _U32.unpack_from(mm, off)[0] & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING):
                raise OSError(errno.ENOBUFS, "transmit ring full")
        mm[off + TX_DATA_OFFSET : off + TX_DATA_OFFSET + n] = frame
        _TX_LEN.pack_into(mm, off + 4, n, n)
        _U32.pack_into(mm, off, TP_STATUS_SEND_REQUEST)  # after the data: the kernel reads on flush
        self._tx_next = (i + 1) % self._tx_frames
        self._queued += 1

    def send_rows(self, rows: np.ndarray) -> None:
        """Queue every row of an (n, length) uint8 array, in order: one copy and one store per run of slots."""
        n, length = rows.shape
        if n == 0:
            return
        if length > self._tx_max or n > self._tx_frames:
            for row in rows:
                self.send(row.tobytes())
            return
        parts = self._take_slots(n)
        if parts is None:
            raise OSError(errno.ENOBUFS, "transmit ring full")
        done = 0
        for p in parts:
            k = p.stop - p.start
            self._tx[p, TX_DATA_OFFSET : TX_DATA_OFFSET + length] = rows[done : done + k]
            self._tx_words[p, _W_LEN:_W_SNAPLEN + 1] = length
            self._tx_words[p, _W_STATUS] = TP_STATUS_SEND_REQUEST  # after the data: the kernel reads on flush
            done += k
        self._tx_next = (self._tx_next + n) % self._tx_frames
        self._queued += n

    def flush(self) -> None:
        """Hand every queued frame to the kernel (one send()); waits only if the socket buffer is full."""
        if not self._queued:
            return
        try:
            self.sock.send(b"", socket.MSG_DONTWAIT)
        except BlockingIOError:
            self._wait()
        except OSError:
            self._drop_unsent()
            raise
        self._queued = 0

    def _wait(self) -> None:
        """A blocking flush: returns once the kernel has taken and sent every queued frame."""
        try:
            self.sock.send(b"")
        except OSError:
            self._drop_unsent()
            raise
        self._queued = 0

    def _drop_unsent(self) -> None:
        """After a failed flush (a full qdisc: ENOBUFS; an interface down: ENETDOWN), drop what the kernel did
        not send, as a failed send() drops its frame, and keep the ring in step with the kernel.

        The kernel takes slots in order and stops at the first it could not send, leaving it SEND_REQUEST
        (a retry for the next flush) with its own head there; it resumes only from that slot. So the unsent
        run is marked AVAILABLE and the next frame goes into that very slot: marked without moving back, the
        kernel's head would stay on a slot nobody fills until the ring wraps, and every frame queued meanwhile
        would wait a whole ring's worth of frames (stalls and resends on shaped links whose queues overflow)."""
        total, queued = self._tx_frames, self._queued
        self._queued = 0
        if not queued:
            return
        start = (self._tx_next - queued) % total
        parts = _slots(start, queued, total)
        status = self._tx_words[parts[0], _W_STATUS] if len(parts) == 1 else np.concatenate(
            [self._tx_words[p, _W_STATUS] for p in parts])
        unsent = np.flatnonzero(status == TP_STATUS_SEND_REQUEST)
        if not len(unsent):
            return
        head = int(unsent[0])  # every slot from the kernel's head on is unsent
        for p in _slots((start + head) % total, queued - head, total):
            self._tx_words[p, _W_STATUS] = TP_STATUS_AVAILABLE
        self.tx_dropped += queued - head
        self._tx_next = (start + head) % total

    def close(self) -> None:
        """Unmap the rings (the socket is closed by its owner)."""
        del self._rx, self._tx, self._rx_words, self._tx_words
        try:
            self._mm.close()
        except BufferError:  # a frame view still alive; the mapping goes with the process
            pass
