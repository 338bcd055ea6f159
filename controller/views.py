"""What the controller reports about its jobs: each job's grant, its JobInfo, the memory map, switch counters.

Read-only views of the controller's state (``controller.core.Controller`` calls them under its lock and
sends what they build): the admission service's messages (inaproto/admission.proto) are assembled here
from the topology, the jobs and the switches' counters, so the core keeps only the paths that change state.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.chains import chain_rtt_floor
from controller.memory import memory_view
from controller.path_floor import path_rtt_floors
from controller.store import Job
from controller.switch import Switch
from controller.topology import Topology
from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.backends import Backend, JobState
from inaproto.job_entries import job_group, split_generation

__all__ = ["DROP_NAMES", "JOB_DROPS", "job_grant", "job_info", "memory_map", "switch_stats", "wire_generation"]

DROP_NAMES = {r.value: r.name.lower() for r in wire.DropReason}
# Reasons counted per job in ina_job_drops (the others happen before a job is known).
JOB_DROPS = (wire.DropReason.SLOT_OUT_OF_RANGE, wire.DropReason.FOREIGN_WORKER,
             wire.DropReason.STALE_GENERATION, wire.DropReason.BAD_MSG_TYPE, wire.DropReason.SPOOFED,
             wire.DropReason.NOT_RECIPIENT)
# The counters a StatsResponse reads from every switch.
STATS_COUNTERS = ("MyIngress.ina_aggregated", "MyIngress.ina_duplicates", "MyEgress.ina_results",
                  "MyIngress.ina_job_drops", "MyIngress.ina_drops")


def wire_generation(job: Job) -> int:
    """The 16-bit generation of ``job`` that its agents and packets carry.

    Job.generation is a serial (1, 2, ... never reused); agents and packets see its wire generation (bit<16>,
    cycling 1..65535, 0 never handed out) and the switch's owner tags its epoch too
    (inaproto.job_entries.split_generation)."""
    return split_generation(job.generation)[0]


def job_grant(topology: Topology, job: Job, *, scale: float) -> pb.JobGrant:
    """``job``'s grant as its agents receive it: backend, generation, and per switch its slots, members and
    path floor (a tree's root last, with no workers)."""
    g = pb.JobGrant(
        job_id=job.job_id,
        generation=wire_generation(job),
        backend=str(job.backend),
        scale=scale,
        ina_port=wire.INA_UDP_PORT,
        lanes=wire.LANES,
        reason=job.reason,
    )
    if job.backend == Backend.RINA:
        g.chain_rtt_floor = chain_rtt_floor(topology, job)
    tree_root = [sw for sw, _ in job.ranges if sw not in job.switches()] if job.backend == Backend.TREE else []
    floors = path_rtt_floors(topology, job, tree_root[0] if tree_root else None)
    for sw in job.switches() + tree_root:
        info = topology.switches[sw]
        rng = job.range_on(sw)
        g.switches.append(
            pb.SwitchGrant(
                switch=sw,
                switch_ip=info.switch_ip if info.ina else "",
                switch_mac=info.switch_mac if info.ina else "",
                base_slot=rng.base if rng else 0,
                num_slots=rng.size if rng else 0,
                mcast_grp=job_group(job.job_id) if info.ina else 0,
                worker_ids=[w for w, _ in job.workers_on(sw)],
                rack=info.rack, path_rtt_floor=floors.get(sw, 0.0),
            )
        )
    return g


def job_info(job: Job, grant: pb.JobGrant, last_heartbeat: float) -> pb.JobInfo:
    """``inactl job show``'s record of ``job``: a job on the ring waits for slots, any other runs."""
    return pb.JobInfo(
        job_id=job.job_id,
        name=job.request.name,
        state=str(JobState.RUNNING if job.backend != Backend.RING else JobState.WAITING),
        grant=grant,
        request=job.request,
        registered_at=job.registered_at,
        last_heartbeat=last_heartbeat,
    )


def memory_map(pools: Mapping[str, int], jobs: Iterable[Job]) -> pb.MemoryMap:
    """Every INA switch's pool (``pools``: switch -> slots, in order) as used, free and fragmented ranges."""
    jobs = list(jobs)
    out = pb.MemoryMap()
    for sw, pool in pools.items():
        holdings = {j.job_id: j.range_on(sw) for j in jobs if j.range_on(sw) is not None}
        v = memory_view(pool, holdings)
        m = out.switches.add(
            switch=sw, pool_size=v.pool_size, used=v.used, free=v.free, largest_free=v.largest_free,
            fragmentation=v.fragmentation,
        )
        for base, size, job_id in v.ranges:
            m.ranges.add(base=base, size=size, job_id=job_id or 0, free=job_id is None)
    return out


def switch_stats(switches: Mapping[str, Switch], jobs: Iterable[Job]) -> pb.StatsResponse:
    """Each switch's drop counters by reason and each job's aggregation counters there (controller.switch's
    SwitchError when a switch cannot be read)."""
    jobs = list(jobs)
    out = pb.StatsResponse()
    for name, sw in switches.items():
        c = {n: sw.read_counter(n) for n in STATS_COUNTERS}
        for reason, value in sorted(c["MyIngress.ina_drops"].items()):
            if reason in DROP_NAMES:
                out.switch_drops[f"{name}/{DROP_NAMES[reason]}"] = value
        for job in jobs:
            if name not in job.switches():
                continue
            j = job.job_id
            s = out.stats.add(
                job_id=j, switch=name,
                aggregated=c["MyIngress.ina_aggregated"].get(j, 0),
                duplicates=c["MyIngress.ina_duplicates"].get(j, 0),
                results=c["MyEgress.ina_results"].get(j, 0),
            )
            for reason in JOB_DROPS:
                s.drops[DROP_NAMES[reason]] = c["MyIngress.ina_job_drops"].get(j * wire.NUM_DROP_REASONS + reason, 0)
    return out
