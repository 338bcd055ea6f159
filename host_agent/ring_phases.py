"""The stream's ring phases: a TCP ring of some of the job's workers all-reduces a run of chunks exactly.

``RingPhases`` is a part of ``host_agent.stream.ChunkStream`` (which it is mixed into): it uses the stream's
workers, listener, options, stats, rings and interrupt flags. Plain ring jobs, Rina's cross-rack ring and
the overflow guard live here; the ring itself is ``host_agent.ring``.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from host_agent.chunks import CHUNK_BYTES, LANES, Segment
from host_agent.errors import AgentError, Interrupted, JobReleased
from host_agent.ring import RingAllReduce, RingError, RingStep, TcpRingLink
from host_agent.ring_pieces import PIECE_BYTES, WHOLE_CHUNKS
from inaproto import wire

__all__ = ["RingPhases"]

_BOUND_SHIFT = 6  # ring overflow guard: each member adds ceil(max|x| / 64); see _ring_segment
_BOUND_LIMIT = 1 << (31 - _BOUND_SHIFT)
# Row blocks (docs/agent.md, "Ring"): before the ring's rate is known (a job's first ring phases without link
# emulation) a block gives each member a chunk of FIRST_BLOCK_PIECES pieces: a chunk much smaller than a hop's
# bandwidth-delay product makes every step wait for its piece (latency-bound: at 10 Mbit/s and 8 members 32 KiB
# blocks took 3x one op). 64 KiB for 4 members (1.7 s at 0.5 Mbit/s, 0.4 s at 2), 128 KiB for 8.
FIRST_BLOCK_PIECES = 4
_RATE_CAP = (1 << 31) // 128 - 1  # bytes/s a member reports for the ring's rate: a sum over up to 128 fits int32


class _PacedLink:
    """A ring link whose every op lasts at least its bytes on the wire over ``bps`` (link emulation).

    Steps are pipelined, so each op (not each step) is paced: its steps' larger side each, plus a header.
    Several ops in one stream (row blocks) are paced one after the other, each reported ``done`` only once
    its paced time is over (on loopback the real transfer is far quicker than the emulated link); an abort
    during that time fails the op, as it would on the emulated link (before session 9 the wait ran out first)."""

    FRAMING = 1514 / 1448  # Ethernet + IPv4 + TCP (timestamps) headers per full segment

    def __init__(self, link: TcpRingLink, bps: float) -> None:
        self.link, self.bps = link, bps
        self.rank, self.size = link.rank, link.size
        self._aborted = threading.Event()  # an abort ends the paced wait too: the op in flight is lost, as on a link

    def run(self, steps: Sequence[RingStep]) -> None:
        ops: list[list[RingStep]] = []
        for step in steps:
            if step.new_op or not ops:
                ops.append([])
            ops[-1].append(step)
        for op in ops:
            start = time.monotonic()
            done = op[-1].done
            self.link.run([replace(op[0], new_op=False), *op[1:-1], replace(op[-1], done=None)] if len(op) > 1
                          else [replace(op[0], new_op=False, done=None)])
            nbytes = sum(max(s.send.nbytes, s.recv.nbytes) + 40 for s in op)
            left = start + nbytes * self.FRAMING * 8 / self.bps - time.monotonic()
            if left > 0 and self._aborted.wait(left) or self._aborted.is_set():
                raise RingError(f"rank {self.rank}: ring op aborted")
            if done is not None:
                done()

    def abort(self) -> None:
        self._aborted.set()
        self.link.abort()

    def close(self) -> None:
        self.link.close()


class RingPhases:
    """Ring set-up, failure handling and the exact ring all-reduce of a segment (mixed into ChunkStream)."""

    _ring_op: tuple[float, float | None, int, bool, int] | None = None  # in flight: start, expected s, members, Rina, blocks

    def ring_op_worth_finishing(self) -> bool:
        """Whether a move from the ring to INA should let the plain ring op in flight finish rather than abort it.

        An abort throws the op's work so far away (``ring_lost`` in ``stats.pauses``: 1.2 s per move in experiment
        3 at 0.5 Mbit/s, one op per call) and INA redoes it; finishing costs the op's rest at the ring's speed instead
        of INA's. INA moves ``frame / payload`` bytes per byte reduced, the ring ``2(n-1)/n``: it is worth finishing
        once its elapsed share is at least ``1 - 1/speed-up`` of its expected time (4 members: 4 %; always when INA
        is not faster, or when the op's time cannot be estimated yet). False with no plain ring op in flight, and for
        an op in row blocks (``--ring-block-seconds``/``--ring-block-bytes``): an abort then loses only the block in
        flight, while finishing would cost the rest of the segment at the ring's speed."""
        op = self._ring_op
        if op is None or op[3] or op[4] > 1:
            return False
        start, expected, n, _, _ = op
        speedup = (2 * (n - 1) / n if n > 1 else 1.0) * wire.INA_DATA_LEN / wire.INA_FRAME_LEN
        if expected is None or speedup <= 1.0:
            return True
        return time.monotonic() - start >= expected * (1.0 - 1.0 / speedup)

    def _ring(self, members: tuple[int, ...]) -> RingAllReduce:
        ring = self._rings.get(members)
        if ring is not None:
            return ring
        rank = members.index(self.worker_id)
        peers = [self.workers[w].address for w in members]
        failed: BaseException | None = None
        self._rings_building = True  # before the check: a notify after it shuts the listener down
        try:
            self._check_interrupt()
            link = TcpRingLink(rank, peers, self._listener.dup(), timeout=self.options.op_timeout,
                               connect_timeout=self.options.connect_timeout,
                               piece_bytes=self.options.ring_piece_bytes or WHOLE_CHUNKS)
            ring = RingAllReduce.over(_PacedLink(link, self.options.link_bps) if self.options.link_bps else link)
        except (RingError, OSError) as exc:
            failed = exc
        finally:
            self._rings_building = False
        if failed is not None:
            self._renew_listener()
            self._ring_failed(failed)
        if self._pending:  # the listener may have been shut down while connecting
            ring.close()
            self._renew_listener()
            raise Interrupted()
        self._rings[members] = ring
        return ring

    def _renew_listener(self) -> None:
        """A listener shut down to interrupt a ring set-up is replaced by a fresh one on the same address."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(self._listen_addr)
            probe.listen()
        except OSError:
            probe.close()
            return  # the old listener still holds the address: it was not shut down
        self._listener.close()
        self._listener = probe

    def _ring_failed(self, exc: BaseException):
        deadline = time.monotonic() + self.options.ring_grace
        while time.monotonic() < deadline:
            if self._pending:
                raise Interrupted() from exc
            if self._released:
                raise JobReleased("the controller released the job") from exc
            time.sleep(0.005)
        raise AgentError(f"worker {self.worker_id}: ring all-reduce failed: {exc}") from exc

    def _ring_block_rows(self, n: int) -> int:
        """Rows (chunks) per ring op: ``ring_block_bytes``, else ``ring_block_seconds`` of wire time at the ring's
        rate (the emulated link's, else the rate the members agreed on in this generation's last block), else
        ``FIRST_BLOCK_PIECES`` pieces per member; 0 seconds: one op for the rest of the segment. Every member
        computes the same (the options are the job's)."""
        opts = self.options
        if opts.ring_block_bytes:
            nbytes = float(opts.ring_block_bytes)
        elif not opts.ring_block_seconds:
            return 1 << 62
        else:
            rate = opts.link_bps / 8 / _PacedLink.FRAMING if opts.link_bps else self._ring_rate
            per_link = 2 * (n - 1) / n if n > 1 else 1.0  # a link carries this share of an op's bytes
            nbytes = (rate * opts.ring_block_seconds / per_link if rate > 0
                      else n * FIRST_BLOCK_PIECES * (opts.ring_piece_bytes or PIECE_BYTES))
        return max(1, int(nbytes // CHUNK_BYTES))

    def _ring_segment(self, seg: Segment, i0: int, members: tuple[int, ...], data: np.ndarray,
                      chunk_flags: np.ndarray | None, *, rina: bool) -> None:
        """All-reduce ``data`` (this member's int32 rows for seg[i0:]) over the ring of ``members``, in row blocks.

        Each block is one ring op; the blocks run back to back in one pipelined stream, and each block's
        results go into ``seg`` as soon as they are in, so an abort (a generation change) loses only the
        block in flight. The ring adds int32. Each member appends ceil(max|x| / 64) of its block; if those
        add up to 2**25 or more an int32 sum might have wrapped, and every member (seeing the same total)
        redoes that block in int64. Rina ops also carry per-chunk overflow counts of the racks' partial
        sums. Each block also carries the member's measured ring rate; their sum sizes the next phase's
        blocks (``_ring_block_rows``), the same on every member. Results are exact.
        """
        self._check_interrupt()
        ring = self._ring(members)
        K = data.shape[0]
        n = len(members)
        rows = self._ring_block_rows(n)
        my_rate = min(int(self._ring_rate_mine), _RATE_CAP)
        payloads, spans = [], []
        for lo in range(0, K, rows) if K else (0,):
            hi = min(lo + rows, K)
            block = data[lo:hi].reshape(-1)
            payload = np.empty(block.size + (hi - lo if rina else 0) + 2, dtype=np.int32)
            payload[: block.size] = block
            if rina:
                payload[block.size : block.size + hi - lo] = chunk_flags[lo:hi]
            peak = max(int(block.max()), -int(block.min())) if block.size else 0
            payload[-2] = my_rate
            payload[-1] = -(-peak >> _BOUND_SHIFT) if peak else 0
            payloads.append(payload)
            spans.append((lo, hi))
        redo: list[tuple[int, np.ndarray]] = []
        last = [time.monotonic()]  # when the last block's results went in (what an abort loses is after it)
        start = last[0]
        per_link = 2 * (n - 1) / n if n > 1 else 1.0
        self._ring_op = (start, K * CHUNK_BYTES * per_link / self._ring_rate_mine if self._ring_rate_mine > 0 else None,
                         n, rina, len(payloads))

        def put(b: int, out: np.ndarray, sums: np.ndarray) -> None:
            lo, hi = spans[b]
            sums = sums.reshape(hi - lo, LANES)
            flags = None
            if rina:
                flags = (out[sums.size : sums.size + hi - lo] > 0) | ((sums > 2**31 - 1) | (sums < -(2**31))).any(axis=1)
            seg.put_ring(i0 + lo, sums, flags)

        def done(b: int, out: np.ndarray) -> None:
            self.stats.ring_ops += 1
            self._ring_rate = int(out[-2]) / n  # the same sum on every member: the mean of their measured rates
            if int(out[-1]) >= _BOUND_LIMIT:
                redo.append((b, out))  # the chunks redone in int64 after the stream (the flags are exact)
            else:
                put(b, out, out[: (spans[b][1] - spans[b][0]) * LANES])
            last[0] = time.monotonic()

        try:
            ring.allreduce_blocks(payloads, done)
            for b, out in redo:
                lo, hi = spans[b]
                sums = ring.allreduce(data[lo:hi].reshape(-1).astype(np.int64))
                self.stats.ring_redo_int64 += 1
                self.stats.ring_ops += 1
                put(b, out, sums)
                last[0] = time.monotonic()
        except RingError as exc:
            self._ring_lost = time.monotonic() - last[0]  # the block in flight's work is lost (stats.pauses)
            self._ring_failed(exc)
        finally:
            self._ring_op = None
        elapsed = time.monotonic() - start
        if elapsed > 0 and K:
            self._ring_rate_mine = K * CHUNK_BYTES * (2 * (n - 1) / n if n > 1 else 1.0) / elapsed
