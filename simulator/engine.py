"""Discrete-event simulation of jobs sharing a cluster's workers, links and INA switch memory.

Events are job arrivals and completions on a heap. On every event the affected switches' slot pools
are re-allocated by the controller's own policy classes (:mod:`controller.policies`, called exactly as
the controller calls them), and every job whose slots or cross-rack bandwidth changed gets a new
iteration time from that moment on. Progress is tracked as fractional iterations: a job's remaining
iterations drop by elapsed / iteration_time at each change, and its completion event is rescheduled.

What an event costs does not grow with the jobs it leaves alone: waiting jobs are indexed by size
(simulator.waiting), placements work on the racks' arrays at once (simulator.placement), a job's slot request
is computed once per job shape, and only the jobs whose slots or uplink share changed are retimed (on a shared
switch, whose load every job there sees, every job holding slots there).
"""
from __future__ import annotations

import heapq
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.policies import AllocationPolicy, JobDemand, SlotRange, validate_allocation
from inaproto.backends import SimBackend
from simulator import model, shared_switch
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.errors import SimulatorError
from simulator.placement import Placement, PlacementPolicy, RackView
from simulator.trace import JobSpec
from simulator.waiting import WaitingQueue

__all__ = ["InvariantError", "JobResult", "SimResult", "Simulation"]

# Events of running jobs: a completion, the end of a start-up (trace column startup_s: the job starts sending, which
# matters to a shared switch). At equal times completions come first (freed workers are reusable), arrivals last.
_DONE, _READY = 0, 1
# Backends a job can run on: no communication (one worker), INA in one ToR, Rina, a two-level tree, plain ring.
_LOCAL, _INA, _RINA, _TREE, _RING = SimBackend.LOCAL, SimBackend.INA, SimBackend.RINA, SimBackend.TREE, SimBackend.RING
_AGGREGATING = frozenset((_INA, _RINA, _TREE))


class InvariantError(SimulatorError, AssertionError):
    """The simulation reached an impossible state (a bug, never bad input)."""


@dataclass(frozen=True)
class JobResult:
    """One job's outcome. history: (time, backend, slots) at start and at every change; slots is the
    job's bottleneck slot count (the smallest over the racks it aggregates in), 0 off INA."""

    job_id: int
    arrival_s: float
    start_s: float
    finish_s: float
    num_workers: int
    racks: int
    priority: int
    deadline_s: float | None
    slots_requested: int  # per switch; 0 = the job asked for none (INA could not beat ring)
    range_changes: int  # times a policy moved or resized one of its ranges after the first
    history: tuple[tuple[float, str, int], ...]
    uplink_bytes: float = 0.0  # bytes its all-reduces put on one of its rack uplinks, each direction, in total

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def deadline_missed(self) -> bool | None:
        return None if self.deadline_s is None else self.jct_s > self.deadline_s + 1e-9

    def backend_seconds(self) -> dict[str, float]:
        """Run time spent on each backend."""
        out: dict[str, float] = {}
        bounds = [t for t, _, _ in self.history[1:]] + [self.finish_s]
        for (t, backend, _), end in zip(self.history, bounds):
            out[backend] = out.get(backend, 0.0) + (end - t)
        return out


@dataclass
class SimResult:
    """Everything one run produced; simulator.report turns it into CSV, JSON and plots."""

    policy: str
    placement: str
    cluster: ClusterSpec
    jobs: list[JobResult]
    # Step functions sampled at every change: (time, ToR slots held, ToR slots held by jobs aggregating,
    # busy workers, spine slots held).
    timeline: list[tuple[float, int, int, int, int]]
    events: int
    wall_s: float
    unfinished: int = 0


class _Switch:
    __slots__ = ("alloc", "demands", "held", "pool")

    def __init__(self, pool: int) -> None:
        self.pool = pool
        self.demands: list[JobDemand] = []  # admission order
        self.alloc: dict[int, SlotRange | None] = {}
        self.held = 0


