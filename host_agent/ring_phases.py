"""The stream's ring phase: a TCP ring of the job's workers all-reduces the rest of a segment of chunks, exactly.

``RingPhase`` keeps this worker's rings (one per member set, built on first use from duplicates of the worker's
listener) and reduces a segment's rows over one of them (``reduce``). ``abort`` (any thread) stops the op in flight
and a ring being connected: a generation change must not wait for them. The ring itself is ``host_agent.ring``.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from host_agent.chunks import CHUNK_BYTES, LANES, Segment
from host_agent.errors import AgentError
from host_agent.options import StreamOptions
from host_agent.ring import RingAllReduce, RingError, RingStep, TcpRingLink
from host_agent.ring_pieces import PIECE_BYTES
from host_agent.stats import StreamStats
from inaproto import wire

__all__ = ["RingPhase"]

BOUND_SHIFT = 6  # ring overflow guard: each member adds ceil(max|x| / 64); see RingPhase.reduce
BOUND_LIMIT = 1 << (31 - BOUND_SHIFT)
# Row blocks (docs/agent.md, "Ring"): before the ring's rate is known (a job's first ring phases without link
# emulation) a block gives each member a chunk of FIRST_BLOCK_PIECES pieces: a chunk much smaller than a hop's
# bandwidth-delay product makes every step wait for its piece. 64 KiB for 4 members, 128 KiB for 8.
FIRST_BLOCK_PIECES = 4
RATE_CAP = (1 << 31) // 128 - 1  # bytes/s a member reports for the ring's rate: a sum over up to 128 fits int32
FRAMING = 1514 / 1448  # Ethernet + IPv4 + TCP (timestamps) headers per full segment


class PacedLink:
    """A ring link whose every op lasts at least its bytes on the wire over ``bps`` (link emulation).

    Steps are pipelined, so each op (not each step) is paced: its steps' larger side each, plus a header.
    Several ops in one stream (row blocks) are paced one after the other, each reported ``done`` only once
    its paced time is over (on loopback the real transfer is far quicker than the emulated link); an abort
    during that time fails the op, as it would on the emulated link."""

    def __init__(self, link: TcpRingLink, bps: float) -> None:
        self.link, self.bps = link, bps
        self.rank, self.size = link.rank, link.size
        self.aborted = threading.Event()  # an abort ends the paced wait too: the op in flight is lost, as on a link

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
            left = start + nbytes * FRAMING * 8 / self.bps - time.monotonic()
            if left > 0 and self.aborted.wait(left) or self.aborted.is_set():
                raise RingError(f"rank {self.rank}: ring op aborted")
            if done is not None:
                done()

    def abort(self) -> None:
        self.aborted.set()
        self.link.abort()

    def close(self) -> None:
        self.link.close()


@dataclass(frozen=True)
class RingOp:
    """The ring op in flight: when it started, how long it should take (None: unknown yet), its members, its blocks."""

    start: float
    expected: float | None
    members: int
    blocks: int


class RingPhase:
    """This worker's rings and the exact ring all-reduce of a segment's rows.

    Args:
        worker_id: this worker.
        addresses: every worker's ring address (its INA address, over TCP).
        listener: a bound, listening TCP socket on this worker's ring address (owned from here on; renewed
            after an abort shut it down).
        options: the stream's options (timeouts, emulated link, row blocks).
        stats: the stream's counters.
    """

    def __init__(self, worker_id: int, addresses: Mapping[int, tuple[str, int]], listener: socket.socket,
                 options: StreamOptions, stats: StreamStats) -> None:
        self.worker_id, self.addresses, self.options, self.stats = worker_id, dict(addresses), options, stats
        self.listener = listener
        self.listen_addr = listener.getsockname()[:2]
        self.rings: dict[tuple[int, ...], RingAllReduce] = {}
        self.building = False  # a ring is being connected: an abort shuts the listener down to interrupt it
        self.op: RingOp | None = None
        self.lost = 0.0  # seconds of the last aborted op's work (StreamStats.pauses)
        self.rate = 0.0  # the ring's rate the members agreed on in this generation (row blocks' sizes)
        self.rate_mine = 0.0  # this member's measured ring rate, bytes/s per link (what it reports)

    # ------------------------------------------------------------------ control (any thread)

    def abort(self) -> None:
        """Stop the op in flight (its neighbours' fail too) and a ring being connected."""
        for ring in list(self.rings.values()):
            ring.link.abort()
        if self.building:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def worth_finishing(self) -> bool:
        """Whether a move from the ring to INA should let the op in flight finish rather than abort it.

        An abort throws the op's work so far away and INA redoes it; finishing costs the op's rest at the ring's
        speed instead of INA's. INA moves ``frame / payload`` bytes per byte reduced, the ring ``2(n-1)/n``: it is
        worth finishing once its elapsed share is at least ``1 - 1/speed-up`` of its expected time (4 members: 4 %;
        always when INA is not faster, or when the op's time cannot be estimated yet). False with no op in flight,
        and for an op in row blocks: an abort then loses only the block in flight."""
        op = self.op
        if op is None or op.blocks > 1:
            return False
        n = op.members
        speedup = (2 * (n - 1) / n if n > 1 else 1.0) * wire.INA_DATA_LEN / wire.INA_FRAME_LEN
        if op.expected is None or speedup <= 1.0:
            return True
        return time.monotonic() - op.start >= op.expected * (1.0 - 1.0 / speedup)

    # ------------------------------------------------------------------ generations

    def new_generation(self) -> None:
        """Close the rings: a new generation rebuilds them."""
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()
        self.rate = 0.0  # agreed anew in each generation: some members may have seen a block others lost

    def close(self) -> None:
        self.new_generation()
        self.listener.close()

    # ------------------------------------------------------------------ the ring

    def ring(self, members: tuple[int, ...], check: Callable[[], None]) -> RingAllReduce:
        """The ring of ``members`` (connected on first use)."""
        ring = self.rings.get(members)
        if ring is not None:
            return ring
        rank = members.index(self.worker_id)
        peers = [self.addresses[w] for w in members]
        failed: BaseException | None = None
        self.building = True  # before the check: an abort after it shuts the listener down
        try:
            check()
            link = TcpRingLink(rank, peers, self.listener.dup(), timeout=self.options.op_timeout,
                               connect_timeout=self.options.connect_timeout)
            ring = RingAllReduce.over(PacedLink(link, self.options.link_bps) if self.options.link_bps else link)
        except (RingError, OSError) as exc:
            failed = exc
        finally:
            self.building = False
        if failed is not None:
            self.renew_listener()
            self.failed(failed, check)
        try:
            check()  # the listener may have been shut down while connecting
        except BaseException:
            ring.close()
            self.renew_listener()
            raise
        self.rings[members] = ring
        return ring

    def renew_listener(self) -> None:
        """A listener shut down to interrupt a ring set-up is replaced by a fresh one on the same address."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(self.listen_addr)
            probe.listen()
        except OSError:
            probe.close()
            return  # the old listener still holds the address: it was not shut down
        self.listener.close()
        self.listener = probe

    def failed(self, exc: BaseException, check: Callable[[], None]):
        """A ring failed: wait ``ring_grace`` for the generation change (or release) that explains it."""
        deadline = time.monotonic() + self.options.ring_grace
        while time.monotonic() < deadline:
            check()
            time.sleep(0.005)
        raise AgentError(f"worker {self.worker_id}: ring all-reduce failed: {exc}") from exc

    def block_rows(self, n: int) -> int:
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
            rate = opts.link_bps / 8 / FRAMING if opts.link_bps else self.rate
            per_link = 2 * (n - 1) / n if n > 1 else 1.0  # a link carries this share of an op's bytes
            nbytes = (rate * opts.ring_block_seconds / per_link if rate > 0 else n * FIRST_BLOCK_PIECES * PIECE_BYTES)
        return max(1, int(nbytes // CHUNK_BYTES))

    def reduce(self, seg: Segment, i0: int, members: tuple[int, ...], check: Callable[[], None]) -> None:
        """All-reduce this member's rows of ``seg[i0:]`` over the ring of ``members``, in row blocks; the sums go
        into ``seg``.

        Each block is one ring op; the blocks run back to back in one pipelined stream, and each block's
        results go into ``seg`` as soon as they are in, so an abort (a generation change) loses only the
        block in flight. The ring adds int32. Each member appends ceil(max|x| / 64) of its block; if those
        add up to 2**25 or more an int32 sum might have wrapped, and every member (seeing the same total)
        redoes that block in int64. Each block also carries the member's measured ring rate; their sum sizes
        the next phase's blocks (``block_rows``), the same on every member. Results are exact.
        """
        check()
        ring = self.ring(members, check)
        data = seg.contrib[i0:]
        K, n = data.shape[0], len(members)
        rows = self.block_rows(n)
        my_rate = min(int(self.rate_mine), RATE_CAP)
        payloads, spans = [], []
        for lo in range(0, K, rows) if K else (0,):
            hi = min(lo + rows, K)
            block = data[lo:hi].reshape(-1)
            payload = np.empty(block.size + 2, dtype=np.int32)
            payload[: block.size] = block
            peak = max(int(block.max()), -int(block.min())) if block.size else 0
            payload[-2] = my_rate
            payload[-1] = -(-peak >> BOUND_SHIFT) if peak else 0
            payloads.append(payload)
            spans.append((lo, hi))
        redo: list[tuple[int, np.ndarray]] = []
        last = [time.monotonic()]  # when the last block's results went in (what an abort loses is after it)
        start = last[0]
        per_link = 2 * (n - 1) / n if n > 1 else 1.0
        self.op = RingOp(start, K * CHUNK_BYTES * per_link / self.rate_mine if self.rate_mine > 0 else None, n,
                         len(payloads))

        def done(b: int, out: np.ndarray) -> None:
            self.stats.ring_ops += 1
            self.rate = int(out[-2]) / n  # the same sum on every member: the mean of their measured rates
            lo, hi = spans[b]
            if int(out[-1]) >= BOUND_LIMIT:
                redo.append((b, out))  # the chunks redone in int64 after the stream
            else:
                seg.put_ring(i0 + lo, out[: (hi - lo) * LANES].reshape(hi - lo, LANES))
            last[0] = time.monotonic()

        try:
            ring.allreduce_blocks(payloads, done)
            for b, _out in redo:
                lo, hi = spans[b]
                sums = ring.allreduce(data[lo:hi].reshape(-1).astype(np.int64))
                self.stats.ring_redo_int64 += 1
                self.stats.ring_ops += 1
                seg.put_ring(i0 + lo, sums.reshape(hi - lo, LANES))
                last[0] = time.monotonic()
        except RingError as exc:
            self.lost = time.monotonic() - last[0]  # the block in flight's work is lost (stats.pauses)
            self.failed(exc, check)
        finally:
            self.op = None
        elapsed = time.monotonic() - start
        if elapsed > 0 and K:
            self.rate_mine = K * CHUNK_BYTES * per_link / elapsed
