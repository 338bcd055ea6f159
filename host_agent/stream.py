"""The job's chunk stream: one numbered sequence of int32 chunks, reduced by INA, ring or Rina, resynchronised on every generation.

Every all-reduce call of a worker appends its chunks to the job's one stream: a call of M chunks takes
the numbers after the previous call's, then 2 recovery chunks per chunk whose result overflowed.
Chunk ``g`` goes to slot ``(g - base) mod S`` and shadow copy ``((g - base) div S) mod 2`` of the
worker's switch, with ``seq = g mod 2**32``; ``g + S`` is sent only after the result of ``g`` (SwitchML).
On a generation change the worker stops, reports the first chunk it has no result for
(``SyncGeneration``), and replays the stream from the returned resume chunk ``R`` under the new plan,
with ``base = R``. Contributions of recent calls are retained for that. docs/agent.md explains the
whole protocol, including why the overflow recovery cannot change the numbering between workers.

Threads: one caller at a time runs ``reduce``; ``notify_grant``/``notify_released`` come from the
controller watcher and interrupt whatever is blocking; ``service_idle`` lets a background thread
replay while no call is running, because other workers may be waiting for this one's contributions.

The phases a segment of chunks runs through live in their own modules, mixed into ``ChunkStream``:
``host_agent.ina_window`` (the switch), ``host_agent.ring_phases`` (a TCP ring) and ``host_agent.rina``
(Rina's broadcast and repair); ``host_agent.chunks`` holds the calls and segments they fill.
"""
from __future__ import annotations

import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from host_agent.chunks import LANES, Call, Segment
from host_agent.congestion import CongestionWindow
from host_agent.errors import AgentError, AgentTimeout, Interrupted, JobReleased, StaleGeneration
from host_agent.fixedpoint import split_chunks
from host_agent.flight import QueryMode
from host_agent.grant import Grant, Plan, Worker, plan_for
from host_agent.ina_window import TX_MOD, InaPhase, WindowMode
from host_agent.rina import RinaPhases
from host_agent.ring import RingAllReduce
from host_agent.ring_phases import RingPhases
from host_agent.ring_pieces import PIECE_BYTES
from host_agent.rtt import RttEstimator
from host_agent.udp_io import DatagramIo, IoMode
from inaproto import wire
from inaproto.backends import Backend, BackendChoice

__all__ = ["ChunkStream", "StreamOptions", "StreamStats"]

log = logging.getLogger("host_agent.stream")

RESULTS_PER_DRAIN = 1024  # results applied together at most (one window of a full switch)


