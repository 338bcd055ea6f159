"""The stream's ring phase: a TCP ring of the job's workers all-reduces the rest of a segment of chunks, exactly.

``RingPhase`` keeps this worker's rings (one per member set, built on first use; their connections from the left
come through the ring's inbox of the worker's acceptor, ``host_agent.acceptor``) and reduces a segment's rows over
one of them (``reduce``). ``abort`` (any thread) stops the op in flight and a ring being connected: a generation
change must not wait for them. The ring itself is ``host_agent.ring``.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from host_agent.acceptor import Inbox
from host_agent.chunks import CHUNK_BYTES, LANES, Segment
from host_agent.errors import AgentError
from host_agent.options import StreamOptions
from host_agent.ring import RingAllReduce, RingError, RingStep, TcpRingLink
from host_agent.stats import StreamStats
from inaproto import wire

__all__ = ["RingPhase"]

BOUND_SHIFT = 6  # ring overflow guard: each member adds ceil(max|x| / 64); see RingPhase.reduce
BOUND_LIMIT = 1 << (31 - BOUND_SHIFT)
FRAMING = 1514 / 1448  # Ethernet + IPv4 + TCP (timestamps) headers per full segment


class PacedLink:
    """A ring link whose every op lasts at least its bytes on the wire over ``bps`` (link emulation).

    Steps are pipelined, so the op (not each step) is paced: its steps' larger side each, plus a header. On
    loopback the real transfer is far quicker than the emulated link, so the op waits out its paced time; an
    abort during that time fails the op, as it would on the emulated link."""

    def __init__(self, link: TcpRingLink, bps: float) -> None:
        self.link, self.bps = link, bps
        self.rank, self.size = link.rank, link.size
        self.aborted = threading.Event()  # an abort ends the paced wait too: the op in flight is lost, as on a link

    def run(self, steps: Sequence[RingStep]) -> None:
        start = time.monotonic()
        self.link.run(steps)
        nbytes = sum(max(s.send.nbytes, s.recv.nbytes) + 40 for s in steps)
        left = start + nbytes * FRAMING * 8 / self.bps - time.monotonic()
        if left > 0 and self.aborted.wait(left) or self.aborted.is_set():
            raise RingError(f"rank {self.rank}: ring op aborted")

    def abort(self) -> None:
        self.aborted.set()
        self.link.abort()

    def close(self) -> None:
        self.link.close()


@dataclass(frozen=True)
class RingOp:
    """The ring op in flight: when it started, how long it should take (None: unknown yet), its members."""

    start: float
    expected: float | None
    members: int


class RingPhase:
    """This worker's rings and the exact ring all-reduce of a segment's rows.

    Args:
        worker_id: this worker.
        addresses: every worker's ring address (its INA address, over TCP).
        inbox: the ring connections of this worker's acceptor (``Acceptor.inbox(ring.HELLO_MAGIC)``).
        options: the stream's options (timeouts, emulated link).
        stats: the stream's counters.
    """

    def __init__(self, worker_id: int, addresses: Mapping[int, tuple[str, int]], inbox: Inbox,
                 options: StreamOptions, stats: StreamStats) -> None:
        self.worker_id, self.addresses, self.options, self.stats = worker_id, dict(addresses), options, stats
        self.inbox = inbox
        self.rings: dict[tuple[int, ...], RingAllReduce] = {}
        self.building = False  # a ring is being connected: an abort interrupts its accept
        self.op: RingOp | None = None
        self.lost = 0.0  # seconds of the last aborted op's work (StreamStats.pauses)
        self.rate = 0.0  # this member's measured ring rate, bytes/s per link (an op's expected time)

    # ------------------------------------------------------------------ control (any thread)

    def abort(self) -> None:
        """Stop the op in flight (its neighbours' fail too) and a ring being connected."""
        for ring in list(self.rings.values()):
            ring.link.abort()
        if self.building:
            self.inbox.interrupt()

    def worth_finishing(self) -> bool:
        """Whether a move from the ring to INA should let the op in flight finish rather than abort it.

        An abort throws the op's work so far away and INA redoes it; finishing costs the op's rest at the ring's
        speed instead of INA's. INA moves ``frame / payload`` bytes per byte reduced, the ring ``2(n-1)/n``: it is
        worth finishing once its elapsed share is at least ``1 - 1/speed-up`` of its expected time (4 members: 4 %;
        always when INA is not faster, or when the op's time cannot be estimated yet). False with no op in flight."""
        op = self.op
        if op is None:
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

    def close(self) -> None:
        self.new_generation()

    # ------------------------------------------------------------------ the ring

    def ring(self, members: tuple[int, ...], check: Callable[[], None]) -> RingAllReduce:
        """The ring of ``members`` (connected on first use)."""
        ring = self.rings.get(members)
        if ring is not None:
            return ring
        rank = members.index(self.worker_id)
        peers = [self.addresses[w] for w in members]
        failed: BaseException | None = None
        self.building = True  # before the check: an abort after it interrupts the accept
        self.inbox.clear_interrupt()  # an abort's that no build took
        try:
            check()
            link = TcpRingLink(rank, peers, self.inbox, timeout=self.options.op_timeout,
                               connect_timeout=self.options.connect_timeout)
            ring = RingAllReduce.over(PacedLink(link, self.options.link_bps) if self.options.link_bps else link)
        except (RingError, OSError) as exc:
            failed = exc
        finally:
            self.building = False
        if failed is not None:
            self.failed(failed, check)
        try:
            check()  # a generation may have come while connecting
        except BaseException:
            ring.close()
            raise
        self.rings[members] = ring
        return ring

    def failed(self, exc: BaseException, check: Callable[[], None]) -> NoReturn:
        """A ring failed: wait ``ring_grace`` for the generation change (or release) that explains it."""
        deadline = time.monotonic() + self.options.ring_grace
        while time.monotonic() < deadline:
            check()
            time.sleep(0.005)
        raise AgentError(f"worker {self.worker_id}: ring all-reduce failed: {exc}") from exc

    def reduce(self, seg: Segment, i0: int, members: tuple[int, ...], check: Callable[[], None]) -> None:
        """All-reduce this member's rows of ``seg[i0:]`` over the ring of ``members`` in one op; the sums go into
        ``seg``.

        The ring adds int32. Each member appends ceil(max|x| / 64) of its rows; if those add up to 2**25 or more
        an int32 sum might have wrapped, and every member (seeing the same total) redoes the op in int64.
        Results are exact.
        """
        check()
        ring = self.ring(members, check)
        data = seg.contrib[i0:]
        K, n = data.shape[0], len(members)
        rows = data.reshape(-1)
        payload = np.empty(rows.size + 1, dtype=np.int32)
        payload[:-1] = rows
        peak = max(int(rows.max()), -int(rows.min())) if rows.size else 0
        payload[-1] = -(-peak >> BOUND_SHIFT) if peak else 0
        start = time.monotonic()
        per_link = 2 * (n - 1) / n if n > 1 else 1.0  # a link carries this share of an op's bytes
        self.op = RingOp(start, K * CHUNK_BYTES * per_link / self.rate if self.rate > 0 else None, n)
        try:
            out = ring.allreduce(payload)
            self.stats.ring_ops += 1
            if int(out[-1]) >= BOUND_LIMIT:
                out = ring.allreduce(rows.astype(np.int64))
                self.stats.ring_redo_int64 += 1
                self.stats.ring_ops += 1
        except RingError as exc:
            self.lost = time.monotonic() - start  # the op's work so far is lost (stats.pauses)
            self.failed(exc, check)
        finally:
            self.op = None
        seg.put_ring(i0, out[: K * LANES].reshape(K, LANES))
        elapsed = time.monotonic() - start
        if elapsed > 0 and K:
            self.rate = K * CHUNK_BYTES * per_link / elapsed