class _Job:
    __slots__ = (
        "backend",
        "bound",
        "changes",
        "comm",
        "compute",
        "counts",
        "cross",
        "demand_racks",
        "effective",
        "history",
        "iter_time",
        "last",
        "on_spine",
        "path_rtt",
        "placement",
        "racks",
        "ready",
        "ready_at",
        "remaining",
        "requested",
        "ring_from",
        "slots",
        "spec",
        "start",
        "uplink",
        "uplink_per_iter",
        "version",
    )

    def __init__(self, spec: JobSpec, placement: Placement, start: float, compute: float) -> None:
        self.spec = spec
        self.placement = placement
        self.racks = [r for r, _ in placement]
        self.counts = dict(placement)  # workers per rack
        self.ready = spec.startup_s <= 0  # past its start-up: offers packets to its switches
        self.path_rtt: dict[int, float] = {}  # per shared switch: the shortest round trip seen (congestion window)
        self.ready_at = start + spec.startup_s
        self.on_spine = False  # registered at the spine's pool (a tree is possible)
        self.uplink = 0.0  # uplink bytes so far (per rack uplink, each direction)
        self.uplink_per_iter = 0.0
        self.start = start
        self.remaining = float(spec.iterations)
        self.iter_time = 0.0
        self.last = start
        self.version = 0
        self.compute = compute
        self.demand_racks: list[int] = []  # racks where the job asked for slots
        self.cross = len(placement) > 1  # traffic leaves its racks: shares their uplinks
        self.bound = 0  # the most multi-rack jobs on one of its uplinks, where that many bound its rate (else 0)
        self.comm = 0.0  # all-reduce seconds when last retimed
        self.backend = ""
        self.slots = 0
        self.effective = 0  # slots held while actually aggregating (INA/Rina backend)
        self.history: list[tuple[float, str, int]] = []
        self.requested = 0
        self.changes = 0
        self.ring_from = 0.0  # iterations done when the job last went onto the ring (its ring op began there or later)


