"""The job's chunk stream: one numbered sequence of int32 chunks, reduced by INA or a ring, resynchronised on every generation.

Every all-reduce call of a worker appends its chunks to the job's one stream: a call of M chunks takes
the numbers after the previous call's, then 2 recovery chunks per chunk whose result overflowed.
Chunk ``g`` goes to slot ``(g - base) mod S`` and shadow copy ``((g - base) div S) mod 2`` of the
worker's switch, with ``seq = g mod 2**32``; ``g + S`` is sent only after the result of ``g`` (SwitchML).
On a generation change the worker stops, reports the first chunk it has no result for
(``SyncGeneration``), and replays the stream from the returned resume chunk ``R`` under the new plan,
with ``base = R``. Contributions of recent calls are retained for that. docs/agent.md explains the
whole protocol, including why the overflow recovery cannot change the numbering between workers.

The stream runs each segment of chunks through one of its two phases, objects it holds: ``InaSender`` (the
SwitchML window towards the worker's switch, ``host_agent.ina_window``) or ``RingPhase`` (a TCP ring,
``host_agent.ring_phases``). Both take the stream's ``check`` to stop when a generation is pending.

Threads: one caller at a time runs ``reduce``; ``notify_grant``/``notify_released`` come from the
controller watcher and interrupt whatever is blocking; ``service_idle`` lets a background thread
replay while no call is running, because other workers may be waiting for this one's contributions.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from host_agent.acceptor import Inbox
from host_agent.chunks import LANES, Call, Segment
from host_agent.errors import AgentError, AgentTimeout, Interrupted, JobReleased, StaleGeneration
from host_agent.fixedpoint import split_chunks
from host_agent.grant import Grant, Plan, Worker, plan_for
from host_agent.ina_window import InaSender
from host_agent.options import StreamOptions
from host_agent.ring_phases import RingPhase
from host_agent.stats import StreamStats
from inaproto.backends import Backend, BackendChoice

__all__ = ["ChunkStream"]

log = logging.getLogger("host_agent.stream")


@dataclass
class Pause:
    """A generation change being measured until the stream is back where it stopped (``StreamStats.pauses``)."""

    notice: float  # the grant arrived
    stop: float  # the stream stopped
    synced: float  # SyncGeneration answered
    first_missing: int  # the stream's first missing chunk at the stop
    replayed: int
    ring_lost: float  # seconds of ring work the stop threw away
    generation: int
    kind: Backend


class ChunkStream:
    """One worker's side of one job's chunk stream (see the module docstring).

    Args:
        worker_id: this worker.
        workers: every worker of the job.
        sock: this worker's UDP socket (INA packets); made non-blocking here.
        ring_inbox: the ring connections of this worker's acceptor (``host_agent.acceptor``): its rings accept there.
        grant: the grant to start from (the agent syncs on it before the first chunk).
        backend: requested backend (``auto``, ``ina``, ``ring``, ``rina``).
        sync: ``sync(generation, first_missing_chunk) -> resume_chunk`` (SyncGeneration); raises
            StaleGeneration when the generation is no longer current. None: no controller (no resync).
        options: timing.
        addresses: switch name -> where its INA packets go, overriding the grant's (relays, tests).
    """

    def __init__(
        self,
        *,
        worker_id: int,
        workers: tuple[Worker, ...],
        sock: socket.socket,
        ring_inbox: Inbox,
        grant: Grant,
        backend: BackendChoice = BackendChoice.AUTO,
        sync: Callable[[int, int], int] | None = None,
        options: StreamOptions | None = None,
        addresses: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.workers = {w.worker_id: w for w in workers}
        if worker_id not in self.workers:
            raise ValueError(f"worker {worker_id} is not one of the job's workers {sorted(self.workers)}")
        self.ids = tuple(sorted(self.workers))
        self.backend = backend
        self.options = options = options or StreamOptions()
        self.addresses = dict(addresses or {})
        self.job_id = grant.job_id
        sock.setblocking(False)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            except OSError:
                pass
        self.stats = StreamStats()
        self.ina = InaSender(sock, options, self.stats, job_id=grant.job_id, worker_id=worker_id,
                             name=f"worker {worker_id}")
        self.ring = RingPhase(worker_id, {w: self.workers[w].address for w in self.ids}, ring_inbox, options, self.stats)
        self._sync = sync

        self._lock = threading.RLock()  # the stream: one reducer (caller or idle service) at a time
        self._ctl = threading.Lock()  # the fields below, shared with the watcher thread
        self._latest = grant
        self._pending = True  # sync on the first grant before the first chunk (docs/agent.md)
        self._released = False
        self._notice_at: float | None = None  # when the pending generation's grant arrived
        self._pause: Pause | None = None  # the last generation change, until the stream is back where it stopped

        self._plan: Plan = plan_for(grant, self.ids, backend, self.addresses)
        self._generation = grant.generation
        self._base = 0
        self._calls: list[Call] = []
        self._pruned_end = 0
        self._next_index = 0
        self._lag = 1
        self._broken: BaseException | None = None
        self._closed = False
        self.ina.new_generation(self._path_floor(grant))

    # ------------------------------------------------------------------ control (any thread)

    def _path_floor(self, grant: Grant) -> float:
        """The path round-trip floor under ``grant`` (its plan adopted): the option's override, else the grant's
        (0 where the plan has the worker aggregate in no switch: the ring): the floor of this worker's switch, on
        Rina's chains at least the chains' round trip (the measured minimum crosses idle htb links unshaped:
        docs/agent.md, "Rina on chains")."""
        floor = self.options.path_rtt_floor
        if floor is None:
            floor = 0.0
            if self._plan.rack_of(self.worker_id):
                floor = grant.path_rtt_floor(self.worker_id)
                if grant.backend == Backend.RINA:
                    floor = max(floor, grant.chain_rtt_floor)
        self.stats.path_rtt_floor_s = floor
        return floor

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def released(self) -> bool:
        return self._released

    def notify_grant(self, grant: Grant) -> None:
        """A grant from the controller's event stream; a new generation interrupts the stream.

        The interruption (waking the INA window, aborting the ring's op or set-up) happens under the lock that
        ``_resync`` takes to end the pending generation: once interrupted, the stream may resync at once and
        start the new generation's ring, which an abort arriving after it would break (no generation change
        would then explain the failure)."""
        with self._ctl:
            same = grant.generation == self._latest.generation
            self._latest = grant
            if same:
                return
            if not self._pending:
                self._notice_at = time.monotonic()
            self._pending = True
            self.ina.wake()
            if not self._finishes_ring_op(grant):
                self.ring.abort()

    def _finishes_ring_op(self, grant: Grant) -> bool:
        """A move from the ring to INA lets the ring op in flight finish when that loses less than aborting it
        (``RingPhase.worth_finishing``); the stream resyncs right after it (its next check)."""
        if self._plan.kind != Backend.RING or not self.ring.worth_finishing():
            return False
        try:
            new = plan_for(grant, self.ids, self.backend, self.addresses)
        except Exception:  # noqa: BLE001 (a grant the resync will reject: abort as before)
            return False
        return new.kind == Backend.INA

    def notify_released(self) -> None:
        with self._ctl:
            self._released = True
        self.ina.wake()
        self.ring.abort()

    def check(self) -> None:
        """Stop what runs now if a generation is pending (``Interrupted``) or the job was released."""
        if self._pending:
            raise Interrupted()
        if self._released:
            raise JobReleased("the controller released the job")

    # ------------------------------------------------------------------ reducing

    def reduce(self, chunks: np.ndarray, *, barrier: bool = False) -> np.ndarray:
        """Exact sums over all workers of ``chunks`` ((M, LANES) int32), via the current plan.

        The result is int32 where every sum fits (no overflow anywhere), else int64.

        ``barrier``: the call is the job's closing barrier; a release by the controller while waiting
        for it means every worker got that far (the releasing worker has its result), so it returns zeros.
        """
        chunks = np.ascontiguousarray(chunks, dtype=np.int32)
        if chunks.ndim != 2 or chunks.shape[1] != LANES:
            raise ValueError(f"chunks must have shape (M, {LANES}), got {chunks.shape}")
        with self._lock:
            self._check_usable()
            call = Call(self._next_index, chunks)
            self._next_index += 1
            self._calls.append(call)
            self.stats.calls += 1
            self.stats.chunks += call.M
            try:
                self._complete()
            except JobReleased:
                if barrier:
                    return np.zeros((call.M, LANES), dtype=np.int64)
                self._broken = JobReleased("the controller released the job")
                raise
            except BaseException as exc:
                self._broken = exc
                raise
            call.returned = True
            out = call.values()
            self._prune()
            return out

    def wants_idle_service(self) -> bool:
        """Whether ``service_idle`` has work now: a pending generation to resync."""
        return self._broken is None and not self._closed and self._pending and not self._released

    def service_idle(self) -> None:
        """From a background thread: resync and replay if a generation is pending and no call runs."""
        if self._broken is not None or self._closed or not self._lock.acquire(blocking=False):
            return
        try:
            if self._pending and not self._released:
                try:
                    self._complete()
                except JobReleased:
                    pass
                except BaseException as exc:  # noqa: BLE001
                    self._broken = exc
                    log.warning("worker %d: replay while idle failed: %s", self.worker_id, exc)
        finally:
            self._lock.release()

    def first_missing(self) -> int:
        """The lowest chunk number this worker has no result for (its report in SyncGeneration)."""
        pos = self._pruned_end
        for call in self._calls:
            if call.start is None or call.main_seg is None:
                return pos
            i = call.main_seg.first_missing()
            if i >= 0:
                return call.start + i
            if call.F is None:
                return call.start + call.M
            if call.rec_seg is not None:
                i = call.rec_seg.first_missing()
                if i >= 0:
                    return call.rec_seg.a + i
            pos = call.end
        return pos

    def close(self) -> None:
        """Close the rings and the INA sender; the UDP socket and the acceptor are the caller's."""
        self._closed = True
        self.ring.close()
        self.ina.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise AgentError("the stream is closed")
        if self._broken is not None:
            raise AgentError(f"an earlier failure broke this job's stream: {self._broken}") from self._broken
        if self._released:
            raise JobReleased("the controller released the job")

    # ------------------------------------------------------------------ the main loop

    def _complete(self) -> None:
        while True:
            if self._released:
                raise JobReleased("the controller released the job")
            if self._pending:
                self._resync()
                continue
            work = self._next_work()
            if work is None:
                return
            seg, i0 = work
            try:
                self._run_segment(seg, i0)
            except Interrupted:
                continue
            if self._pause is not None:
                self._caught_up()

    def _caught_up(self) -> bool:
        """Record the pause of the last generation change once the stream is back where it stopped."""
        p = self._pause
        if p is None:
            return True
        if self.first_missing() < p.first_missing:
            return False
        self._pause = None
        back = time.monotonic() - p.notice
        self.stats.pauses.append([round(p.stop - p.notice, 6), round(p.synced - p.notice, 6), round(back, 6),
                                  p.replayed, round(p.ring_lost, 6), p.generation, p.kind.value])
        return True

    def _next_work(self) -> tuple[Segment, int] | None:
        pos = self._pruned_end
        for call in self._calls:
            if call.start is None:
                call.start = pos
            if call.main_seg is None:
                call.main_seg = Segment(call.start, call.main)
            i = call.main_seg.first_missing()
            if i >= 0:
                return call.main_seg, i
            if call.F is None:
                call.F = np.flatnonzero(np.frombuffer(call.main_seg.flag, dtype=np.uint8))
                if call.F.size:
                    call.rec_seg = Segment(call.start + call.M, split_chunks(call.main[call.F]))
                    if not call.returned:
                        self.stats.overflow_chunks += int(call.F.size)
            if call.rec_seg is not None:
                i = call.rec_seg.first_missing()
                if i >= 0:
                    return call.rec_seg, i
            pos = call.end
        return None

    def _prune(self) -> None:
        keep_from = self.first_missing() - self._lag - 1
        while self._calls and self._calls[0].returned and self._calls[0].end is not None and self._calls[0].end <= keep_from:
            self._pruned_end = self._calls.pop(0).end

    def _reset_from(self, R: int) -> None:
        if R < self._pruned_end:
            raise AgentError(f"cannot resume at chunk {R}: chunks before {self._pruned_end} are no longer retained")
        hit = False
        for call in self._calls:
            if hit or call.start is None or call.main_seg is None:
                hit = True
                call.unplace()
                continue
            if R < call.start + call.M:
                call.main_seg.reset_from(max(R - call.start, 0))
                call.F = None
                call.rec_seg = None
                hit = True
            elif call.F is None:
                hit = True
            elif call.rec_seg is not None and R < call.end:
                call.rec_seg.reset_from(R - call.rec_seg.a)
                hit = True

    def _latest_grant(self) -> Grant:
        with self._ctl:
            return self._latest

    def _barrier(self, m: int, deadline: float) -> tuple[Grant, int]:
        """SyncGeneration on the newest grant with this worker's first missing chunk ``m``: (that grant, the resume
        chunk every worker agreed on)."""
        while True:
            grant = self._latest_grant()
            if self._sync is None:
                return grant, m
            try:
                return grant, int(self._sync(grant.generation, m))
            except StaleGeneration:
                while self._latest.generation == grant.generation:
                    if self._released:
                        raise JobReleased("the controller released the job") from None
                    if time.monotonic() > deadline:
                        raise AgentTimeout(f"generation {grant.generation} is stale but no newer grant arrived "
                                           f"within {self.options.op_timeout}s") from None
                    time.sleep(0.005)

    def _resync(self) -> None:
        stop = time.monotonic()
        lost, self.ring.lost = self.ring.lost, 0.0  # the work an aborted ring op threw away
        self.ina.clear_wake()
        # Leave the rings before the barrier: a peer may have started a ring op this worker will not join (it
        # had not seen the grant yet, and then let the op run on as worth finishing); the closed connections
        # fail that op, which then resyncs, instead of both waiting on each other until their timeouts. A peer
        # finishing the op this worker finished still gets all of it: it was sent before the close. The next
        # generation rebuilds the rings under its plan.
        self.ring.new_generation()
        m = self.first_missing()
        grant, resume = self._barrier(m, stop + self.options.op_timeout)
        with self._ctl:
            if self._latest.generation == grant.generation:
                self._pending = False
        if resume > m:
            raise AgentError(f"controller resumed at chunk {resume}, beyond this worker's first missing chunk {m}")
        self._reset_from(resume)
        self.stats.replayed_chunks += m - resume
        self._plan = plan_for(grant, self.ids, self.backend, self.addresses)
        self._generation = grant.generation
        self._base = resume
        self.ina.new_generation(self._path_floor(grant))  # the new plan may aggregate in another switch
        notice, self._notice_at = self._notice_at, None
        if notice is not None and self.stats.resyncs:
            self._pause = Pause(notice, stop, time.monotonic(), m, m - resume, lost, grant.generation, self._plan.kind)
            self._caught_up()
        self.stats.resyncs += 1
        self.stats.generation_history.append((grant.generation, self._plan.kind, resume))
        log.info("worker %d: generation %d (%s), resume at chunk %d (first missing was %d)",
                 self.worker_id, grant.generation, self._plan.describe(), resume, m)

    def _run_segment(self, seg: Segment, i0: int) -> None:
        plan = self._plan
        if plan.kind == Backend.RING:
            self._lag = max(self._lag, seg.K - i0)
            self.ring.reduce(seg, i0, plan.ring, self.check)
            return
        rack = plan.rack_of(self.worker_id)
        self._lag = max(self._lag, rack.num_slots)
        pause = self._pause
        self.ina.run(seg, i0, rack, generation=self._generation, base=self._base, check=self.check,
                     caught_up=self._caught_up if pause is not None else None,
                     caught_up_at=pause.first_missing if pause is not None else 0)