@dataclass(frozen=True)
class StreamOptions:
    """Timing of the stream (seconds).

    Args:
        op_timeout: an operation that makes no progress for this long raises AgentTimeout.
        connect_timeout: deadline for connecting a ring.
        rto_initial, rto_min, rto_max: retransmission timeout: starts at rto_initial, then follows the
            measured round trips (RFC 6298, Karn's rule) within [rto_min, rto_max]; backs off per expiry.
        initial_window: chunks in flight at first; the congestion window then adapts, up to the slots.
        ring_grace: after a ring failure, how long to wait for the generation change that explains it.
        broadcast_window: Rina: chunks a representative broadcasts beyond the slowest rack worker's ack.
        reorder_guard: chunk g+S is sent no earlier than this after the last transmission of chunk g
            (0: off). The switch records each slot copy's seq and never adds a late copy of g to a
            later round, so this is only for switches without that check, on networks that hold
            packets back: set it to the longest such delay (docs/agent.md, "Loss recovery").
        io: how the UDP socket moves datagrams: ``IoMode.BATCHED`` (GSO sends, batched and GRO drains where
            the kernel has them, else per packet) or ``IoMode.PER_PACKET`` (forced; docs/agent.md, "I/O").
        link_bps: emulated bandwidth of this worker's link in bits/s (0: none). INA packets are paced
            at their size on the wire (Ethernet/IPv4/UDP/INA, 184 bytes) and every ring step takes at
            least its bytes (with TCP/IP/Ethernet framing) over this rate: equal links for comparing
            backends on loopback, where there is no real link to shape.
        path_rtt_floor: an explicit override of the shortest round trip this worker's aggregation path can
            have (seconds; 0: none). None (the default): the grant's, sized by the controller from the link
            rates for this worker's switch (``SwitchGrant.path_rtt_floor``, controller/path_floor.py) and
            taken again from every new grant. The RTT estimator's path round trip never goes below it
            (``RttEstimator.path_floor``); ``StreamStats.path_rtt_floor_s`` reports the one in use.
        rina_chains: follow Rina grants as chains across their racks' switches even where the grant does not
            say so (``Grant.chains``: the controller's layout, which the agent follows anyway); on chains each
            worker is plain INA towards its rack's switch or its own copy (docs/agent.md, "Rina as designed"),
            and its path round trip never goes below the grant's ``chain_rtt_floor``.
        ring_piece_bytes: the pieces ring steps are pipelined by (``host_agent.ring_pieces``; 0: whole
            chunks, every step waiting for the whole step before it, as before session 8).
        loss_signals: number every INA gradient (``Flags.TX_COUNTED``) so the switch reports this worker's own lost
            frames (gap reports) and each result names the job's previous completion (``Flags.PREV_DONE``): a
            worker then resends its own losses at once and leaves a peer's to the peer (docs/agent.md, "Loss
            signals"). Plain INA only; RACK waits for a peer's recovery only once the switch has shown it sends
            the signals.
        ring_block_seconds, ring_block_bytes: a ring phase runs in row blocks, one ring op each, back to back in
            one pipelined stream, so a move off the ring loses only the block in flight: blocks of
            ``ring_block_bytes`` when set (> 0), else of about ``ring_block_seconds`` of wire time at the ring's
            rate (``host_agent.ring_phases``; 0 seconds, the default for now: the rest of a call as one op, as
            before session 9; 1 is the design's value, opt-in until blocks cost nothing at 10 Mbit/s).
    """

    op_timeout: float = 60.0
    connect_timeout: float = 30.0
    rto_initial: float = 0.05
    rto_min: float = 0.01
    rto_max: float = 1.0
    initial_window: int = 8
    ring_grace: float = 10.0
    broadcast_window: int = 512
    reorder_guard: float = 0.0
    link_bps: float = 0.0
    io: IoMode = IoMode.PER_PACKET  # batched is opt-in until it helps the experiments (docs/agent.md, I/O)
    rina_chains: bool = False  # Rina jobs run as chains across switches (host_agent.grant.plan_for)
    path_rtt_floor: float | None = None
    ring_piece_bytes: int = PIECE_BYTES
    ring_block_seconds: float = 0.0  # off by default: blocks cost at 10 Mbit/s, 8 members (docs/experiments.md, "Row blocks")
    ring_block_bytes: int = 0
    loss_signals: bool = True
    queries: QueryMode = QueryMode.OFF  # measured no gain yet (experiment 4, session 6); when RACK asks the switch instead of resending (docs/agent.md, "Queries")

    def __post_init__(self) -> None:
        if not isinstance(self.io, IoMode):
            object.__setattr__(self, "io", IoMode(self.io))
        if not isinstance(self.queries, QueryMode):
            object.__setattr__(self, "queries", QueryMode(self.queries))
        for name in ("op_timeout", "connect_timeout", "rto_initial", "rto_min", "rto_max", "ring_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.reorder_guard >= 0:
            raise ValueError(f"reorder_guard must be >= 0, got {self.reorder_guard!r}")
        if self.path_rtt_floor is not None and not self.path_rtt_floor >= 0:
            raise ValueError(f"path_rtt_floor must be >= 0, got {self.path_rtt_floor!r}")
        if not self.link_bps >= 0:
            raise ValueError(f"link_bps must be >= 0, got {self.link_bps!r}")
        if self.ring_piece_bytes < 0:
            raise ValueError(f"ring_piece_bytes must be >= 0, got {self.ring_piece_bytes!r}")
        if self.ring_block_bytes < 0 or not 0 <= self.ring_block_seconds < math.inf:
            raise ValueError(f"ring_block_bytes and ring_block_seconds must be >= 0, got {self.ring_block_bytes!r}, "
                             f"{self.ring_block_seconds!r}")
        if not self.rto_min <= self.rto_initial <= self.rto_max:
            raise ValueError("need rto_min <= rto_initial <= rto_max")
        if self.initial_window < 1:
            raise ValueError(f"initial_window must be >= 1, got {self.initial_window}")
        if self.broadcast_window < 1:
            raise ValueError(f"broadcast_window must be >= 1, got {self.broadcast_window}")


@dataclass
class StreamStats:
    """Counters of one worker's stream (monotonic; read them any time)."""

    calls: int = 0
    chunks: int = 0
    packets_sent: int = 0
    retransmits: int = 0  # every resend (early, timeout probe)
    early_resends: int = 0  # resends of chunks found lost before the timeout (RACK)
    timeouts: int = 0  # expiries of a window's retransmission timer (each resends one probe)
    spurious_resends: int = 0  # resent chunks whose original reached the switch (host_agent/flight.py)
    queries: int = 0  # QUERYs sent in place of RACK's resends (docs/agent.md, "Queries")
    queries_held: int = 0  # of their answers, those saying the switch holds the gradient (no resend needed)
    gap_reports: int = 0  # the switch's reports of this worker's lost frames (docs/agent.md, "Loss signals")
    signal_resends: int = 0  # resends of chunks a gap report or a result's PREV_DONE named lost
    lane_lag_max: int = 0  # most chunks of one lane skipped at once (waiting for a recovery: docs/agent.md, lanes)
    # seconds an INA window had chunks left to send but could not send them (docs/agent.md, "Where the time
    # goes"): waiting for the result of the chunk that last used the next slot (loss recovery, a late peer),
    # for the congestion window, and with every chunk sent, for the last results (the tail)
    slot_wait_s: float = 0.0
    cwnd_wait_s: float = 0.0
    tail_wait_s: float = 0.0
    path_rtt_floor_s: float = 0.0  # the RTT estimator's path floor under the current generation (grant or override)
    # the estimator's path round trip (shortest seen, at least the floor) and smoothed round trip after the last INA
    # window, seconds (0 before any): what experiment 1 sizes its grants to (docs/experiments.md, "Grant sizing")
    path_rtt_s: float = 0.0
    srtt_s: float = 0.0
    window_cuts: int = 0  # congestion-window decreases (host_agent/congestion.py)
    loss_cuts: int = 0  # of those, the ones made on a loss
    results: int = 0
    ignored: int = 0  # duplicate, late or foreign packets
    stale: int = 0  # packets of another generation or job
    overflow_chunks: int = 0
    resyncs: int = 0
    replayed_chunks: int = 0
    ring_ops: int = 0
    ring_redo_int64: int = 0
    broadcasts_sent: int = 0
    nacks_sent: int = 0
    nacks_served: int = 0
    generation_history: list = field(default_factory=list)
    # per generation change (not the first sync): [seconds from the grant's arrival to the stop, to the
    # barrier's answer, to the replay's end (first missing chunk back where it was), chunks replayed,
    # seconds of ring work lost (an aborted ring op's time before the stop), the new generation, its plan's kind]
    pauses: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


class ChunkStream(InaPhase, RingPhases, RinaPhases):
    """One worker's side of one job's chunk stream (see the module docstring).

    Args:
        worker_id: this worker.
        workers: every worker of the job.
        sock: this worker's UDP socket (INA packets, Rina repair messages); made non-blocking here.
        listener: a bound TCP socket on this worker's ring address; rings accept on duplicates of it.
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
        listener: socket.socket,
        grant: Grant,
        backend: BackendChoice = BackendChoice.AUTO,
        sync: Callable[[int, int], int] | None = None,
        options: StreamOptions = StreamOptions(),
        addresses: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.workers = {w.worker_id: w for w in workers}
        if worker_id not in self.workers:
            raise ValueError(f"worker {worker_id} is not one of the job's workers {sorted(self.workers)}")
        self.ids = tuple(sorted(self.workers))
        self.backend = backend
        self.options = options
        self.addresses = dict(addresses or {})
        self.job_id = grant.job_id
        self.sock = sock
        sock.setblocking(False)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            except OSError:
                pass
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._wakefd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # notify_* wake the INA window's poll
        self._wpoll = select.poll()  # the INA window's: the socket and the wake-up
        self._wpoll.register(sock, select.POLLIN)
        self._wpoll.register(self._wakefd, select.POLLIN)
        self._notice_at: float | None = None  # when the pending generation's grant arrived
        self._catchup: list | None = None  # the pause being measured: [notice, stop, synced, first missing, replayed, lost,
        #                                     generation, plan kind]
        self._ring_lost = 0.0  # seconds of the last aborted ring op (host_agent/ring_phases.py)
        self._ring_rate = 0.0  # the ring's rate the members agreed on in this generation (ring_phases: block sizes)
        self._ring_rate_mine = 0.0  # this member's measured ring rate, bytes/s per link (what it reports)
        self._listener = listener
        self._listen_addr = listener.getsockname()[:2]
        self._sync = sync
        self.stats = StreamStats()
        self._rbuf = bytearray(2048)
        self._io = DatagramIo(sock, options.io, f"worker {worker_id}")
        self._rbatch = bytearray(RESULTS_PER_DRAIN * wire.INA_PAYLOAD_LEN + self._io.read_room)  # ResultBatch

        self._lock = threading.RLock()  # the stream: one reducer (caller or idle service) at a time
        self._ctl = threading.Lock()  # the fields below, shared with the watcher thread
        self._latest = grant
        self._pending = True  # sync on the first grant before the first chunk (docs/agent.md)
        self._released = False
        self._rings_building = False

        self._plan: Plan = plan_for(grant, self.ids, backend, self.addresses, chains=self.options.rina_chains)
        self._generation = grant.generation
        self._base = 0
        self._calls: list[Call] = []
        self._pruned_end = 0
        self._next_index = 0
        self._lag = 1
        self._broken: BaseException | None = None
        self._rings: dict[tuple[int, ...], RingAllReduce] = {}
        self._bstore: dict[int, bytes] = {}
        self._acks: dict[int, int] = {}
        self._rtt = RttEstimator(options.rto_initial, options.rto_min, options.rto_max,
                                 path_floor=self._path_floor(grant))
        self._cwnd = CongestionWindow(options.initial_window)
        self._reorder_mult = 1  # widening of the reorder window after spurious early resends (host_agent/flight.py)
        self._chain_rtts: list = []  # Rina on chains: recent round trips per chain (Flight's class_rtts)
        self._queries_answered = False  # the switch answered a query (a chain's switch does not)
        self._queries_unanswered = 0  # queries that timed out before any was answered
        self._txn = 0  # loss signals: this worker's INA gradient frames to the job so far (the counter's source)
        self._txlog = np.full(TX_MOD, -1, dtype=np.int64)  # ... the chunk each counter value (mod 128) last carried
        self._signals_seen = False  # a result carried PREV_DONE: the switch sends loss signals
        self._guard_until = 0.0
        self._pace_next = 0.0  # link emulation: when the next INA packet may leave
        self._pace_gap = (wire.INA_FRAME_LEN * 8 / options.link_bps) if options.link_bps else 0.0
        self._closed = False

    # ------------------------------------------------------------------ control (any thread)

    def _path_floor(self, grant: Grant) -> float:
        """The path round-trip floor under ``grant`` (its plan adopted): the option's override, else the grant's
        (0 where the plan has the worker aggregate in no switch: the ring): the floor of this worker's switch, on
        Rina's chains at least the chains' round trip (the measured minimum crosses idle htb links unshaped:
        docs/agent.md, "Rina as designed")."""
        floor = self.options.path_rtt_floor
        if floor is None:
            floor = 0.0
            if self._plan.rack_of(self.worker_id):
                floor = grant.path_rtt_floor(self.worker_id)
                if grant.chains or self.options.rina_chains:
                    floor = max(floor, grant.chain_rtt_floor)
        self.stats.path_rtt_floor_s = floor
        return floor

    @property
    def _rto(self) -> float:
        """The retransmission timeout now (Rina's repair requests use it too)."""
        return self._rtt.rto

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
        """A grant from the controller's event stream; a new generation interrupts the stream."""
        with self._ctl:
            same = grant.generation == self._latest.generation
            self._latest = grant
            if same:
                return
            if not self._pending:
                self._notice_at = time.monotonic()
            self._pending = True
        self._wake()
        if not self._finishes_ring_op(grant):
            self._abort_rings()

    def _finishes_ring_op(self, grant: Grant) -> bool:
        """A move from the ring to INA lets the ring op in flight finish when that loses less than aborting it
        (``RingPhases.ring_op_worth_finishing``); the stream resyncs right after it (its next interrupt check)."""
        if self._plan.kind != Backend.RING or not self.ring_op_worth_finishing():
            return False
        try:
            new = plan_for(grant, self.ids, self.backend, self.addresses, chains=self.options.rina_chains)
        except Exception:  # noqa: BLE001 (a grant the resync will reject: abort as before)
            return False
        return new.kind == Backend.INA

    def notify_released(self) -> None:
        with self._ctl:
            self._released = True
        self._wake()
        self._abort_rings()

    def _wake(self) -> None:
        """Wake a window blocked in poll (it sees the flags at once instead of after its 50 ms tick)."""
        try:
            os.eventfd_write(self._wakefd, 1)
        except OSError:
            pass

    def _abort_rings(self) -> None:
        for ring in list(self._rings.values()):
            abort = getattr(ring.link, "abort", None)
            if abort is not None:
                abort()
        if self._rings_building:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

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
        """Whether ``service_idle`` has work now: a pending generation to resync, or Rina's repair traffic."""
        if self._broken is not None or self._closed:
            return False
        return (self._pending and not self._released) or self._plan.kind == Backend.RINA

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
            elif self._plan.kind == Backend.RINA:
                self._drain_idle()
        finally:
            self._lock.release()

    def linger(self, timeout: float) -> None:
        """Rina representative at the end: answer repair requests until the rack has acknowledged everything."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._plan.kind != Backend.RINA or not self._plan.is_representative(self.worker_id):
                return
            end = self.first_missing()
            rack = self._plan.rack_of(self.worker_id)
            while time.monotonic() < deadline and not self._released:
                if all(self._acks.get(w, 0) >= end for w in rack.worker_ids[1:]):
                    return
                if self._poll.poll(20):
                    self._drain_idle()

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
        """Close the rings and the listener (the stream owns it); the UDP socket is the caller's."""
        self._closed = True
        for ring in self._rings.values():
            ring.close()
        self._rings.clear()
        self._listener.close()
        try:
            os.close(self._wakefd)
        except OSError:
            pass

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
            if self._catchup is not None:
                self._caught_up()

    def _caught_up(self) -> None:
        """Record the pause of the last generation change once the stream is back where it stopped."""
        notice, stop, synced, m, replayed, lost, generation, kind = self._catchup
        if self.first_missing() < m:
            return
        self._catchup = None
        now = time.monotonic()
        self.stats.pauses.append([round(stop - notice, 6), round(synced - notice, 6), round(now - notice, 6), replayed,
                                  round(lost, 6), generation, kind.value])

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

    def _resync(self) -> None:
        opts = self.options
        stop = time.monotonic()
        lost, self._ring_lost = self._ring_lost, 0.0  # an aborted ring op's work
        deadline = stop + opts.op_timeout
        try:
            os.eventfd_read(self._wakefd)
        except OSError:
            pass
        while True:
            with self._ctl:
                grant = self._latest
            m = self.first_missing()
            if self._sync is None:
                resume = m
                break
            try:
                resume = int(self._sync(grant.generation, m))
                break
            except StaleGeneration:
                while self._latest.generation == grant.generation:
                    if self._released:
                        raise JobReleased("the controller released the job") from None
                    if time.monotonic() > deadline:
                        raise AgentTimeout(f"generation {grant.generation} is stale but no newer grant arrived "
                                           f"within {opts.op_timeout}s") from None
                    time.sleep(0.005)
        with self._ctl:
            if self._latest.generation == grant.generation:
                self._pending = False
        for ring in self._rings.values():
            ring.close()
        self._rings.clear()
        self._ring_rate = 0.0  # agreed anew in each generation: some members may have seen a block others lost
        self._bstore.clear()
        if resume > m:
            raise AgentError(f"controller resumed at chunk {resume}, beyond this worker's first missing chunk {m}")
        self._reset_from(resume)
        self.stats.replayed_chunks += m - resume
        self._plan = plan_for(grant, self.ids, self.backend, self.addresses, chains=self.options.rina_chains)
        self._generation = grant.generation
        self._base = resume
        self._acks = {w: resume for w in self.ids}
        self._rtt.reset()  # the new plan may aggregate in another switch
        self._rtt.path_floor = self._path_floor(grant)
        self._chain_rtts.clear()
        self._signals_seen = False  # ... which may not send loss signals (a chain's, an older program)
        notice, self._notice_at = self._notice_at, None
        if notice is not None and self.stats.resyncs:
            self._catchup = [notice, stop, time.monotonic(), m, m - resume, lost, grant.generation, self._plan.kind]
            self._caught_up()
        self.stats.resyncs += 1
        self.stats.generation_history.append((grant.generation, self._plan.kind, resume))
        log.info("worker %d: generation %d (%s), resume at chunk %d (first missing was %d)",
                 self.worker_id, grant.generation, self._plan.describe(), resume, m)

    def _check_interrupt(self) -> None:
        if self._pending:
            raise Interrupted()
        if self._released:
            raise JobReleased("the controller released the job")

    def _run_segment(self, seg: Segment, i0: int) -> None:
        plan = self._plan
        if plan.kind == Backend.RING:
            self._lag = max(self._lag, seg.K - i0)
            self._ring_segment(seg, i0, plan.ring, seg.contrib[i0:], None, rina=False)
            return
        rack = plan.rack_of(self.worker_id)
        if plan.kind == Backend.INA:
            self._lag = max(self._lag, rack.num_slots)
            self._ina_window(seg, i0, rack, WindowMode.FINAL)
            return
        self._lag = max(self._lag, seg.K - i0 + (rack.num_slots if rack else 0))
        if rack is None:  # a plain member of the cross-rack ring
            self._ring_segment(seg, i0, plan.ring, seg.contrib[i0:], np.zeros(seg.K - i0, np.int32), rina=True)
        elif rack.representative == self.worker_id:
            partial, pflag = self._ina_window(seg, i0, rack, WindowMode.PARTIAL)
            part = np.frombuffer(partial, dtype=wire.LANES_DTYPE).astype(np.int32).reshape(-1, LANES)[i0:]
            self._ring_segment(seg, i0, plan.ring, part, np.frombuffer(pflag, dtype=np.uint8)[i0:].astype(np.int32),
                               rina=True)
            self._broadcast(seg, i0, rack)
        else:
            self._ina_window(seg, i0, rack, WindowMode.MEMBER)
            self._await_globals(seg, i0, rack)
