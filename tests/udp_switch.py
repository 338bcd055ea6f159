"""In-process test doubles for the agent: a fake admission service over ``softswitch.udp.UdpSwitch``es.

``FakeAdmission`` serves the admission service (inaproto/admission.proto) on 127.0.0.1 and programs the
switches the way the controller does (docs/protocol.md): the ``ina_job`` entry, the job's multicast group
and its ``ina_worker`` entries. Tests move, shrink, revoke and restore a job's slots with
``FakeAdmission.reallocate``; ``LocalCluster`` runs it with switches and workers in one process.
"""
from __future__ import annotations

import queue
import socket
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Self

import grpc

from host_agent.agent import bind_worker_sockets
from host_agent.grant import JobSpec, Worker
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto import wire
from inaproto.credentials import new_secret
from softswitch.udp import Faults, UdpSwitch, make_switches

# ----------------------------------------------------------------------------- fake admission service


@dataclass
class _Job:
    job_id: int
    request: pb.RegisterJobRequest
    workers: list[Worker]
    generation: int
    grant: pb.JobGrant
    registered_at: float
    state: str = "running"
    last_heartbeat: float = 0.0
    watchers: list[queue.Queue] = field(default_factory=list)
    sync_reports: dict[int, dict[int, int]] = field(default_factory=dict)
    sync_resolved: dict[int, int] = field(default_factory=dict)
    heartbeats: int = 0
    syncs: list[tuple[int, int, int]] = field(default_factory=list)


