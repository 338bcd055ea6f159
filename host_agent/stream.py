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
"""
from __future__ import annotations

import heapq
import logging
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from host_agent.fixedpoint import join_split, split_chunks
from host_agent.grant import Grant, Plan, Rack, Worker, plan_for
from host_agent.ring import RingAllReduce, RingError, TcpRingLink
from inaproto import rina_repair, wire
from inaproto.backends import Backend, BackendChoice

__all__ = [
    "AgentError",
    "AgentTimeout",
    "ChunkStream",
    "JobReleased",
    "StaleGeneration",
    "StreamOptions",
    "StreamStats",
]

log = logging.getLogger("host_agent.stream")

LANES = wire.LANES
CHUNK_BYTES = wire.INA_DATA_LEN
PAYLOAD = wire.INA_PAYLOAD_LEN
_HDR = wire.HEADER  # unpacks to (msg_type, flags, job_id, generation, slot, seq, worker_id, reserved:7 | shadow:1)
GRADIENT, RESULT, BROADCAST = int(wire.MsgType.GRADIENT), int(wire.MsgType.RESULT), int(wire.MsgType.BROADCAST)
F_RETRANSMIT, F_OVERFLOW = int(wire.Flags.RETRANSMIT), int(wire.Flags.OVERFLOW)
_BE = wire.LANES_DTYPE
_PACKET = wire.PAYLOAD_DTYPE  # a run's packets are built in one pass
_NACK, _NACK_MAGIC, _NACK_BITS = rina_repair.NACK, rina_repair.NACK_MAGIC, rina_repair.NACK_BITS
_BOUND_SHIFT = 6  # ring overflow guard: each member adds ceil(max|x| / 64); see _ring_segment
_BOUND_LIMIT = 1 << (31 - _BOUND_SHIFT)


class AgentError(RuntimeError):
    """The all-reduce cannot complete (peer failure, controller error, protocol violation)."""


class AgentTimeout(AgentError, TimeoutError):
    """No progress for the operation timeout."""


class JobReleased(AgentError):
    """The controller released the job (or it timed out there): no further all-reduce is possible."""


class StaleGeneration(Exception):
    """SyncGeneration was refused because the job has moved to a newer generation (FAILED_PRECONDITION)."""


class _Interrupted(Exception):
    """Internal: a newer generation is pending; stop and resynchronise."""


@dataclass(frozen=True)
class StreamOptions:
    """Timing of the stream (seconds).

    Args:
        op_timeout: an operation that makes no progress for this long raises AgentTimeout.
        connect_timeout: deadline for connecting a ring.
        rto_initial, rto_min, rto_max: retransmission timeout: starts at rto_initial, then follows the
            measured round trips (Jacobson/Karn) within [rto_min, rto_max]; doubles per retry of a chunk.
        ring_grace: after a ring failure, how long to wait for the generation change that explains it.
        broadcast_window: Rina: chunks a representative broadcasts beyond the slowest rack worker's ack.
        reorder_guard: chunk g+S is sent no earlier than this after the last transmission of chunk g
            (0: off). The switch records each slot copy's seq and never adds a late copy of g to a
            later round, so this is only for switches without that check, on networks that hold
            packets back: set it to the longest such delay (docs/agent.md, "Loss recovery").
        link_bps: emulated bandwidth of this worker's link in bits/s (0: none). INA packets are paced
            at their size on the wire (Ethernet/IPv4/UDP/INA, 184 bytes) and every ring step takes at
            least its bytes (with TCP/IP/Ethernet framing) over this rate: equal links for comparing
            backends on loopback, where there is no real link to shape.
    """

    op_timeout: float = 60.0
    connect_timeout: float = 30.0
    rto_initial: float = 0.05
    rto_min: float = 0.01
    rto_max: float = 1.0
    ring_grace: float = 10.0
    broadcast_window: int = 512
    reorder_guard: float = 0.0
    link_bps: float = 0.0

    def __post_init__(self) -> None:
        for name in ("op_timeout", "connect_timeout", "rto_initial", "rto_min", "rto_max", "ring_grace"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.reorder_guard >= 0:
            raise ValueError(f"reorder_guard must be >= 0, got {self.reorder_guard!r}")
        if not self.link_bps >= 0:
            raise ValueError(f"link_bps must be >= 0, got {self.link_bps!r}")
        if not self.rto_min <= self.rto_initial <= self.rto_max:
            raise ValueError("need rto_min <= rto_initial <= rto_max")
        if self.broadcast_window < 1:
            raise ValueError(f"broadcast_window must be >= 1, got {self.broadcast_window}")


@dataclass
class StreamStats:
    """Counters of one worker's stream (monotonic; read them any time)."""

    calls: int = 0
    chunks: int = 0
    packets_sent: int = 0
    retransmits: int = 0
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

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


