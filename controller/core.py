"""The controller: jobs, their slot grants on every switch, and keeping switches, database and agents in step.

Every change of allocation (admission, release, heartbeat timeout, policy change, restart) goes through
one path, under one lock:

1. compute the new allocation with the policy (:func:`controller.memory.allocate_pools`); a job whose
   ranges change gets a new generation;
2. write the switches (``ina_worker`` entries and multicast groups, then ``ina_job`` entries with the new
   generation: from here on the switch drops the old generation's packets as ``STALE_GENERATION``);
   if a write fails the switches are put back and the request fails with nothing applied;
3. persist (one SQLite transaction);
4. push an ``AllocationEvent`` with the new grant to every ``WatchJob`` stream of each changed job;
5. serve the ``SyncGeneration`` barrier for the new generation.

Choice for a job that has no slots on a switch: its ``ina_job`` entry stays, with ``num_slots`` 0 and the
job's current generation (gradients then drop as ``SLOT_OUT_OF_RANGE`` or ``STALE_GENERATION``, counted
per job), its ``ina_worker`` entries and multicast group stay too (``BROADCAST`` still reaches the
workers). A job's entries are deleted only when it is released.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable

import grpc

from controller.auth import TRUSTED, Authority, Caller, admin_credential_path, hash_secret
from controller.barrier import GenerationBarriers
from controller.chains import chain_slots
from controller.config import ControllerConfig
from controller.errors import Refusal
from controller.memory import allocate_pools
from controller.p4entity import Schema
from controller.policies import POLICIES, AllocationPolicy, JobDemand, SlotRange, make_policy
from controller.programming import FIRST_JOB_ID, SwitchProgrammer
from controller.store import Job, Store
from controller.switch import Switch, SwitchError, SwitchOptions
from controller.topology import Topology
from controller.trees import TreeLayout, tree_layout, tree_ranges
from controller.validation import check_member_ids, validate_registration
from controller.views import job_grant, job_info, memory_map, switch_stats, wire_generation
from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.backends import Backend
from inaproto.job_entries import BindingEntry, ChainEntry, JobEntry, TransitEntry, WorkerEntry

__all__ = ["Controller", "Refusal", "Subscription"]

log = logging.getLogger(__name__)


# Tables whose entries are keyed by job id first: a repair in any of them means the job's state there was not what
# the database says (controller/programming.py writes them).
JOB_TABLES = (JobEntry.table, ChainEntry.table, TransitEntry.table, BindingEntry.table, WorkerEntry.table)


class Subscription:
    """One WatchJob stream: AllocationEvents in a queue; None after close()."""

    def __init__(self, job_id: int, worker_id: int):
        self.job_id = job_id
        self.worker_id = worker_id
        self.events: queue.Queue = queue.Queue()
        self.closed = False

    def get(self, timeout: float | None = None) -> pb.AllocationEvent | None:
        """The next event; None when the subscription is closed; raises queue.Empty on timeout."""
        return self.events.get(timeout=timeout)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.events.put(None)


class Controller:
    """Jobs, policy and switches of one controller instance. All public methods are thread-safe."""

    def __init__(
        self,
        topology: Topology,
        options: ControllerConfig,
        *,
        switch_factory: Callable[[SwitchOptions, Schema], Switch] = Switch,
    ) -> None:
        self.topology = topology
        self.options = options
        self.schema = Schema.from_file(options.p4info_path)
        self._switch_factory = switch_factory
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self.store: Store | None = None
        self.switches: dict[str, Switch] = {}
        self.programmer = SwitchProgrammer(topology, self.switches, chains=options.rina_chains, trees=options.trees)
        self._jobs: dict[int, Job] = {}
        self._policy_name = options.policy
        self._policy: AllocationPolicy = make_policy(options.policy)
        self._next_generation = 1
        self._next_job_id = FIRST_JOB_ID
        self._next_seq = 1
        self._heartbeats: dict[int, float] = {}  # job_id -> time.time() of the last heartbeat
        self._subs: dict[int, set[Subscription]] = {}
        self._barriers = GenerationBarriers(self._cv)
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._running = False
        self._demoted: set[str] = set()  # switches where another controller took over
        self.authority: Authority | None = None

    # ================================================================================================
    # lifecycle
    # ================================================================================================
    @property
    def ina_switches(self) -> list[str]:
        return self.programmer.ina_switches

    def start(self) -> None:
        """Load the database, become primary on every INA switch, push the pipeline if needed,
        reconcile every switch with the stored grants, then re-run the policy (restart upgrades)."""
        self.store = Store(self.options.db_path)
        self.authority = Authority(self.options.admin_credential or admin_credential_path(self.options.db_path))
        stored_policy = self.store.get_meta("policy")
        if stored_policy is not None and stored_policy != self._policy_name and stored_policy in POLICIES:
            log.warning("policy %r from the database overrides %r (change it with `inactl policy set`)", stored_policy, self._policy_name)
            self._policy_name, self._policy = stored_policy, make_policy(stored_policy)
        self._next_generation = int(self.store.get_meta("next_generation", "1"))
        self._next_job_id = int(self.store.get_meta("next_job_id", str(FIRST_JOB_ID)))
        jobs = self.store.load_jobs()
        for j in jobs:
            unknown = sorted({sw for _, sw, _ in j.placement} - set(self.topology.switches))
            if unknown:
                self.store.close()
                self.store = None
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"job {j.job_id} in {self.options.db_path} has workers under switch {unknown[0]}, which the "
                    "topology does not have: start with the topology it was admitted under, or a new --db",
                )
        self._jobs = {j.job_id: j for j in jobs}
        self._next_seq = max((j.seq for j in jobs), default=0) + 1
        for job_id, (generation, resume) in self.store.load_barriers().items():
            if job_id in self._jobs and wire_generation(self._jobs[job_id]) == generation:
                self._barriers.restore(job_id, generation, resume)
        if jobs:
            log.info("loaded %d job(s) from %s", len(jobs), self.options.db_path)
        try:
            for name in self.ina_switches:
                self.programmer.load_forwarding(name, self.schema)
            lost: set[int] = set()
            for name in self.ina_switches:
                # With no job to keep, start the switches clean: a pushed pipeline also clears the registers,
                # which may hold slot owners of another controller's jobs that our job ids and generations
                # would otherwise collide with.
                lost |= self._bring_up(name, force_push=not jobs)
            now = time.time()
            self._heartbeats = {job_id: now for job_id in self._jobs}
            self._running = True
            with self._lock:
                new, counter = self._reallocate(
                    dict(self._jobs), "controller restarted", self._next_generation, refresh=lost
                )
                self._commit(new, set(), counter)
            if self.store.get_meta("policy") is None:
                self.store.save(meta={"policy": self._policy_name})
        except BaseException:
            self.stop()
            raise
        self._monitor = threading.Thread(target=self._monitor_loop, name="controller-monitor", daemon=True)
        self._monitor.start()

    def _device_config(self) -> bytes:
        """The device config pushed with the P4Info (BMv2's JSON; empty for ina-switch)."""
        return self.options.device_config.read_bytes() if self.options.device_config is not None else b""

    def _bring_up(self, name: str, force_push: bool = False) -> set[int]:
        """Connect (primary or fail), push the pipeline if the switch does not run it, reconcile.

        Returns the jobs whose slot state on this switch may be gone (the pipeline was pushed, or their
        ``ina_job`` entry was missing or altered): they need a new generation, so that the data plane
        resets their slots and their workers resynchronise instead of waiting for results that no
        register holds any more."""
        info = self.topology.switches[name]
        old = self.switches.pop(name, None)
        if old is not None:
            old.close()
        sw = self._switch_factory(
            SwitchOptions(name, info.address, info.device_id, self.options.election_id, self.options.connect_timeout,
                          tls=self.options.switch_tls),
            self.schema,
        )
        try:
            if not sw.connect():
                primary = sw.primary_election_id
                raise Refusal(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"switch {name} at {info.address}: another controller is primary (election id {primary}, ours "
                    f"{self.options.election_id}); stop it or use a higher --election-id",
                )
            pushed = sw.ensure_pipeline(
                self.schema.p4info, self._device_config(), force=self.options.force_push or force_push
            )
            if pushed:
                log.info("%s: pipeline pushed", name)
            with self._lock:
                report = self.programmer.reconcile(name, self._jobs, sw)
                log.info("%s: reconciled (%s)", name, report)
                held = {j.job_id for j in self._jobs.values() if j.range_on(name) is not None}
                if pushed:
                    lost = held
                else:
                    # A job entry, or any entry of a job's place in a tree or chain, that had to be repaired
                    # (a controller that died half-way through writing it): the job gets a new generation,
                    # written on every switch of it before its agents use it.
                    repaired = {e.match[0] for e in report.inserted + report.modified + report.deleted
                                if getattr(e, "table", None) in JOB_TABLES and e.match}
                    lost = held & repaired
        except BaseException:
            sw.close()
            raise
        self.switches[name] = sw
        return lost

    def stop(self) -> None:
        self._stop.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=5)
        with self._lock:
            self._running = False
            for subs in self._subs.values():
                for s in subs:
                    s.close()
            self._subs.clear()
            self._cv.notify_all()
        for sw in self.switches.values():
            sw.close()
        self.switches.clear()
        if self.store is not None:
            self.store.close()
            self.store = None

    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.options.monitor_interval):
            try:
                self._reap()
            except Refusal as exc:
                log.warning("heartbeat reaping deferred: %s", exc.message)
            except Exception:
                log.exception("heartbeat reaping failed")
            for name in self.ina_switches:
                sw = self.switches.get(name)
                if sw is not None and sw.connected:
                    if not sw.is_primary and name not in self._demoted:
                        self._demoted.add(name)
                        log.error("%s: no longer primary (election id %s took over): writes to it will fail",
                                  name, sw.primary_election_id)
                    elif sw.is_primary:
                        self._demoted.discard(name)
                    continue
                try:
                    log.warning("%s: session lost, reconnecting", name)
                    lost = self._bring_up(name)
                    if lost:
                        with self._lock:
                            new, counter = self._reallocate(
                                dict(self._jobs), f"switch {name} lost its state", self._next_generation, refresh=lost
                            )
                            self._commit(new, set(), counter)
                except (SwitchError, Refusal) as exc:
                    log.warning("%s: still unreachable: %s", name, exc)
                if self._stop.is_set():
                    return

    def _reap(self) -> None:
        timeout = self.options.heartbeat_timeout
        if timeout <= 0:
            return
        with self._lock:
            now = time.time()
            dead = [j for j, t in self._heartbeats.items() if j in self._jobs and now - t > timeout]
            if not dead:
                return
            for job_id in dead:
                log.warning("job %d: no heartbeat for %.1f s, releasing it", job_id, now - self._heartbeats[job_id])
            self._release(dead, f"heartbeat timeout ({timeout:g} s)")

    # ================================================================================================
    # switch state
    # ================================================================================================
    def reconcile(self) -> dict[str, str]:
        """Read back every INA switch and repair differences from the stored state."""
        with self._lock:
            out = {}
            for name in self.ina_switches:
                sw = self.switches.get(name)
                if sw is None:
                    out[name] = "not connected"
                    continue
                out[name] = str(self.programmer.reconcile(name, self._jobs))
            return out

    # ================================================================================================
    # allocation
    # ================================================================================================
    def _pool(self, switch: str) -> int:
        return self.topology.switches[switch].pool_size

    def _demand(self, job: Job, switch: str, chain_slots: int | None = None) -> JobDemand | None:
        """What ``job`` asks of ``switch``'s pool: its request, or on Rina's chains at least the slots its chains'
        round trip needs (``chain_slots``: ``controller.chains.chain_slots``; a request counts for one switch's
        round trip, a chain's is several times longer), within the pool."""
        req = job.request
        pool = self._pool(switch)
        if req.requested_slots:
            requested = req.requested_slots
        else:
            requested = max(1, math.ceil(req.tensor_elements / wire.LANES))
        if chain_slots:
            requested = max(requested, chain_slots)
        requested = min(requested, pool)
        min_slots = max(1, req.min_slots)
        if pool == 0 or min_slots > requested:
            return None  # can never get slots here
        return JobDemand(job.job_id, requested, priority=req.priority, weight=req.weight or 1.0, min_slots=min_slots)

    def _reallocate(
        self, jobs: dict[int, Job], cause: str, counter: int, fresh: int | None = None, refresh: set[int] = frozenset()
    ) -> tuple[dict[int, Job], int]:
        """Run the policy on every pool; jobs whose ranges change, `fresh` (just admitted) and `refresh`
        (whose switch state was lost) get a new generation."""
        order = sorted(jobs.values(), key=lambda j: j.seq)
        demands: dict[str, list[JobDemand]] = {sw: [] for sw in self.ina_switches}
        current: dict[str, dict[int, SlotRange]] = {sw: {} for sw in self.ina_switches}
        trees: dict[int, TreeLayout] = {}
        if self.options.trees:
            trees = {j.job_id: t for j in order if (t := tree_layout(self.topology, j)) is not None}

        def switches_of(job: Job) -> list[str]:
            """Where the job asks for slots: under its workers, and at its tree's root."""
            tree = trees.get(job.job_id)
            return job.switches() + ([tree.root] if tree else [])

        for job in order:
            sized = None
            if self.options.rina_chains and job.job_id not in trees and len(job.switches()) > 1:
                sized = chain_slots(self.topology, job)
            for sw in switches_of(job):
                if sw not in demands:
                    continue
                d = self._demand(job, sw, sized)
                if d is not None:
                    demands[sw].append(d)
                rng = job.range_on(sw)
                if rng is not None:
                    current[sw][job.job_id] = rng
        alloc = allocate_pools(self._policy, {sw: self._pool(sw) for sw in demands}, demands, current)
        out: dict[int, Job] = {}
        for job in order:
            ranges = {sw: alloc[sw].get(job.job_id) for sw in switches_of(job) if sw in demands}
            tree = trees.get(job.job_id)
            if tree is not None:
                ranges, is_tree = tree_ranges(tree, ranges)
            else:
                is_tree = False
            held = {sw: r for sw, r in ranges.items() if r is not None}
            multi = len(job.switches()) > 1
            backend = Backend.TREE if is_tree else (Backend.RINA if multi else Backend.INA) if held else Backend.RING
            if (ranges == dict(job.ranges) and backend == job.backend
                    and job.job_id != fresh and job.job_id not in refresh):
                out[job.job_id] = job
                continue
            generation, counter = counter, counter + 1
            old_total = sum(r.size for _, r in job.ranges if r is not None)
            new_total = sum(r.size for r in held.values())
            if is_tree:
                what = f"tree of {', '.join(tree.tors)} under {tree.root}, {held[tree.root].size} slots on each"
            elif held:
                what = ", ".join(f"{r.size} slots on {sw}" for sw, r in held.items())
            elif not demands or all(sw not in demands for sw in job.switches()):
                what = "no INA switch"
            else:
                what = f"no slots (policy {self._policy_name})"
            if job.job_id == fresh:
                reason = f"admitted: {what}"
            elif new_total > old_total:
                reason = f"upgraded: {what}; {cause}"
            elif new_total < old_total:
                reason = f"reduced: {what}; {cause}"
            elif job.job_id in refresh and ranges == dict(job.ranges):
                reason = f"renewed: {what}; {cause}"
            else:
                reason = f"moved: {what}; {cause}"
            out[job.job_id] = job.with_ranges(ranges, generation=generation, backend=backend, reason=reason)
        return out, counter

    def _commit(self, new: dict[int, Job], deleted: set[int], counter: int, meta: dict[str, str] | None = None) -> None:
        """Switches, then database, then agents (the module docstring's steps 2-4). Lock held."""
        old = self._jobs
        changed = [j for jid, j in new.items() if old.get(jid) is not j]
        if not changed and not deleted and not meta and counter == self._next_generation:
            return
        self.programmer.write(old, new)
        all_meta = {"next_generation": str(counter), "next_job_id": str(self._next_job_id)}
        all_meta.update(meta or {})
        self.store.save(changed, deleted, all_meta)
        self._jobs = new
        self._next_generation = counter
        for job in changed:
            prev = old.get(job.job_id)
            if prev is None or prev.generation != job.generation:
                log.info("job %d: generation %d, %s (%s)", job.job_id, job.generation, job.backend, job.reason)
            self._publish(job.job_id, pb.AllocationEvent(grant=self._grant(job)))
        for job_id in deleted:
            self._publish(job_id, pb.AllocationEvent(grant=self._grant(old[job_id]), released=True))
            for s in self._subs.pop(job_id, set()):
                s.close()
            self._barriers.discard(job_id)
            self._heartbeats.pop(job_id, None)
        self._cv.notify_all()

    def _publish(self, job_id: int, event: pb.AllocationEvent) -> None:
        for s in list(self._subs.get(job_id, ())):
            s.events.put(event)

    # ================================================================================================
    # grants
    # ================================================================================================
    def _grant(self, job: Job) -> pb.JobGrant:
        return job_grant(self.topology, job, scale=self.options.scale, rina_chains=self.options.rina_chains)

    def _info(self, job: Job) -> pb.JobInfo:
        return job_info(job, self._grant(job), self._heartbeats.get(job.job_id, 0.0))

    def _job(self, job_id: int) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"job {job_id} not found")
        return job

    def caller(self, credential: str) -> Caller:
        """Who presents ``credential`` (controller/auth.py)."""
        if self.authority is None:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "controller is not running")
        return self.authority.caller(credential)

    def _owned_job(self, job_id: int, caller: Caller) -> Job:
        """The job, if the caller may act on it: UNAUTHENTICATED, PERMISSION_DENIED or NOT_FOUND otherwise."""
        caller.require()
        job = self._job(job_id)
        caller.check_job(job_id, job.secret_hash)
        return job

    def _require_running(self) -> None:
        if not self._running:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "controller is not running")

    # ================================================================================================
    # agents
    # ================================================================================================
    def _free_job_id(self) -> int:
        n = wire.MAX_JOBS - FIRST_JOB_ID
        for i in range(n):
            job_id = FIRST_JOB_ID + (self._next_job_id - FIRST_JOB_ID + i) % n
            if job_id not in self._jobs:
                return job_id
        raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, f"all {n} job ids are in use")

    def register(self, request: pb.RegisterJobRequest, caller: Caller = TRUSTED) -> pb.JobGrant:
        """Admit a job owned by ``caller``'s credential (the admin's: only the admin may act on it). A request
        whose ``idempotency_key`` an admitted job carries is a retry: it gets that job's current grant."""
        caller.require()
        with self._lock:
            self._require_running()
            if request.idempotency_key:
                for job in self._jobs.values():
                    if job.request.idempotency_key == request.idempotency_key:
                        caller.check_job(job.job_id, job.secret_hash)
                        log.info("job %d: registration retried (idempotency key), current grant sent again", job.job_id)
                        return self._grant(job)
            req, placement = validate_registration(request, self.topology, self._jobs.values())
            job_id = self._free_job_id()
            job = Job(job_id, self._next_seq, req, placement, time.time(), generation=0,
                      secret_hash="" if caller.admin else hash_secret(caller.credential))
            check_member_ids(self.topology, job, trees=self.options.trees, chains=self.options.rina_chains)
            jobs = dict(self._jobs)
            jobs[job_id] = job
            new, counter = self._reallocate(jobs, f"job {job_id} admitted", self._next_generation, fresh=job_id)
            prev_next_id = self._next_job_id
            self._next_job_id = FIRST_JOB_ID + (job_id - FIRST_JOB_ID + 1) % (wire.MAX_JOBS - FIRST_JOB_ID)
            try:
                self._commit(new, set(), counter)
            except BaseException:
                self._next_job_id = prev_next_id
                raise
            self._next_seq += 1
            self._heartbeats[job_id] = time.time()
            return self._grant(self._jobs[job_id])

    def _worker(self, job: Job, worker_id: int) -> None:
        if worker_id not in job.worker_ids:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"job {job.job_id} has no worker {worker_id}")

    def heartbeat(self, job_id: int, worker_id: int, caller: Caller = TRUSTED) -> int:
        with self._lock:
            self._require_running()
            job = self._owned_job(job_id, caller)
            self._worker(job, worker_id)
            self._heartbeats[job_id] = time.time()
            return wire_generation(job)

    def _release(self, job_ids: list[int], cause: str) -> None:
        jobs = {j: job for j, job in self._jobs.items() if j not in job_ids}
        new, counter = self._reallocate(jobs, cause, self._next_generation)
        self._commit(new, set(job_ids), counter)

    def release(self, job_id: int, cause: str | None = None, caller: Caller = TRUSTED) -> None:
        with self._lock:
            self._require_running()
            self._owned_job(job_id, caller)
            self._release([job_id], cause or f"job {job_id} released")
            log.info("job %d released", job_id)

    def watch(self, job_id: int, worker_id: int, caller: Caller = TRUSTED) -> Subscription:
        """A stream of the job's AllocationEvents, starting with its current grant."""
        with self._lock:
            self._require_running()
            job = self._owned_job(job_id, caller)
            if worker_id:
                self._worker(job, worker_id)
            sub = Subscription(job_id, worker_id)
            sub.events.put(pb.AllocationEvent(grant=self._grant(job)))
            self._subs.setdefault(job_id, set()).add(sub)
            return sub

    def unwatch(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.get(sub.job_id, set()).discard(sub)
            sub.close()

    def sync_generation(self, job_id: int, worker_id: int, generation: int, first_missing: int, timeout: float | None = None,
                        caller: Caller = TRUSTED) -> int:
        """The barrier after a generation change: returns, once every worker of the job has reported
        for `generation`, the minimum reported first-missing chunk."""
        wait = self.options.sync_timeout if timeout is None else min(timeout, self.options.sync_timeout)
        deadline = time.monotonic() + wait
        with self._lock:
            self._require_running()
            job = self._owned_job(job_id, caller)
            self._worker(job, worker_id)
            if generation != wire_generation(job):
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"job {job_id}: generation {generation} is not the current generation {wire_generation(job)}",
                )
            return self._barriers.sync(
                job, worker_id, generation, first_missing, deadline=deadline, wait=wait, current=lambda j: self._jobs.get(j),
                running=lambda: self._running, save=self.store.save_barrier,
            )

    # ================================================================================================
    # operators
    # ================================================================================================
    def list_jobs(self, caller: Caller = TRUSTED) -> list[pb.JobInfo]:
        """Every job the caller may act on (all of them for the admin)."""
        caller.require()
        with self._lock:
            return [self._info(j) for j in sorted(self._jobs.values(), key=lambda j: j.job_id)
                    if caller.may_use(j.secret_hash)]

    def job_info(self, job_id: int, caller: Caller = TRUSTED) -> pb.JobInfo:
        with self._lock:
            return self._info(self._owned_job(job_id, caller))

    def memory(self) -> pb.MemoryMap:
        with self._lock:
            return memory_map({sw: self._pool(sw) for sw in self.ina_switches}, self._jobs.values())

    def stats(self, job_id: int = 0, caller: Caller = TRUSTED) -> pb.StatsResponse:
        if not job_id:
            caller.require_admin("stats of every job")
        with self._lock:
            jobs = [self._owned_job(job_id, caller)] if job_id else sorted(self._jobs.values(), key=lambda j: j.job_id)
            switches = dict(self.switches)
        try:
            return switch_stats(switches, jobs)
        except SwitchError as exc:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, str(exc)) from None

    def policy_info(self) -> pb.PolicyInfo:
        return pb.PolicyInfo(policy=self._policy_name, available=sorted(POLICIES))

    def set_policy(self, name: str) -> pb.PolicyInfo:
        with self._lock:
            self._require_running()
            try:
                policy = make_policy(name)
            except ValueError as exc:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            if name == self._policy_name:
                return self.policy_info()
            old_name, old_policy = self._policy_name, self._policy
            self._policy_name, self._policy = name, policy
            try:
                new, counter = self._reallocate(dict(self._jobs), f"policy set to {name}", self._next_generation)
                self._commit(new, set(), counter, meta={"policy": name})
            except BaseException:
                self._policy_name, self._policy = old_name, old_policy
                raise
            log.info("policy set to %s", name)
            return self.policy_info()