class FakeAdmission(pb_grpc.AdmissionServicer):
    """The admission service over UdpSwitches, for agent tests (no P4Runtime, no persistence).

    Args:
        switches: rack name -> UdpSwitch, or None for a rack without INA.
        rack_of_host: Worker.host -> rack name; workers of unknown hosts are in no rack (ring only).
        slots: slots granted per job per INA switch at registration (0: none, the job runs on the ring).
        scale: the fixed-point scale of every grant.
        sync_timeout: SyncGeneration's wait for every worker before DEADLINE_EXCEEDED.
    """

    def __init__(self, switches: dict[str, UdpSwitch | None], rack_of_host: dict[str, str], *, slots: int = 64,
                 scale: float = float(2**16), sync_timeout: float = 30.0) -> None:
        self.switches = switches
        self.rack_of_host = rack_of_host
        self.slots = slots
        self.scale = scale
        self.sync_timeout = sync_timeout
        self.jobs: dict[int, _Job] = {}
        self.path_rtt_floors: dict[str, float] = {}  # rack -> the SwitchGrant's path_rtt_floor (seconds)
        self.cond = threading.Condition()
        self._next_job = 1
        self._next_base: dict[str, int] = {name: 0 for name in switches}
        ports = {s.address[1] for s in switches.values() if s is not None}
        if len(ports) > 1:
            raise ValueError("all switches must listen on the same port (the grant has one ina_port)")
        self.ina_port = ports.pop() if ports else wire.INA_UDP_PORT
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        pb_grpc.add_AdmissionServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def close(self) -> None:
        with self.cond:
            for job in self.jobs.values():
                for q in job.watchers:
                    q.put(None)
        self.server.stop(grace=0.5).wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- grants ----------------------------------------------------------------------------------------
    def _racks(self, workers: list[Worker]) -> dict[str, list[Worker]]:
        racks: dict[str, list[Worker]] = {}
        for w in workers:
            rack = self.rack_of_host.get(w.host)
            if rack is not None:
                racks.setdefault(rack, []).append(w)
        return racks

    def _program(self, job: _Job, slots: dict[str, int], bases: dict[str, int], reason: str) -> None:
        """Write the switches for ``job``'s new generation, then build its grant (caller holds cond)."""
        racks = self._racks(job.workers)
        grants = []
        for rack, members in sorted(racks.items()):
            switch = self.switches.get(rack)
            n = slots.get(rack, 0) if switch is not None else 0
            base = bases.get(rack, 0)
            if switch is not None:
                if n > 0:
                    switch.install_job(job.job_id, members, base, n, job.generation)
                else:
                    switch.remove_job(job.job_id)
            grants.append(pb.SwitchGrant(
                switch=rack, switch_ip=switch.address[0] if switch else "", switch_mac="02:00:00:00:00:fe",
                base_slot=base, num_slots=n, mcast_grp=job.job_id + 1 if n else 0,
                worker_ids=[w.worker_id for w in members], rack=rack,
                path_rtt_floor=self.path_rtt_floors.get(rack, 0.0)))
        with_slots = [g for g in grants if g.num_slots > 0]
        if len(with_slots) == 1 and len(with_slots[0].worker_ids) == len(job.workers):
            backend = "ina"
        elif with_slots:
            backend = "rina"
        else:
            backend = "ring"
        job.grant = pb.JobGrant(job_id=job.job_id, generation=job.generation, backend=backend, switches=grants,
                                scale=self.scale, ina_port=self.ina_port, lanes=wire.LANES, reason=reason)

    def reallocate(self, job_id: int, slots: dict[str, int] | int, bases: dict[str, int] | int | None = None,
                   reason: str = "reallocated") -> int:
        """A new generation for the job with ``slots`` (per rack, or the same on every rack) at ``bases``.

        Switches are programmed first, then every watcher gets the event. Pending SyncGeneration calls
        of older generations fail with FAILED_PRECONDITION. Returns the new generation.
        """
        with self.cond:
            job = self.jobs[job_id]
            racks = self._racks(job.workers)
            if isinstance(slots, int):
                slots = {r: slots for r in racks}
            if bases is None:
                bases = {g.rack: g.base_slot for g in job.grant.switches}
            elif isinstance(bases, int):
                bases = {r: bases for r in racks}
            job.generation += 1
            self._program(job, slots, bases, reason)
            self._publish(job)
            self.cond.notify_all()
            return job.generation

    def _publish(self, job: _Job, released: bool = False) -> None:
        event = pb.AllocationEvent(grant=job.grant, released=released)
        for q in job.watchers:
            q.put(event)

    def job_named(self, name: str, timeout: float = 10.0) -> _Job:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for job in self.jobs.values():
                    if job.request.name == name and job.state != "released":
                        return job
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no job {name!r}")
                self.cond.wait(left)

    def job_id(self, name: str) -> int:
        """The id of the newest job called ``name``, released or not."""
        with self.cond:
            return max(j.job_id for j in self.jobs.values() if j.request.name == name)

    def wait_sync(self, job_id: int, generation: int, timeout: float = 10.0) -> int:
        """Block until every worker has synced on ``generation``; the resume chunk."""
        deadline = time.monotonic() + timeout
        with self.cond:
            job = self.jobs[job_id]
            while generation not in job.sync_resolved:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} did not sync on generation {generation}")
                self.cond.wait(left)
            return job.sync_resolved[generation]

    # --- the service -------------------------------------------------------------------------------------
    def RegisterJob(self, request, context):
        if not request.name or not request.workers:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a job needs a name and workers")
        if request.tensor_elements < 1:  # as the controller does
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tensor_elements must be at least 1")
        workers = [Worker.from_proto(w) for w in request.workers]
        with self.cond:
            if any(j.request.name == request.name and j.state != "released" for j in self.jobs.values()):
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"job {request.name!r} exists")
            job_id = self._next_job
            self._next_job += 1
            job = _Job(job_id, request, workers, 1, pb.JobGrant(), time.time())
            n = request.requested_slots or self.slots
            slots, bases = {}, {}
            for rack in self._racks(workers):
                if self.switches.get(rack) is not None:
                    slots[rack] = n
                    bases[rack] = self._next_base[rack]
                    self._next_base[rack] += n
            self._program(job, slots, bases, "admitted")
            self.jobs[job_id] = job
            self.cond.notify_all()
            return job.grant

    def _job(self, job_id: int, context) -> _Job:
        job = self.jobs.get(job_id)
        if job is None or job.state == "released":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")
        return job

    def Heartbeat(self, request, context):
        with self.cond:
            job = self._job(request.job_id, context)
            job.last_heartbeat = time.time()
            job.heartbeats += 1
            return pb.HeartbeatResponse(generation=job.generation)

    def release(self, job_id: int) -> None:
        """Release a job as the controller does (its entries leave the switches; watchers get ``released``)."""
        with self.cond:
            job = self.jobs[job_id]
            job.state = "released"
            for switch in self.switches.values():
                if switch is not None:
                    switch.remove_job(job.job_id)
            self._publish(job, released=True)
            self.cond.notify_all()

    def ReleaseJob(self, request, context):
        with self.cond:
            self._job(request.job_id, context)
            self.release(request.job_id)
            return pb.ReleaseJobResponse()

    def WatchJob(self, request, context):
        q: queue.Queue = queue.Queue()
        with self.cond:
            job = self._job(request.job_id, context)
            job.watchers.append(q)
            q.put(pb.AllocationEvent(grant=job.grant))
        try:
            while context.is_active():
                try:
                    event = q.get(timeout=0.1)
                except queue.Empty:
                    continue
                if event is None:
                    return
                yield event
                if event.released:
                    return
        finally:
            with self.cond:
                if q in job.watchers:
                    job.watchers.remove(q)

    def SyncGeneration(self, request, context):
        deadline = time.monotonic() + self.sync_timeout
        with self.cond:
            job = self._job(request.job_id, context)
            gen = request.generation
            job.syncs.append((request.worker_id, gen, request.first_missing_chunk))
            if gen != job.generation:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"generation {gen} is not current ({job.generation})")
            if gen in job.sync_resolved:
                return pb.SyncGenerationResponse(generation=gen, resume_chunk=job.sync_resolved[gen])
            reports = job.sync_reports.setdefault(gen, {})
            reports[request.worker_id] = request.first_missing_chunk
            if len(reports) == len(job.workers):
                job.sync_resolved[gen] = min(reports.values())
                self.cond.notify_all()
            while gen not in job.sync_resolved:
                left = deadline - time.monotonic()
                if job.generation != gen or job.state == "released":
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"generation {gen} was superseded")
                if left <= 0:
                    missing = sorted({w.worker_id for w in job.workers} - set(reports))
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"workers {missing} did not report")
                self.cond.wait(min(left, 0.1))
            return pb.SyncGenerationResponse(generation=gen, resume_chunk=job.sync_resolved[gen])

    def ListJobs(self, request, context):
        with self.cond:
            return pb.ListJobsResponse(jobs=[self._info(j) for j in self.jobs.values()])

    def GetJob(self, request, context):
        with self.cond:
            job = self.jobs.get(request.job_id)
            if job is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id}")
            return self._info(job)

    @staticmethod
    def _info(job: _Job) -> pb.JobInfo:
        return pb.JobInfo(job_id=job.job_id, name=job.request.name, state=job.state, grant=job.grant,
                          request=job.request, registered_at=job.registered_at, last_heartbeat=job.last_heartbeat)