class _PacedLink:
    """A ring link whose every step lasts at least its bytes on the wire over ``bps`` (link emulation)."""

    FRAMING = 1514 / 1448  # Ethernet + IPv4 + TCP (timestamps) headers per full segment

    def __init__(self, link: TcpRingLink, bps: float) -> None:
        self.link, self.bps = link, bps
        self.rank, self.size = link.rank, link.size

    def exchange(self, send: memoryview, recv: memoryview, tag: bytes) -> None:
        start = time.monotonic()
        self.link.exchange(send, recv, tag)
        left = start + (max(send.nbytes, recv.nbytes) + 40) * self.FRAMING * 8 / self.bps - time.monotonic()
        if left > 0:
            time.sleep(left)

    def abort(self) -> None:
        self.link.abort()

    def close(self) -> None:
        self.link.close()


class _Segment:
    """Consecutive chunks [a, a+K) of one call with this worker's contributions and the results so far."""

    __slots__ = ("a", "K", "contrib", "res32", "resr", "src", "flag")

    def __init__(self, a: int, contrib: np.ndarray) -> None:
        self.a = a
        self.K = contrib.shape[0]
        self.contrib = contrib
        self.res32 = bytearray(self.K * CHUNK_BYTES)  # big-endian int32 results from packets
        self.resr: np.ndarray | None = None  # results from a ring (int32 or int64)
        self.src = bytearray(self.K)  # 0 missing, 1 in res32, 2 in resr
        self.flag = bytearray(self.K)  # 1: the result may be inexact (overflow): recover

    def first_missing(self, start: int = 0) -> int:
        return self.src.find(0, start)

    def reset_from(self, i: int) -> None:
        n = self.K - i
        if n > 0:
            self.src[i:] = bytes(n)
            self.flag[i:] = bytes(n)

    def put_ring(self, i0: int, values: np.ndarray, flags: np.ndarray | None) -> None:
        if i0 == 0 and self.resr is None:
            self.resr = values
        else:
            if self.resr is None or self.resr.dtype != np.int64:
                old, self.resr = self.resr, np.zeros((self.K, LANES), dtype=np.int64)
                if old is not None:
                    self.resr[:] = old
            self.resr[i0:] = values
        self.src[i0:] = b"\x02" * (self.K - i0)
        self.flag[i0:] = bytes(self.K - i0) if flags is None else flags.astype(np.uint8).tobytes()

    def values(self) -> np.ndarray:
        """The results, int32 where every one fits, else int64."""
        if self.resr is not None and self.src.count(2) == self.K:
            return self.resr
        out = np.frombuffer(self.res32, dtype=_BE).reshape(self.K, LANES)
        if self.resr is None:
            return out.astype(np.int32)
        out = out.astype(np.int64)
        from_ring = np.frombuffer(self.src, dtype=np.uint8) == 2
        out[from_ring] = self.resr[from_ring]
        return out


class _Call:
    """One all-reduce call: its retained contributions and where its chunks sit in the stream."""

    __slots__ = ("index", "main", "M", "start", "main_seg", "F", "rec_seg", "returned")

    def __init__(self, index: int, main: np.ndarray) -> None:
        self.index = index
        self.main = main
        self.M = main.shape[0]
        self.start: int | None = None
        self.main_seg: _Segment | None = None
        self.F: np.ndarray | None = None  # indices of overflowed main chunks, once every main result is in
        self.rec_seg: _Segment | None = None
        self.returned = False

    @property
    def end(self) -> int | None:
        if self.start is None or self.F is None:
            return None
        return self.start + self.M + 2 * int(self.F.size)

    def unplace(self) -> None:
        self.start = None
        self.main_seg = None
        self.F = None
        self.rec_seg = None

    def values(self) -> np.ndarray:
        out = self.main_seg.values()
        if self.F is not None and self.F.size:
            out = out.astype(np.int64)
            out[self.F] = join_split(self.rec_seg.values())
        return out