class Simulation:
    """One policy, one placement, one cluster: feed it a trace with :meth:`run`.

    Args:
        cluster: racks, workers, slot pools and link speeds.
        calibration: time-model constants.
        policy: a controller allocation policy (any :class:`AllocationPolicy`).
        placement: where jobs' workers go.
        data_split: ``equal`` or ``proportional`` compute split for heterogeneous workers.
        queue: ``backfill`` (start any waiting job that fits, in arrival order) or ``fifo`` (strict).
        follow_grant: a job holding slots aggregates in-network even where ring would be faster (as
            ``ina-agent --backend auto`` does); default: each job takes the faster of ring and INA/Rina.
        check: validate every switch's allocation and the worker count after every event.
        on_event: called as on_event(sim, time) after every event (tests hook invariant checks here).
        progress: seconds between progress lines on stderr; None = silent.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        calibration: Calibration,
        policy: AllocationPolicy,
        placement: PlacementPolicy,
        *,
        data_split: str = "equal",
        queue: str = "backfill",
        follow_grant: bool = False,
        check: bool = False,
        on_event: Callable[[Simulation, float], None] | None = None,
        progress: float | None = None,
    ) -> None:
        if queue not in ("backfill", "fifo"):
            raise ValueError(f"unknown queue discipline {queue!r}; valid: backfill, fifo")
        model.compute_time((1.0, 2.0), data_split)  # rejects unknown splits early
        self.cluster = cluster
        self.cal = calibration
        self.policy = policy
        self.placer = placement
        self.data_split = data_split
        self.queue_mode = queue
        self.follow_grant = follow_grant
        self.check = check
        self.on_event = on_event
        self.progress = progress
        self.ina = cluster.ina_racks()
        self.any_ina = any(self.ina)
        # One switch per rack (its ToR), then the spine: switch index cluster.racks.
        self.switches = [_Switch(cluster.slots_per_switch if ina else 0) for ina in self.ina]
        self.switches.append(_Switch(cluster.spine_slots))
        self.spine = cluster.racks
        self.spine_held = 0
        self.view = RackView(
            free_workers=[cluster.workers_per_rack] * cluster.racks,
            ina=self.ina,
            free_slots=[sw.pool for sw in self.switches[: cluster.racks]],
            slot_jobs=[0] * cluster.racks,
            spine_free_slots=cluster.spine_slots,
        )
        self.cross_jobs: list[set[int]] = [set() for _ in range(cluster.racks)]  # multi-rack jobs per rack
        self.running: dict[int, _Job] = {}
        self.now = 0.0
        self.held_total = 0
        self.effective_total = 0
        # Uncontended rates and the unloaded window round trip, fixed for the run.
        self.host_ring_rate = cluster.host_Bps * calibration.ring_goodput_fraction
        self.uplink_rate = cluster.uplink_Bps * calibration.ring_goodput_fraction
        self.window = model.window_rtt(calibration, cluster.host_Bps)
        self.exposed = 1.0 - calibration.comm_overlap  # the share of communication not hidden behind compute
        self.pause = calibration.realloc_pause_s
        self.shared = calibration.switch_shared_pps is not None  # every job at a switch sees the others' load
        self.unbound_sharing = self._unbound_sharing()
        self.requests: dict[tuple, tuple[int, int] | None] = {}  # _slot_request by job shape
        self.ring_times: dict[tuple[int, int, float], float] = {}  # _ring_time

    # --- public -------------------------------------------------------------------------------------

    def run(self, jobs: Sequence[JobSpec]) -> SimResult:
        started = time.perf_counter()
        too_big = [j.job_id for j in jobs if j.num_workers > self.cluster.total_workers]
        if too_big:
            raise ValueError(
                f"job(s) {too_big[:5]} need more workers than the cluster has ({self.cluster.total_workers})"
            )
        if len({j.job_id for j in jobs}) != len(jobs):
            raise ValueError("job ids in the trace are not unique")
        # Arrivals in order of (time, trace position), beside a heap of the running jobs' events: an arrival comes after
        # every event of that heap at its instant.
        arrivals = sorted(range(len(jobs)), key=lambda k: jobs[k].arrival_s)
        heap: list[tuple[float, int, int, int, int]] = []
        self._heap = heap
        self._seq = len(jobs)
        self.waiting = WaitingQueue()
        self.results: list[JobResult] = []
        self.timeline: list[tuple[float, int, int, int, int]] = [(0.0, 0, 0, 0, 0)]
        events = 0
        next_arrival = 0
        next_report = started + self.progress if self.progress else math.inf
        while heap or next_arrival < len(arrivals):
            arriving = jobs[arrivals[next_arrival]] if next_arrival < len(arrivals) else None
            if arriving is not None and (not heap or heap[0][0] > arriving.arrival_s):
                next_arrival += 1
                self.now = t = arriving.arrival_s
                self.waiting.push(arriving)
            else:
                t, kind, _, job_id, version = heapq.heappop(heap)
                job = self.running.get(job_id)
                if job is None or (job.version != version if kind == _DONE else job.ready):
                    continue  # superseded by a later rate change, or gone
                self.now = t
                if kind == _DONE:
                    self._finish(job, t)
                else:
                    self._ready(job, t)
            self._schedule(t)
            self._sample(t)
            events += 1
            if self.check:
                self.check_invariants()
            if self.on_event is not None:
                self.on_event(self, t)
            if events & 1023 == 0 and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + self.progress
                print(
                    f"[ina-sim] {self.policy.name}: {len(self.results)}/{len(jobs)} jobs done, "
                    f"{len(self.running)} running, {len(self.waiting)} waiting, simulated t={t:,.0f} s, "
                    f"{time.perf_counter() - started:.1f} s elapsed",
                    file=sys.stderr,
                    flush=True,
                )
        self.results.sort(key=lambda r: r.job_id)
        return SimResult(
            policy=self.policy.name,
            placement=self.placer.name,
            cluster=self.cluster,
            jobs=self.results,
            timeline=self.timeline,
            events=events,
            wall_s=time.perf_counter() - started,
            unfinished=len(self.waiting) + len(self.running),
        )

    def _ready(self, job: _Job, t: float) -> None:
        """The job's start-up is over: it sends from now on (on a shared switch, a load every job there sees)."""
        job.ready = True
        if self.shared:
            shared = [*job.demand_racks, self.spine] if job.on_spine else job.demand_racks
            self._reallocate_and_retime([], [], t, shared=shared)

    def check_invariants(self) -> None:
        """Raise InvariantError if any switch is over-allocated or any rack has negative free workers."""
        for rack, sw in enumerate(self.switches):
            try:
                validate_allocation(sw.pool, sw.demands, sw.alloc)
            except ValueError as exc:
                raise InvariantError(f"t={self.now}: switch {rack}: {exc}") from None
            held = sum(r.size for r in sw.alloc.values() if r is not None)
            free = self.view.spine_free_slots if rack == self.spine else self.view.free_slots[rack]
            if held != sw.held or held > sw.pool or free != sw.pool - held:
                raise InvariantError(f"t={self.now}: switch {rack}: {held} slots held of {sw.pool}, bookkeeping off")
        busy = sum(c for job in self.running.values() for _, c in job.placement)
        if any(f < 0 for f in self.view.free_workers) or busy + sum(self.view.free_workers) != self.cluster.total_workers:
            raise InvariantError(f"t={self.now}: worker accounting off")

    # --- events -------------------------------------------------------------------------------------

    def _schedule(self, t: float) -> None:
        """Start waiting jobs, in arrival order, while workers are free (fifo: stop at the first that waits)."""
        if self.view.free_total < self.waiting.smallest():
            return

        def start(spec: JobSpec) -> bool:
            placement = self.placer.place(spec.num_workers, self.view, self._slot_hint(spec))
            if placement is None:
                return False
            self._start(spec, placement, t)
            return True

        self.waiting.start_fitting(lambda: self.view.free_total, start, fifo=self.queue_mode == "fifo")

    def _start(self, spec: JobSpec, placement: Placement, t: float) -> None:
        if sum(c for _, c in placement) != spec.num_workers or len({r for r, _ in placement}) != len(placement):
            raise InvariantError(f"placement {placement} does not hold job {spec.job_id}'s {spec.num_workers} workers")
        job = _Job(spec, placement, t, model.compute_time(spec.per_worker_compute(), self.data_split))
        job.last = t + spec.startup_s  # start-up: holds workers and slots, no progress yet
        if not job.ready:
            self._seq += 1
            heapq.heappush(self._heap, (job.last, _READY, self._seq, spec.job_id, 0))
        self.running[spec.job_id] = job
        for rack, count in placement:
            if count > self.view.free_workers[rack]:
                raise InvariantError(f"placement put {count} workers on rack {rack} with {self.view.free_workers[rack]} free")
            self.view.take_workers(rack, count)
        touched = self._register_demands(job)
        uplinks = job.racks if job.cross else []
        for rack in uplinks:
            self.cross_jobs[rack].add(spec.job_id)
        if job.cross:
            job.bound = self._binding(self._uplink_sharing(job))
        self._reallocate_and_retime(touched, uplinks, t, extra=job)

    def _finish(self, job: _Job, t: float) -> None:
        spec = job.spec
        del self.running[spec.job_id]
        for rack, count in job.placement:
            self.view.take_workers(rack, -count)
        self._set_effective(job, 0)
        for rack in job.demand_racks:
            sw = self.switches[rack]
            sw.demands = [d for d in sw.demands if d.job_id != spec.job_id]
            sw.alloc.pop(spec.job_id, None)
            self.view.add_slot_job(rack, -1)
        touched = list(job.demand_racks)
        if job.on_spine:
            spine = self.switches[self.spine]
            spine.demands = [d for d in spine.demands if d.job_id != spec.job_id]
            spine.alloc.pop(spec.job_id, None)
            touched.append(self.spine)
        if job.iter_time > 0:
            job.uplink += job.remaining * job.uplink_per_iter
        uplinks = job.racks if job.cross else []
        for rack in uplinks:
            self.cross_jobs[rack].discard(spec.job_id)
        job.history.append((t, "done", 0))
        self.results.append(
            JobResult(
                job_id=spec.job_id,
                arrival_s=spec.arrival_s,
                start_s=job.start,
                finish_s=t,
                num_workers=spec.num_workers,
                racks=len(job.placement),
                priority=spec.priority,
                deadline_s=spec.deadline_s,
                slots_requested=job.requested,
                range_changes=job.changes,
                history=tuple(job.history[:-1]),
                uplink_bytes=job.uplink,
            )
        )
        self._reallocate_and_retime(touched, uplinks, t, uplink_change=-1)

    # --- slots, rates, progress -----------------------------------------------------------------------

    def _slot_request(self, spec: JobSpec, racks: int, widest: int, tree: bool = False) -> tuple[int, int] | None:
        """(requested, min_slots) per switch for a job spread over `racks` racks with at most `widest`
        workers under one ToR; None when INA/Rina cannot beat ring even with the whole request.

        requested = the trace's `slots`, else the window that saturates the job's INA rate (uncontended);
        min_slots = the trace's, else the fewest slots with which INA/Rina is no slower than ring.
        tree: the job spans racks and the spine aggregates: sized for the tree (its longer round trip), and every
        switch of the tree is asked for the same. Computed once per job shape (a trace has few).
        """
        shape = (spec.grad_bytes, spec.num_workers, spec.slots, spec.min_slots, racks, widest, tree)
        if shape not in self.requests:
            self.requests[shape] = self._compute_slot_request(spec, racks, widest, tree)
        return self.requests[shape]

    def _compute_slot_request(self, spec: JobSpec, racks: int, widest: int, tree: bool) -> tuple[int, int] | None:
        cal, cluster = self.cal, self.cluster
        cross = racks > 1
        cross_rate = min(self.host_ring_rate, self.uplink_rate) if cross else math.inf
        ring = model.ring_time(cal, spec.grad_bytes, spec.num_workers, min(self.host_ring_rate, cross_rate))

        window = model.tree_window_rtt(cal, cluster.host_Bps, cluster.uplink_Bps) if tree else None
        uplink_rate = cluster.uplink_Bps * cal.ina_efficiency

        def slot_time(s: int) -> float:
            if tree:
                rate = min(uplink_rate, model.ina_rate(cal, cluster.host_Bps, s, max(widest, racks), window))
                return model.tree_time(cal, spec.grad_bytes, rate)
            rate = min(cross_rate, model.ina_rate(cal, cluster.host_Bps, s, widest))
            return model.rina_time(cal, spec.grad_bytes, racks, rate)

        if spec.slots is not None:
            return spec.slots, spec.min_slots or 1
        cap = model.ina_rate(cal, cluster.host_Bps, 1 << 40, max(widest, racks) if tree else widest)  # no window exceeds it
        if tree:
            requested = max(1, math.ceil(min(cap, uplink_rate) * window / cal.payload_bytes - 1e-9))
        else:
            requested = model.saturating_slots(cal, min(cap, cross_rate), cluster.host_Bps)
        useful = model.min_useful_slots(cal, requested, slot_time, ring)
        if useful is None:
            return None
        return requested, min(requested, spec.min_slots if spec.min_slots is not None else useful)

    def _slot_hint(self, spec: JobSpec) -> int:
        """What the job would ask each switch for if placed as tightly as possible (for placements)."""
        if spec.num_workers < 2 or not self.any_ina:
            return 0
        wpr = self.cluster.workers_per_rack
        racks = -(-spec.num_workers // wpr)
        request = self._slot_request(spec, racks, min(spec.num_workers, wpr))
        return 0 if request is None else request[0]

    def _register_demands(self, job: _Job) -> list[int]:
        """Ask for slots in each INA rack where the job has >= 2 workers (and at the spine for a job spanning racks
        when the spine aggregates), if INA/Rina/tree can beat ring there. A rack with one of the job's workers
        needs no ToR slots: that worker joins the ring (Rina) or sends straight to the spine (tree)."""
        spec = job.spec
        if spec.num_workers < 2:
            return []
        aggregating = [(r, c) for r, c in job.placement if c >= 2]
        tree = job.cross and self.switches[self.spine].pool > 0
        if (not aggregating and not tree) or not all(self.ina[r] for r, _ in aggregating):
            return []  # some rack's share of the job cannot be aggregated in-network: ring it is
        request = self._slot_request(spec, len(job.placement), max((c for _, c in aggregating), default=1), tree=tree)
        if request is None:
            return []
        requested, min_slots = request
        job.requested = requested
        job.demand_racks = [r for r, _ in aggregating]
        demand = JobDemand(spec.job_id, requested, priority=spec.priority, weight=spec.weight, min_slots=min_slots)
        for rack in job.demand_racks:  # the same demand (a value) at every switch
            self.switches[rack].demands.append(demand)
            self.view.add_slot_job(rack, 1)
        if tree:  # the spine is asked for as many slots as every ToR of the tree
            self.switches[self.spine].demands.append(demand)
            job.on_spine = True
            job.counts[self.spine] = len(job.placement)  # the spine aggregates one partial per rack
            return [*job.demand_racks, self.spine]
        return job.demand_racks

    def _reallocate_and_retime(self, racks: Sequence[int], uplinks: Sequence[int], t: float, extra: _Job | None = None,
                               shared: Sequence[int] = (), uplink_change: int = 1) -> None:
        """Re-allocate the switches of `racks`, then retime `extra` (a job that starts), every job whose slots changed,
        every multi-rack job on `uplinks` (whose count of multi-rack jobs changed by `uplink_change` each) whose
        uplink share bounds its rate differently, and (with a shared switch packet rate) every job on `uplinks` and
        every job holding slots at `racks` or `shared`."""
        affected: dict[int, _Job] = {}
        if extra is not None:
            affected[extra.spec.job_id] = extra
        for rack in racks:
            self._reallocate(rack, t, affected)
        for rack in uplinks:
            self._share_uplink(rack, uplink_change, extra, affected)
        if self.shared:
            for rack in (*racks, *shared):  # a job's share of the switch changes when any other's load does
                for job_id, rng in self.switches[rack].alloc.items():
                    if rng is not None:
                        affected.setdefault(job_id, self.running[job_id])
        for job in affected.values():
            self._retime(job, t)

    def _reallocate(self, rack: int, t: float, changed: dict[int, _Job]) -> None:
        """The policy's new allocation of switch `rack`; the jobs whose range it changed go into `changed`."""
        sw = self.switches[rack]
        current = {k: v for k, v in sw.alloc.items() if v is not None}
        new = self.policy.allocate(sw.pool, sw.demands, current)
        if self.check:
            try:
                validate_allocation(sw.pool, sw.demands, new)
            except ValueError as exc:
                raise InvariantError(f"t={t}: policy {self.policy.name} on switch {rack}: {exc}") from None
        held = 0
        for job_id, rng in new.items():
            if rng is not None:
                held += rng.size
            old = sw.alloc.get(job_id)
            if rng is not old:
                job = self.running[job_id]
                if old is not None:
                    job.changes += 1
                changed[job_id] = job
        sw.alloc = new
        if rack == self.spine:
            self.spine_held = held
            self.view.spine_free_slots = sw.pool - held
        else:
            self.held_total += held - sw.held
            self.view.set_free_slots(rack, sw.pool - held)
        sw.held = held

    def _share_uplink(self, rack: int, change: int, extra: _Job | None, affected: dict[int, _Job]) -> None:
        """Rack `rack`'s uplink has `change` more multi-rack jobs: update the bound of every other job on it, and put
        those whose bound changed (on a shared switch: all of them) into `affected`."""
        now = len(self.cross_jobs[rack])
        before = now - change
        if max(now, before) <= self.unbound_sharing and not self.shared:
            return  # the rack's uplink bounds no job's rate, before or after
        for job_id in self.cross_jobs[rack]:
            job = self.running[job_id]
            if job is extra:
                continue
            if now > job.bound and now > self.unbound_sharing:
                job.bound = now
                affected.setdefault(job_id, job)
            elif before == job.bound and now < before:  # the busiest uplink lost one: which is busiest now?
                job.bound = self._binding(self._uplink_sharing(job))
                if job.bound != before:
                    affected.setdefault(job_id, job)
            if self.shared:
                affected.setdefault(job_id, job)

    def _uplink_sharing(self, job: _Job) -> int:
        """The most multi-rack jobs on any of `job`'s rack uplinks: its fair share of them is uplink / this."""
        return max(map(len, map(self.cross_jobs.__getitem__, job.racks)))

    def _unbound_sharing(self) -> int:
        """The most jobs that can share an uplink while each one's share is at least the host link's rate: up to
        this many, the uplink bounds neither a ring (uplink / k against the host's ring goodput) nor a tree
        (uplink / k framed, against the host's INA goodput), so a change among them changes no job's rate."""
        host, uplink, eff = self.cluster.host_Bps, self.cluster.uplink_Bps, self.cal.ina_efficiency
        k = 0
        while self.uplink_rate / (k + 1) >= self.host_ring_rate and uplink / (k + 1) * eff >= host * eff:
            k += 1
        return k

    def _binding(self, sharing: int) -> int:
        """The uplink sharing as far as it can bound a job's rate (0: it cannot)."""
        return sharing if sharing > self.unbound_sharing else 0

    def _comm(self, job: _Job) -> tuple[float, str, int]:
        """(all-reduce seconds, backend, bottleneck slots): the fastest backend available to the job now."""
        spec = job.spec
        n = spec.num_workers
        if n < 2:
            return 0.0, _LOCAL, 0
        rate = self.host_ring_rate
        if job.bound:
            rate = min(rate, self.uplink_rate / job.bound)
        best = (self._ring_time(spec.grad_bytes, n, rate), _RING, 0)
        if not (job.demand_racks or job.on_spine):
            return best
        cal, host, alloc = self.cal, self.cluster.host_Bps, self.switches
        held = [alloc[rack].alloc.get(spec.job_id) for rack in job.demand_racks]
        slots = min((0 if r is None else r.size for r in held), default=None)
        candidate = None
        if slots:
            ina_rate = math.inf
            for rack, rng in zip(job.demand_racks, held):
                window = model.window_rtt(cal, host, self._switch_stretch(rack, job)) if self.shared else self.window
                ina_rate = min(ina_rate, model.ina_rate(cal, host, rng.size, job.counts[rack], window))
            if job.cross:
                candidate = (model.rina_time(cal, spec.grad_bytes, len(job.placement), min(rate, ina_rate)), _RINA, slots)
            else:
                candidate = (model.ina_time(cal, spec.grad_bytes, ina_rate), _INA, slots)
        tree = self._tree(job, slots)
        if tree is not None and (candidate is None or tree[0] <= candidate[0] or self.follow_grant):
            candidate = tree
        if candidate is not None and (candidate[0] <= best[0] or self.follow_grant):
            best = candidate
        return best

    def _ring_time(self, nbytes: int, workers: int, rate: float) -> float:
        """model.ring_time, remembered per (gradient, workers, rate): a trace has few of each."""
        key = (nbytes, workers, rate)
        seconds = self.ring_times.get(key)
        if seconds is None:
            seconds = self.ring_times[key] = model.ring_time(self.cal, nbytes, workers, rate)
        return seconds

    def _tree(self, job: _Job, tor_slots: int | None) -> tuple[float, str, int] | None:
        """(all-reduce seconds, tree, bottleneck slots) when the job holds slots on the spine too, else None.

        Every switch of the tree serves the same window (the smallest grant among them), held for the tree's
        round trip; the spine aggregates one partial per rack; each rack's uplink carries one framed partial
        stream up and the final sum down, shared fairly with the rack's other multi-rack jobs."""
        if not job.on_spine:
            return None
        cal, cluster, job_id = self.cal, self.cluster, job.spec.job_id
        slots = self._held(self.spine, job_id)
        if tor_slots is not None:  # None: no rack holds >= 2 of its workers, only the spine aggregates
            slots = min(slots, tor_slots)
        if slots <= 0:
            return None
        switches = [*((r, c) for r, c in job.placement if c >= 2), (self.spine, len(job.placement))]
        # Each hop's software round trip stretches with its switch's load (the ToR's and the spine's).
        stretch = [self._switch_stretch(rack, job) for rack, _ in switches]
        window = model.tree_window_rtt(cal, cluster.host_Bps, cluster.uplink_Bps) + cal.ina_rtt_s * (
            max(stretch[:-1], default=1.0) - 1 + stretch[-1] - 1)
        rate = math.inf
        for rack, count in switches:
            rate = min(rate, model.ina_rate(cal, cluster.host_Bps, slots, count, window))
        if job.bound:  # its share of the busiest uplink
            rate = min(rate, cluster.uplink_Bps / job.bound * cal.ina_efficiency)
        return model.tree_time(cal, job.spec.grad_bytes, rate), _TREE, slots

    def _switch_stretch(self, rack: int, job: _Job) -> float:
        """How much a shared switch's load stretches `job`'s software round trip (1 without ``switch_shared_pps``):
        the load of every job holding slots there that has started, and of `job` itself, less what jobs in their
        start-up take there, with each job's congestion window backing off at its own delay target
        (shared_switch.shared_state). A started job remembers the shortest round trip it has seen there (its
        senders' path_rtt: what its target is set from); its first is the switch's round trip without it."""
        if self.cal.switch_shared_pps is None:
            return 1.0
        jobs, paths, earlier, mine, starting, starting_workers = [], [], [], 0, 0.0, 0
        for job_id, rng in self.switches[rack].alloc.items():
            other = self.running[job_id]
            if rng is not None and (other.ready or other is job):
                if other is job:
                    mine = len(jobs)
                elif other.ready_at < job.ready_at:
                    earlier.append(len(jobs))
                jobs.append((rng.size, other.counts.get(rack, 0)))
                paths.append(other.path_rtt.get(rack))
            elif not other.ready:  # in its start-up: it takes part of the switch (startup_load)
                m = other.counts.get(rack, 0)
                warmup = m * math.ceil(other.spec.grad_bytes / self.cal.payload_bytes) * other.spec.startup_iterations
                starting += shared_switch.startup_load(self.cal, m, other.spec.startup_s, warmup)
                starting_workers += m
        if not jobs:
            return 1.0
        host = self.cluster.host_Bps
        if starting > 0:  # what the start-up takes from the running jobs: the switch shared fairly among claimants
            offered = sum(model.offered_pps(self.cal, model.ina_rate(self.cal, host, s, m), m) for s, m in jobs)
            starting = shared_switch.startup_share(self.cal, starting, starting_workers, offered,
                                                   sum(m for _, m in jobs) + 1)  # their workers and the switch
        if not self.cal.cwnd_latecomer:  # every job's target from the unloaded path
            paths = [None] * len(jobs)
        elif job.ready and rack not in job.path_rtt:  # its first round trips: the switch as the jobs before it load it
            before = shared_switch.shared_state(self.cal, host, [jobs[k] for k in earlier], starting, [paths[k] for k in earlier])
            job.path_rtt[rack] = paths[mine] = before.rtt
        state = shared_switch.shared_state(self.cal, host, jobs, starting, paths)
        if job.ready and self.cal.cwnd_latecomer:
            job.path_rtt[rack] = min(job.path_rtt[rack], state.rtt)
        return state.stretches[mine]

    def _held(self, rack: int, job_id: int) -> int:
        rng = self.switches[rack].alloc.get(job_id)
        return 0 if rng is None else rng.size

    def _retime(self, job: _Job, t: float) -> None:
        """Bring the job's progress to `t` and reschedule its completion at its new speed, if that changed."""
        comm, backend, slots = self._comm(job)
        same_grant = backend == job.backend and slots == job.slots
        if same_grant and comm == job.comm and job.version:
            self._set_effective(job, self._effective(job, backend))  # same speed: the scheduled completion holds
            return
        job.comm = comm
        iter_time = job.compute + self.exposed * comm  # model.iteration_time
        self._advance(job, t)
        moved = not same_grant and job.backend != ""
        restarted = moved and self._move(job, backend)
        if backend == _RING and job.backend != _RING:
            job.ring_from = job.spec.iterations - job.remaining
        if moved and self.pause:
            job.last += self.pause  # SyncGeneration barrier and resend: no progress meanwhile
        if not same_grant:
            self._record(job, t, backend, slots)
        self._set_effective(job, self._effective(job, backend))
        if iter_time == job.iter_time and job.version and not (moved and self.pause) and not restarted:
            return  # same speed: the scheduled completion still holds
        job.iter_time = iter_time
        job.version += 1
        self._seq += 1
        heapq.heappush(self._heap, (job.last + job.remaining * iter_time, _DONE, self._seq, job.spec.job_id, job.version))

    @staticmethod
    def _advance(job: _Job, t: float) -> None:
        """Count the iterations (and uplink bytes) the job made since it was last retimed."""
        if job.iter_time > 0:
            elapsed = max(0.0, t - job.last) / job.iter_time
            job.uplink += min(job.remaining, elapsed) * job.uplink_per_iter
            job.remaining = max(0.0, job.remaining - elapsed)
        job.last = max(t, job.last)  # a reallocation pause still running keeps its end

    def _move(self, job: _Job, backend: str) -> bool:
        """A move off the ring aborts the ring all-reduce in flight (host_agent/ring_phases.py) when the calibration
        says so: its work since it began (after the iteration's compute, or at the move onto the ring) is lost and
        redone on the new backend. True when that took progress back."""
        if not (self.cal.ring_move_restarts_op and job.backend == _RING and backend != _RING):
            return False
        done = job.spec.iterations - job.remaining
        began = math.floor(done + 1e-9) + (job.compute / job.iter_time if job.iter_time > 0 else 0.0)
        if done > began:
            done = max(began, min(job.ring_from, done))
        restarted = job.remaining != job.spec.iterations - done
        job.remaining = job.spec.iterations - done
        return restarted

    def _record(self, job: _Job, t: float, backend: str, slots: int) -> None:
        """The job's history gets its new backend and slots (one entry per instant)."""
        if job.history and job.history[-1][0] == t:
            job.history.pop()  # superseded at the same instant (e.g. two arrivals at once)
        if not job.history or job.history[-1][1:] != (backend, slots):
            job.history.append((t, backend, slots))
        if job.cross and backend != job.backend:
            counts = [c for _, c in job.placement]
            job.uplink_per_iter = model.uplink_bytes(self.cal, backend, job.spec.grad_bytes, counts)
        job.backend, job.slots = backend, slots

    def _effective(self, job: _Job, backend: str) -> int:
        """The ToR slots the job holds while it aggregates with them (0 on ring or alone)."""
        if backend not in _AGGREGATING:
            return 0
        return sum(self._held(r, job.spec.job_id) for r in job.demand_racks)

    def _set_effective(self, job: _Job, slots: int) -> None:
        self.effective_total += slots - job.effective
        job.effective = slots

    def _sample(self, t: float) -> None:
        point = (t, self.held_total, self.effective_total, self.cluster.total_workers - self.view.free_total, self.spine_held)
        last = self.timeline[-1]
        if point[1:] != last[1:]:
            if last[0] == t:
                self.timeline[-1] = point
            else:
                self.timeline.append(point)