# ----------------------------------------------------------------------------- local jobs


def local_job(n: int, name: str = "job", *, backend: str = "auto", hosts: list[str] | None = None,
              ip: str = "127.0.0.1") -> tuple[JobSpec, list[tuple[socket.socket, socket.socket]]]:
    """A job of ``n`` workers on ``ip`` with their sockets bound (worker i on host ``hosts[i]``, default "h{i}"),
    with a fresh secret."""
    sockets = [bind_worker_sockets(ip) for _ in range(n)]
    hosts = hosts or [f"h{i}" for i in range(n)]
    workers = tuple(Worker(i, ip, s[0].getsockname()[1], "", hosts[i]) for i, s in enumerate(sockets))
    return JobSpec(name, workers, backend=backend, secret=new_secret()), sockets


def run_workers(n: int, fn, *, timeout: float = 60.0) -> list:
    """``fn(i)`` in n threads; results in order; the first exception is raised after all have ended."""
    results: list = [None] * n

    def target(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # reported below  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=target, args=(i,), name=f"worker-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise TimeoutError(f"workers still running after {timeout}s: {alive}")
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


class LocalCluster:
    """Switches, a fake controller and one job's workers on loopback, for agent tests.

    Args:
        racks: the rack of each worker (worker i on host "h{i}").
        ina_racks: racks whose switch does INA (default: all); the others have no switch.
        slots, scale: what the fake controller grants per INA rack.
        faults, seed: fault injection on every switch.
        backend: requested backend of the job.
        options: the agents' options.
    """

    def __init__(self, racks: list[str], *, ina_racks: set[str] | None = None, slots: int = 64,
                 scale: float = float(2**16), faults: Faults | None = None, seed: int = 0, backend: str = "auto",
                 options=None, name: str = "job") -> None:
        from host_agent.agent import AgentOptions

        names = sorted(set(racks))
        ina = [r for r in names if ina_racks is None or r in ina_racks]
        self.switches: dict[str, UdpSwitch | None] = {r: None for r in names}
        if ina:
            for sw in make_switches(ina, faults=faults, seed=seed):
                self.switches[sw.name] = sw
        self.racks = racks
        self.fake = FakeAdmission(self.switches, {f"h{i}": r for i, r in enumerate(racks)}, slots=slots, scale=scale)
        self.options = options or AgentOptions()
        self.spec, self.sockets = self.new_job(name, backend)

    def new_job(self, name: str, backend: str = "auto", workers: list[int] | None = None):
        """Another job on the same hosts: (spec, sockets); ``workers`` picks hosts (default: all)."""
        idx = list(range(len(self.racks))) if workers is None else workers
        spec, sockets = local_job(len(idx), name, backend=backend, hosts=[f"h{i}" for i in idx])
        return spec, sockets

    def switch(self, rack: str | None = None) -> UdpSwitch:
        sw = [s for r, s in sorted(self.switches.items()) if s is not None and (rack is None or r == rack)]
        return sw[0]

    def run(self, fn, *, spec: JobSpec | None = None, sockets=None, timeout: float = 60.0, controller: bool = True,
            options=None) -> list:
        """``fn(agent)`` on every worker of the job (threads); agents are closed after it; results in order."""
        from host_agent.agent import Agent

        spec = spec or self.spec
        sockets = sockets or self.sockets

        def worker(i: int):
            agent = Agent(spec, spec.workers[i].worker_id, controller=self.fake.address if controller else None,
                          sock=sockets[i][0], listener=sockets[i][1], options=options or self.options)
            try:
                return fn(agent)
            finally:
                agent.close()

        return run_workers(len(spec.workers), worker, timeout=timeout)

    def close(self) -> None:
        self.fake.close()
        for sw in self.switches.values():
            if sw is not None:
                sw.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def quantised_sum(arrays: list, scale: float = float(2**16)):
    """What every agent must return: float32(exact int64 sum of rint(x * scale) / scale), saturated like quantize."""
    import numpy as np

    from host_agent.fixedpoint import dequantize, quantize

    total = np.sum(np.stack([quantize(np.asarray(a).reshape(-1), scale).astype(np.int64) for a in arrays]), axis=0)
    return dequantize(total, scale).reshape(np.asarray(arrays[0]).shape)