class ChunkStream:
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
        self._listener = listener
        self._listen_addr = listener.getsockname()[:2]
        self._sync = sync
        self.stats = StreamStats()
        self._rbuf = bytearray(2048)

        self._lock = threading.RLock()  # the stream: one reducer (caller or idle service) at a time
        self._ctl = threading.Lock()  # the fields below, shared with the watcher thread
        self._latest = grant
        self._pending = True  # sync on the first grant before the first chunk (docs/agent.md)
        self._released = False
        self._rings_building = False

        self._plan: Plan = plan_for(grant, self.ids, backend, self.addresses)
        self._generation = grant.generation
        self._base = 0
        self._calls: list[_Call] = []
        self._pruned_end = 0
        self._next_index = 0
        self._lag = 1
        self._broken: BaseException | None = None
        self._rings: dict[tuple[int, ...], RingAllReduce] = {}
        self._bstore: dict[int, bytes] = {}
        self._acks: dict[int, int] = {}
        self._rtt_samples = [options.rto_initial / 4] * 32
        self._rtt_next = 0
        self._rto = options.rto_initial
        self._guard_until = 0.0
        self._pace_next = 0.0  # link emulation: when the next INA packet may leave
        self._pace_gap = (wire.INA_FRAME_LEN * 8 / options.link_bps) if options.link_bps else 0.0
        self._closed = False

    # ------------------------------------------------------------------ control (any thread)

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
            self._pending = True
        self._abort_rings()

    def notify_released(self) -> None:
        with self._ctl:
            self._released = True
        self._abort_rings()

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
            call = _Call(self._next_index, chunks)
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
                except BaseException as exc:
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
            except _Interrupted:
                continue

    def _next_work(self) -> tuple[_Segment, int] | None:
        pos = self._pruned_end
        for call in self._calls:
            if call.start is None:
                call.start = pos
            if call.main_seg is None:
                call.main_seg = _Segment(call.start, call.main)
            i = call.main_seg.first_missing()
            if i >= 0:
                return call.main_seg, i
            if call.F is None:
                call.F = np.flatnonzero(np.frombuffer(call.main_seg.flag, dtype=np.uint8))
                if call.F.size:
                    call.rec_seg = _Segment(call.start + call.M, split_chunks(call.main[call.F]))
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
        deadline = time.monotonic() + opts.op_timeout
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
        self._bstore.clear()
        if resume > m:
            raise AgentError(f"controller resumed at chunk {resume}, beyond this worker's first missing chunk {m}")
        self._reset_from(resume)
        self.stats.replayed_chunks += m - resume
        self._plan = plan_for(grant, self.ids, self.backend, self.addresses)
        self._generation = grant.generation
        self._base = resume
        self._acks = {w: resume for w in self.ids}
        self.stats.resyncs += 1
        self.stats.generation_history.append((grant.generation, self._plan.kind, resume))
        log.info("worker %d: generation %d (%s), resume at chunk %d (first missing was %d)",
                 self.worker_id, grant.generation, self._plan.describe(), resume, m)

    def _check_interrupt(self) -> None:
        if self._pending:
            raise _Interrupted()
        if self._released:
            raise JobReleased("the controller released the job")

    def _run_segment(self, seg: _Segment, i0: int) -> None:
        plan = self._plan
        if plan.kind == Backend.RING:
            self._lag = max(self._lag, seg.K - i0)
            self._ring_segment(seg, i0, plan.ring, seg.contrib[i0:], None, rina=False)
            return
        rack = plan.rack_of(self.worker_id)
        if plan.kind == Backend.INA:
            self._lag = max(self._lag, rack.num_slots)
            self._ina_window(seg, i0, rack, "final")
            return
        self._lag = max(self._lag, seg.K - i0 + (rack.num_slots if rack else 0))
        if rack is None:  # a plain member of the cross-rack ring
            self._ring_segment(seg, i0, plan.ring, seg.contrib[i0:], np.zeros(seg.K - i0, np.int32), rina=True)
        elif rack.representative == self.worker_id:
            partial, pflag = self._ina_window(seg, i0, rack, "partial")
            part = np.frombuffer(partial, dtype=_BE).astype(np.int32).reshape(-1, LANES)[i0:]
            self._ring_segment(seg, i0, plan.ring, part, np.frombuffer(pflag, dtype=np.uint8)[i0:].astype(np.int32),
                               rina=True)
            self._broadcast(seg, i0, rack)
        else:
            self._ina_window(seg, i0, rack, "member")
            self._await_globals(seg, i0, rack)

    # ------------------------------------------------------------------ INA: the sliding window

    def _update_rto(self, sample: float) -> None:
        """RTO = 4 x the shortest of the last 32 round trips of chunks sent once (within the bounds).

        A chunk's round trip includes waiting for the slowest worker, and for that worker's own
        retransmissions: averages of it track the other workers' RTOs and inflate without bound under
        loss. The shortest recent round trip is what the worker that completes a chunk sees: the path
        and its queueing. A spurious retransmission costs one packet that the switch drops.
        """
        buf = self._rtt_samples
        buf[self._rtt_next] = sample
        self._rtt_next = (self._rtt_next + 1) % len(buf)
        o = self.options
        self._rto = min(max(4 * min(buf), o.rto_min), o.rto_max)

    def _ina_window(self, seg: _Segment, i0: int, rack: Rack, mode: str):
        """Contribute chunks ``seg[i0:]`` to ``rack``'s switch under the SwitchML window.

        mode ``final``: results are the job's sums (plain INA). ``partial``: results are the rack's
        partial sums, returned as (bytes, flags) for the cross-rack ring (Rina representative).
        ``member``: results only move the window; global sums arrive as BROADCASTs (Rina rack worker).
        Returns when every chunk has its switch result.
        """
        K, a = seg.K, seg.a
        S = rack.num_slots
        base = self._base
        addr = rack.address
        job, gen, wid = self.job_id, self._generation, self.worker_id
        sock, rbuf, poll = self.sock, self._rbuf, self._poll
        unpack_from = _HDR.unpack_from
        got = bytearray(K)
        got[:i0] = b"\x01" * i0
        final = mode == "final"
        partial = bytearray(K * CHUNK_BYTES) if mode == "partial" else None
        pflag = bytearray(K) if mode == "partial" else None
        member = mode == "member"
        res32, flag, src = seg.res32, seg.flag, seg.src
        # every packet of the run, ready to send: slot, shadow and seq follow from the chunk number
        rel = np.arange(seg.a + i0 - base, seg.a + K - base, dtype=np.int64)
        rec = np.empty(K - i0, dtype=_PACKET)
        rec["msg_type"], rec["flags"], rec["job_id"], rec["generation"] = GRADIENT, 0, job, gen
        rec["slot"] = rel % S
        rec["seq"] = (rel + base) & 0xFFFFFFFF
        rec["worker_id"] = wid
        rec["reserved_shadow"] = (rel // S) & 1
        rec["lanes"] = seg.contrib[i0:]
        pkts = memoryview(rec.tobytes())
        del rec, rel
        rview = memoryview(rbuf)
        H = wire.INA_HEADER_LEN
        inflight: dict[int, int] = {}  # seq -> index of every chunk awaiting its switch result
        sent_at = [0.0] * K  # first transmission (round-trip samples)
        last_tx = [0.0] * K  # last transmission (reorder guard)
        guard = self.options.reorder_guard
        pace = self._pace_gap
        if guard:  # the first S chunks reuse the slots of the previous run's last ones
            delay = self._guard_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        tries: dict[int, int] = {}
        fresh: deque[tuple[float, int]] = deque()  # first sends, in deadline order
        retry: list[tuple[float, int]] = []  # heap of resends
        stats = self.stats
        nxt = i0
        remaining = K - i0
        opts = self.options
        mono = time.monotonic
        last_progress = mono()
        sent = 0
        samples = 0

        while remaining:
            if self._pending:
                raise _Interrupted()
            if self._released:
                raise JobReleased("the controller released the job")
            # 1. send what the window allows: chunk i after the result of chunk i - S (and, with a
            #    reorder guard, no earlier than `guard` after the last transmission of chunk i - S)
            now = mono()
            rto = self._rto
            while nxt < K and (nxt - S < i0 or got[nxt - S]):
                if guard and nxt - S >= i0 and now < last_tx[nxt - S] + guard:
                    break
                if pace:
                    if now < self._pace_next:
                        break
                    self._pace_next = max(self._pace_next, now - 8 * pace) + pace  # bursts of <= 8 after a late wake-up
                off = (nxt - i0) * PAYLOAD
                try:
                    sock.sendto(pkts[off : off + PAYLOAD], addr)
                except (BlockingIOError, ConnectionRefusedError):
                    pass
                inflight[(a + nxt) & 0xFFFFFFFF] = nxt
                sent_at[nxt] = last_tx[nxt] = now
                fresh.append((now + rto, nxt))
                nxt += 1
                sent += 1
            # 2. take every datagram waiting
            progressed = False
            while True:
                try:
                    n = sock.recv_into(rbuf)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:
                    continue
                if n == PAYLOAD and rbuf[0] == RESULT:
                    mt, fl, jid, g, _slot, seq, _w, _last = unpack_from(rbuf, 0)
                    if jid != job or g != gen:
                        stats.stale += 1
                        continue
                    i = inflight.pop(seq, None)
                    if i is None:
                        stats.ignored += 1
                        continue
                    got[i] = 1
                    remaining -= 1
                    progressed = True
                    off = i * CHUNK_BYTES
                    if final:
                        res32[off : off + CHUNK_BYTES] = rview[H:PAYLOAD]
                        if fl & F_OVERFLOW:
                            flag[i] = 1
                        src[i] = 1
                    elif partial is not None:
                        partial[off : off + CHUNK_BYTES] = rview[H:PAYLOAD]
                        if fl & F_OVERFLOW:
                            pflag[i] = 1
                    samples += 1
                    if samples & 3 == 0 and i not in tries:  # every 4th: the RTO needs no more
                        self._update_rto(mono() - sent_at[i])
                else:
                    self._other_datagram(rbuf, n, seg, rack)
            now = mono()
            if progressed:
                last_progress = now
            # 3. retransmit what timed out (exponential backoff per chunk)
            while True:
                if fresh and fresh[0][0] <= now and (not retry or fresh[0][0] <= retry[0][0]):
                    due = fresh
                elif retry and retry[0][0] <= now:
                    due = retry
                else:
                    break
                if pace:
                    if now < self._pace_next:
                        break
                    self._pace_next = max(self._pace_next, now - 8 * pace) + pace
                _, i = due.popleft() if due is fresh else heapq.heappop(retry)
                if got[i]:
                    continue
                k = tries.get(i, 0) + 1
                tries[i] = k
                off = (i - i0) * PAYLOAD
                pkt = bytearray(pkts[off : off + PAYLOAD])
                pkt[1] = F_RETRANSMIT
                try:
                    sock.sendto(pkt, addr)
                except (BlockingIOError, ConnectionRefusedError):
                    pass
                last_tx[i] = now
                stats.retransmits += 1
                heapq.heappush(retry, (now + min(self._rto * (1 << min(k, 3)), opts.rto_max), i))
            if now - last_progress > opts.op_timeout:
                first = got.find(0)
                raise AgentTimeout(
                    f"worker {wid}: no result from switch {rack.switch} at {addr[0]}:{addr[1]} for {opts.op_timeout}s "
                    f"(job {job}, generation {gen}, chunk {a + (first if first >= 0 else K)})")
            wait = 0.05
            if nxt < K and (nxt - S < i0 or got[nxt - S]):
                if not guard or nxt - S < i0:
                    wait = self._pace_next - now if pace else 0.0
                else:
                    wait = max(last_tx[nxt - S] + guard, self._pace_next if pace else 0.0) - now
                if wait <= 0:
                    continue
            if progressed:
                continue
            # 4. wait for a datagram or the next timer (short, so a generation change is seen quickly)
            timers = [t[0][0] for t in (fresh, retry) if t]
            if timers:
                wait = min(wait, max(min(timers) - now, self._pace_next - now if pace else 0.0))
            poll.poll(wait * 1000.0)
        if guard and sent:
            self._guard_until = max(last_tx) + guard
        stats.packets_sent += sent
        stats.results += K - i0
        return (partial, pflag) if partial is not None else None

    def _other_datagram(self, rbuf: bytearray, n: int, seg: _Segment | None, rack: Rack | None) -> None:
        """Anything but a RESULT: Rina broadcasts (rack workers) and repair requests (representatives)."""
        if n == PAYLOAD and rbuf[0] == BROADCAST:
            mt, fl, jid, g, _slot, seq, _w, _last = _HDR.unpack_from(rbuf, 0)
            if jid != self.job_id or g != self._generation:
                self.stats.stale += 1
                return
            if seg is None or self._plan.is_representative(self.worker_id):
                self.stats.ignored += 1
                return
            i = (seq - seg.a) & 0xFFFFFFFF
            if i >= seg.K or seg.src[i]:
                self.stats.ignored += 1
                return
            off = i * CHUNK_BYTES
            seg.res32[off : off + CHUNK_BYTES] = rbuf[wire.INA_HEADER_LEN : PAYLOAD]
            seg.flag[i] = 1 if fl & F_OVERFLOW else 0
            seg.src[i] = 1
            return
        if n >= _NACK.size and rbuf[:4] == _NACK_MAGIC:
            self._on_nack(rbuf, n)
            return
        self.stats.ignored += 1

    def _drain_idle(self) -> None:
        while True:
            try:
                n = self.sock.recv_into(self._rbuf)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                continue
            if n >= _NACK.size and self._rbuf[:4] == _NACK_MAGIC:
                self._on_nack(self._rbuf, n)
            else:
                self.stats.ignored += 1

    # ------------------------------------------------------------------ ring

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
                               connect_timeout=self.options.connect_timeout)
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
            raise _Interrupted()
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
                raise _Interrupted() from exc
            if self._released:
                raise JobReleased("the controller released the job") from exc
            time.sleep(0.005)
        raise AgentError(f"worker {self.worker_id}: ring all-reduce failed: {exc}") from exc

    def _ring_segment(self, seg: _Segment, i0: int, members: tuple[int, ...], data: np.ndarray,
                      chunk_flags: np.ndarray | None, *, rina: bool) -> None:
        """All-reduce ``data`` (this member's int32 rows for seg[i0:]) over the ring of ``members``.

        The ring adds int32. Each member appends ceil(max|x| / 64); if those add up to 2**25 or more
        an int32 sum might have wrapped, and every member (seeing the same total) redoes the op in int64.
        Rina ops also carry per-chunk overflow counts of the racks' partial sums. Results are exact.
        """
        self._check_interrupt()
        ring = self._ring(members)
        K = data.shape[0]
        flat = data.reshape(-1)
        extra = (K if rina else 0) + 1
        payload = np.empty(flat.size + extra, dtype=np.int32)
        payload[: flat.size] = flat
        if rina:
            payload[flat.size : flat.size + K] = chunk_flags
        if flat.size:
            peak = max(int(flat.max()), -int(flat.min()))
        else:
            peak = 0
        payload[-1] = -(-peak >> _BOUND_SHIFT) if peak else 0
        try:
            out = ring.allreduce(payload)
            self.stats.ring_ops += 1
            sums = out[: flat.size]  # int32: exact unless the bound says a sum might have wrapped
            if int(out[-1]) >= _BOUND_LIMIT:
                sums = ring.allreduce(flat.astype(np.int64))
                self.stats.ring_redo_int64 += 1
                self.stats.ring_ops += 1
        except RingError as exc:
            self._ring_failed(exc)
        sums = sums.reshape(K, LANES)
        flags = None
        if rina:
            flags = (out[flat.size : flat.size + K] > 0) | ((sums > 2**31 - 1) | (sums < -(2**31))).any(axis=1)
        seg.put_ring(i0, sums, flags)

    # ------------------------------------------------------------------ Rina: broadcast and repair

    def _broadcast(self, seg: _Segment, i0: int, rack: Rack) -> None:
        """Representative: send the global sums of seg[i0:] into the rack (BROADCAST), paced by the rack's acks."""
        members = rack.worker_ids[1:]
        if not members:
            return
        K, a = seg.K, seg.a
        wrapped = seg.resr[i0:].astype(np.int32).astype(_BE).tobytes()
        job, gen, wid = self.job_id, self._generation, self.worker_id
        window = self.options.broadcast_window
        nxt = i0
        deadline = time.monotonic() + self.options.op_timeout
        while nxt < K:
            self._check_interrupt()
            low = min(self._acks.get(w, 0) for w in members)
            burst = 0
            while nxt < K and a + nxt < low + window:
                off = (nxt - i0) * CHUNK_BYTES
                fl = F_OVERFLOW if seg.flag[nxt] else 0
                pkt = _HDR.pack(BROADCAST, fl, job, gen, 0, (a + nxt) & 0xFFFFFFFF, wid, 0) + wrapped[off : off + CHUNK_BYTES]
                self._bstore[a + nxt] = pkt
                try:
                    self.sock.sendto(pkt, rack.address)
                except (BlockingIOError, ConnectionRefusedError):
                    pass
                self.stats.broadcasts_sent += 1
                nxt += 1
                burst += 1
            if nxt >= K:
                break
            if burst:
                deadline = time.monotonic() + self.options.op_timeout
            elif time.monotonic() > deadline:
                raise AgentTimeout(f"worker {wid}: rack workers {list(members)} acknowledged nothing for "
                                   f"{self.options.op_timeout}s")
            if self._poll.poll(20):
                self._drain_idle()

    def _on_nack(self, rbuf: bytearray, n: int) -> None:
        magic, job, gen, worker, cum = _NACK.unpack_from(rbuf, 0)
        if job != self.job_id or gen != self._generation:
            self.stats.stale += 1
            return
        if cum > self._acks.get(worker, 0):
            self._acks[worker] = cum
        bits = rbuf[_NACK.size : n]
        rack = self._plan.rack_of(self.worker_id)
        if rack is None:
            return
        if bits:
            self.stats.nacks_served += 1
            for byte_i, byte in enumerate(bits):
                if not byte:
                    continue
                for bit in range(8):
                    if byte >> bit & 1:
                        pkt = self._bstore.get(cum + byte_i * 8 + bit)
                        if pkt is not None:
                            try:
                                self.sock.sendto(pkt, rack.address)
                            except (BlockingIOError, ConnectionRefusedError):
                                pass
        low = min((self._acks.get(w, 0) for w in rack.worker_ids[1:]), default=0)
        if self._bstore and min(self._bstore) < low:
            for c in [c for c in self._bstore if c < low]:
                del self._bstore[c]

    def _send_nack(self, rack: Rack, cum: int, missing: bytes = b"") -> None:
        pkt = _NACK.pack(_NACK_MAGIC, self.job_id, self._generation, self.worker_id, cum) + missing
        try:
            self.sock.sendto(pkt, self.workers[rack.representative].address)
        except (BlockingIOError, ConnectionRefusedError):
            pass

    def _await_globals(self, seg: _Segment, i0: int, rack: Rack) -> None:
        """Rack worker: wait for the representative's BROADCASTs of seg[i0:]; ack progress, ask for gaps."""
        opts = self.options
        K, a = seg.K, seg.a
        ack_every = max(1, opts.broadcast_window // 4)
        acked = a + i0
        wait = self._rto
        mono = time.monotonic
        last_progress = mono()
        next_nack = last_progress + wait
        while True:
            first = seg.first_missing(i0)
            if first < 0:
                for _ in range(2):  # unreliable; a later ack or request covers a lost one
                    self._send_nack(rack, a + K)
                return
            if a + first - acked >= ack_every:
                acked = a + first
                self._send_nack(rack, acked)
            self._check_interrupt()
            now = mono()
            if now >= next_nack:
                bitmap = np.frombuffer(seg.src, dtype=np.uint8)[first : first + _NACK_BITS] == 0
                self._send_nack(rack, a + first, np.packbits(bitmap, bitorder="little").tobytes())
                self.stats.nacks_sent += 1
                wait = min(wait * 2, opts.rto_max)
                next_nack = now + wait
            if now - last_progress > opts.op_timeout:
                raise AgentTimeout(f"worker {self.worker_id}: no global result from representative "
                                   f"{rack.representative} for {opts.op_timeout}s (chunk {a + first})")
            if self._poll.poll(max(min(next_nack - now, 0.05), 0) * 1000.0):
                before = first
                while True:
                    try:
                        n = self.sock.recv_into(self._rbuf)
                    except (BlockingIOError, InterruptedError):
                        break
                    except ConnectionRefusedError:
                        continue
                    if n == PAYLOAD and self._rbuf[0] == RESULT:
                        self.stats.ignored += 1
                    else:
                        self._other_datagram(self._rbuf, n, seg, rack)
                if seg.first_missing(i0) != before:
                    last_progress = mono()
                    wait = self._rto
                    next_nack = last_progress + wait

