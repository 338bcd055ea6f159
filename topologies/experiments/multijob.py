"""Experiment 3: a fixed job trace sharing the switch's aggregator memory, per allocation policy.

The trace (``TRACE``, also in docs/experiments.md; never tuned per run): jobs of different sizes and two
priorities arrive over time on one star (each job on its own hosts, every link ``bw_mbps`` with
``rtt_ms`` of round trip to the switch), each asking for its bandwidth-delay product in slots
(``demand_slots``, 16 at 2 Mbit/s and 10 ms). The pool the controller may hand out is a fraction of the
sum of the requests (100 %: unlimited, every job gets its BDP; 50 %; 25 %). Per pool, every policy runs the
trace (``equal``, ``first-fit``, ``weighted``, ``priority``) and two baselines:

- ``static``: a static equal partition, no reallocation: every job asks for pool / J slots (first-fit),
  so no range ever moves and memory left by a finished job stays unused;
- ``fcfs``: first come, first served: first-fit with min_slots = the request, so a job gets its whole
  BDP or waits on the ring until an earlier job leaves.

A job registers and starts its agents at its arrival and is released as soon as its workers are done.
Per job: JCT (arrival to the last worker's exit), its busy time (the sum of its all-reduces), its
priority; per run the switch memory in use over time (sampled from the controller). Summaries: mean and
p95 JCT per priority per (pool, policy), medians over ``repetitions`` with min-max. Then the same trace
(same jobs, pool, link speed, round trip; constants from calibration probes) goes through ``ina-sim``,
and each job's predicted time is compared with the measured busy time.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto.backends import Backend
from inaproto.config import ConfigError
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.config import SimConfig
from simulator.report import write_policy
from simulator.runs import simulate
from simulator.trace import JobSpec, write_trace
from topologies.daemons import write_config
from topologies.errors import ExperimentError
from topologies.experiments import register
from topologies.experiments.aggregate import allreduce_row, bdp_slots, group_by, median
from topologies.experiments.base import Anchor, Comparison, Experiment, Target
from topologies.experiments.calibrate import (
    LabCalibration,
    calibration_from,
    read_calibration,
    ring_steps_summary,
    shared_cpu_summary,
    write_calibration,
)
from topologies.experiments.conditions import Conditions
from topologies.experiments.testbed import INA_UDP_BASE, AgentFailure, AgentJob

POLICIES = ("equal", "first-fit", "weighted", "priority")
BASELINES = ("static", "fcfs")  # static equal partition (no reallocation); first come, first served
TOLERANCE = 0.15  # stated tolerance of the testbed vs simulator comparison (relative, per job)
HIGH, LOW = 1, 0  # the trace's two priorities
SHARED_CALLS = 8  # timed calls per job of the shared-ceiling probe (after one warm-up): the agents start up to
# seconds apart under load, so each job needs calls where all of them run


def window_probe_slots(demand: int) -> int:
    """The window probe's slots: 3/4 of the trace's request (its BDP), window-bound yet filling most of the link."""
    return max(1, (3 * demand) // 4)


def ring_probe_sizes(jobs: tuple[TraceJob, ...]) -> tuple[int, int]:
    """The ring probe's tensor sizes (elements): the trace's largest and half of it, two points spanning its jobs'
    ring steps from which the per-step overhead and per-byte cost are fitted."""
    largest = max(tj.elements for tj in jobs)
    return max(1, largest // 2), largest


@dataclass(frozen=True)
class TraceJob:
    """One job of the trace: ``workers`` hosts, ``iterations`` all-reduces of ``elements`` float32."""

    job: int
    workers: int
    elements: int
    iterations: int
    arrival_s: float
    priority: int


# The fixed trace (ESA/INAlloc style: sizes differ, two priorities, arrivals over time, later jobs overlap
# earlier ones). 16 hosts at 0.5 Mbit/s with a 40 ms round trip (BDP 15.6 slots): at most 16 x 340 = 5.4k
# gradients/s reach the switch; one all-reduce of 64 KiB takes ~1.5 s at line rate. The rate keeps the trace
# link-bound on 2 cores: an agent costs ~0.58 CPU-s to start and ~120 us per chunk, so at 1 Mbit/s 16 agents
# would need 1.3 cores for their chunks alone (docs/experiments.md). Every job has 4 workers: with 2 or 3, the ring
# moves fewer bytes than INA's framed stream.
TRACE = (
    TraceJob(1, workers=4, elements=16384, iterations=8, arrival_s=0.0, priority=LOW),
    TraceJob(2, workers=4, elements=16384, iterations=5, arrival_s=1.5, priority=LOW),
    TraceJob(3, workers=4, elements=8192, iterations=6, arrival_s=3.0, priority=HIGH),
    TraceJob(4, workers=4, elements=8192, iterations=4, arrival_s=4.5, priority=HIGH),
)
TINY_TRACE = (
    TraceJob(1, workers=2, elements=4096, iterations=3, arrival_s=0.0, priority=LOW),
    TraceJob(2, workers=2, elements=2048, iterations=3, arrival_s=0.5, priority=HIGH),
)


@dataclass(frozen=True)
class MultijobConfig:
    """Experiment 3's configuration.

    Args:
        trace: ``"full"`` (``TRACE``) or ``"tiny"`` (``TINY_TRACE``, for CI).
        supply: pool sizes as fractions of the sum of the jobs' requests (J x demand_slots).
        policies: controller policies and baselines (equal, first-fit, weighted, priority, static, fcfs).
        demand_slots: slots each job asks for: its bandwidth-delay product.
        bw_mbps, rtt_ms: every host link (Mbit/s) and the round trip added between a worker and the switch.
        repetitions: runs of the whole trace per (pool, policy).
        simulate: run the same traces through ina-sim and compare.
        calibration: an ina-sim configuration whose [calibration] to use instead of measuring one (probes on a 2-host
            star), e.g. another run's calibration.toml.

    Every run's agents start (their processes and imports, ``topologies.experiments.warm_agent``) before the
    trace's clock starts (``Testbed.prestart``), as on a cluster whose workers each have a host of their own: a
    job's completion time then holds its own work, not the start-up of every agent on the testbed's shared cores.
    """

    trace: str = "full"
    supply: tuple[float, ...] = (1.0, 0.5, 0.25)
    policies: tuple[str, ...] = POLICIES + BASELINES
    demand_slots: int = 16
    bw_mbps: float = 0.5
    rtt_ms: float = 40.0
    repetitions: int = 3
    simulate: bool = True
    calibration: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "supply", tuple(float(s) for s in self.supply))
        object.__setattr__(self, "policies", tuple(self.policies))
        if self.trace not in ("full", "tiny"):
            raise ValueError(f"trace must be full or tiny, got {self.trace!r}")
        if any(not 0 < s <= 1 for s in self.supply) or not self.supply:
            raise ValueError(f"supply fractions must be in (0, 1], got {list(self.supply)}")
        bad = [p for p in self.policies if p not in POLICIES + BASELINES]
        if bad or not self.policies:
            raise ValueError(f"policies must be some of {', '.join(POLICIES + BASELINES)}, got {list(self.policies)}")
        if self.demand_slots < 1 or self.repetitions < 1 or not self.bw_mbps > 0 or not self.rtt_ms >= 0:
            raise ValueError("demand_slots, repetitions >= 1, bw_mbps > 0, rtt_ms >= 0")
        if len(self.jobs) * self.demand_slots > 1024:
            raise ValueError("jobs x demand_slots must fit the switch's 1024 slots")

    @property
    def jobs(self) -> tuple[TraceJob, ...]:
        return TRACE if self.trace == "full" else TINY_TRACE


def pool_size(jobs: int, demand: int, supply: float) -> int:
    return math.floor(jobs * demand * supply + 1e-9)


def controller_policy(policy: str) -> str:
    """The controller policy a baseline runs on (both are first-fit with other requests)."""
    return "first-fit" if policy in BASELINES else policy


def job_request(policy: str, demand: int, pool: int, jobs: int) -> tuple[int, int]:
    """(requested slots, min_slots) a job asks for under ``policy``."""
    if policy == "static":
        share = max(1, pool // jobs)
        return share, share
    if policy == "fcfs":
        return demand, demand
    return demand, 1


@register
class MultijobExperiment(Experiment):
    name = "multijob"
    aliases = ("exp3",)
    title = "A job trace sharing switch memory: completion time per priority, per policy and pool size"
    Config = MultijobConfig
    anchors = (
        Anchor("ESA", 'Wang et al., "Efficient Data-Plane Memory Scheduling for In-Network Aggregation" '
               "(arXiv 2201.06398)",
               "preemptive aggregator allocation with priorities: average job completion time improved by up to 1.35x",
               "the priority policy's high-priority mean JCT against the static partition's, at a pool of 50 %"),
        Anchor("ATP", 'Lao et al., "ATP: In-network Aggregation for Multi-tenant Learning", NSDI 2021',
               "multi-tenant, best-effort aggregation with fallback to a parameter server; throughput +38 % to +66 % "
               "over the baselines it compares with",
               "switch memory shared across the trace's jobs, a job without slots falling back to the ring"),
        Anchor("INAlloc", "switch memory allocation for INA jobs", "job completion time about 27 % lower than its "
               "baselines", "every policy's mean JCT per pool size; the same trace through ina-sim"),
    )
    targets = (
        Target("at a pool of 50 %, the best policy's mean JCT within 15 % of unlimited memory (first-fit at 100 %)",
               "targets.best_vs_unlimited", Comparison.AT_MOST, 1.15),
        Target("at a pool of 50 %, the static partition measurably worse: its mean JCT beyond the best policy's "
               "15 % of unlimited memory", "targets.static_vs_unlimited", Comparison.AT_LEAST, 1.15),
        Target("at a pool of 50 %, the priority policy's high-priority mean JCT at least 1.35x better than the "
               "static partition's (ESA's figure)", "targets.priority_high_speedup_over_static", Comparison.AT_LEAST,
               1.35),
        Target(f"every job's testbed busy time within {TOLERANCE * 100:g} % of ina-sim's prediction",
               "simulator.max_abs_rel_diff", Comparison.AT_MOST, TOLERANCE, fmt=".0%"),
    )
    repetition_key = "rep"
    options = (
        ("--supply", "supply", "floats", "pool as fractions of the summed requests"),
        ("--policies", "policies", "strs", "policies and the baselines static and fcfs"),
        ("--demand", "demand_slots", int, "slots each job asks for (its BDP)"),
        ("--bw", "bw_mbps", float, "link bandwidth, Mbit/s"),
        ("--repetitions", "repetitions", int, "runs of the trace per pool and policy"),
        ("--calibration", "calibration", str, "ina-sim [calibration] TOML such as a run's calibration.toml (none: measure one)"),
        ("--no-simulate", "simulate", "false", "skip the ina-sim comparison"),
    )

    @classmethod
    def presets(cls) -> dict[str, MultijobConfig]:
        return {
            "tiny": MultijobConfig(trace="tiny", supply=(1.0, 0.5), policies=("first-fit", "priority", "static"),
                                   demand_slots=8, bw_mbps=2.0, rtt_ms=4.0, repetitions=1),
            "small": MultijobConfig(supply=(1.0, 0.5), repetitions=1),
            "full": MultijobConfig(),
        }

    # --- measuring -------------------------------------------------------------------------------------
    def scenarios(self) -> list[tuple[float, str, int]]:
        """(supply, policy, repetition) in run order."""
        return [(s, p, k) for k in range(1, self.config.repetitions + 1) for s in self.config.supply
                for p in self.config.policies]

    def jobs_for(self, supply: float, policy: str, run: int) -> list[AgentJob]:
        cfg = self.config
        pool = pool_size(len(cfg.jobs), cfg.demand_slots, supply)
        requested, min_slots = job_request(policy, cfg.demand_slots, pool, len(cfg.jobs))
        out, first = [], 1
        for tj in cfg.jobs:
            args = ("--elements", str(tj.elements), "--iterations", str(tj.iterations), "--warmup", "0", "--check")
            out.append(AgentJob(f"mj{run}-j{tj.job}", tuple(f"h{first + i}" for i in range(tj.workers)), "allreduce",
                                backend="auto", args=args, requested_slots=requested, min_slots=min_slots,
                                udp_port=INA_UDP_BASE + run, priority=tj.priority,
                                weight=2.0 if tj.priority == HIGH else 1.0, tensor_elements=tj.elements))
            first += tj.workers
        return out

    def run(self) -> None:
        from topologies.topos import StarTopo

        cfg, ctx = self.config, self.ctx
        scenarios = self.scenarios()
        hosts = sum(tj.workers for tj in cfg.jobs)
        ctx.progress(f"trace of {len(cfg.jobs)} jobs on a star of {hosts} hosts, {cfg.bw_mbps:g} Mbit/s links, "
                     f"{cfg.rtt_ms:g} ms round trip (BDP {bdp_slots(cfg.rtt_ms, cfg.bw_mbps):.1f} slots)")
        self._cal_path: Path | None = None
        probes: list[dict] | None = None
        if cfg.simulate:  # the probes first, so that they see the machine as the trace's runs do
            probes = self.calibration_probes()
        numbered = list(enumerate(scenarios, start=1))
        for repetition in range(1, cfg.repetitions + 1):
            with ctx.testbed(StarTopo(hosts, bw=cfg.bw_mbps, rtt_ms=cfg.rtt_ms), "trace") as bed:
                if probes is not None and not cfg.calibration:  # the trace's probes on its own star, each repetition
                    probes += self.trace_probes(bed)
                self._run_scenarios(bed, [(run, sc) for run, sc in numbered if sc[2] == repetition])
        if probes is not None:
            self._cal_path = self.write_calibration(probes)
        if cfg.simulate:
            self.simulate()

    def _run_scenarios(self, bed: Any, scenarios: list[tuple[int, tuple[float, str, int]]]) -> None:
        """Run the trace once per (run number, (supply, policy, repetition)) on the started trace star."""
        cfg, ctx = self.config, self.ctx
        total = len(self.scenarios())
        for run, (supply, policy, rep) in scenarios:
            pool = pool_size(len(cfg.jobs), cfg.demand_slots, supply)
            label = f"supply={supply:.0%} pool={pool} policy={policy} rep={rep}"
            ctx.progress(f"{label} ({run}/{total})")
            bed.start_controller(pool=pool, policy=controller_policy(policy))
            jobs = self.jobs_for(supply, policy, run)
            arrivals = {job.name: tj.arrival_s for job, tj in zip(jobs, cfg.jobs)}
            memory: list[tuple[float, int]] = []

            def sample(t: float, memory: list[tuple[float, int]] = memory) -> None:
                state = bed.controller_state()
                if state:
                    memory.append((round(t, 3), sum(_granted_slots(state).values())))

            try:
                bed.prestart(jobs)  # the agents' processes and imports before the trace's clock starts
            except AgentFailure as exc:
                ctx.error(f"{label}: {exc}")
                ctx.record({"kind": "job", "supply": supply, "pool": pool, "policy": policy, "rep": rep, "error": str(exc)})
                bed.end_warm(jobs)
                continue
            conditions = Conditions(switch_pids=[sw.process.pid for sw in bed.net.switches if sw.process],
                                    controller_pids=[bed.controller.pid] if bed.controller else [],
                                    prestarted_pids=bed.warm_pids(), bw_mbps=cfg.bw_mbps,
                                    rtt_ms=cfg.rtt_ms, window_slots=job_request(policy, cfg.demand_slots, pool, len(jobs))[0],
                                    jobs=len(jobs), workers=sum(len(j.hosts) for j in jobs))
            try:
                with conditions:
                    results = bed.run_trace(jobs, arrivals, on_sample=sample)
            except AgentFailure as exc:
                ctx.error(f"{label}: {exc}")
                ctx.record({"kind": "job", "supply": supply, "pool": pool, "policy": policy, "rep": rep, "error": str(exc)})
                continue
            ctx.record({"kind": "memory", "supply": supply, "pool": pool, "policy": policy, "rep": rep, "samples": memory,
                        "conditions": conditions.result})
            for job, tj in zip(jobs, cfg.jobs):
                workers = results[job.name]
                row = allreduce_row(workers, kind="job", supply=supply, pool=pool, policy=policy, rep=rep, job=tj.job,
                                    workers=tj.workers, demand=cfg.demand_slots, priority=tj.priority,
                                    requested=job.requested_slots, arrival_s=tj.arrival_s)
                calls = row["seconds"]
                row["busy_s"] = sum(calls) if calls else None
                exited = max(w["runner"]["exited_s"] for w in workers)
                row["jct_s"] = exited - tj.arrival_s
                row.update(_joined(workers, calls, exited))
                row.update(_steady(calls, exited))
                row["backends"] = _history(workers)
                row["phases_s"] = job_phases(workers, tj.arrival_s)
                row["pauses"] = [(w.get("stats") or {}).get("pauses") or [] for w in workers]  # per worker, per move
                ctx.record(row)
            done = [r for r in ctx.rows if r.get("kind") == "job" and r.get("supply") == supply and r.get("policy") == policy
                    and r.get("rep") == rep and not r.get("error")]
            ctx.progress("  " + "; ".join(f"job {r['job']} (p{r['priority']}): JCT {r['jct_s']:.2f} s, busy {r['busy_s']:.2f} s, "
                                          f"{'/'.join(r['backends'])}{_phases_text(r.get('phases_s'))}" for r in done))

    # --- the simulator ---------------------------------------------------------------------------------
    def calibration_probes(self) -> list[dict] | None:
        """The probes measured once: the unshaped two-worker probes and an agent's start-up CPU ([] when a
        calibration file is given; None when they failed: no comparison then)."""
        from topologies.experiments.calibrate import run_probes, run_startup_probe
        from topologies.topos import StarTopo

        ctx, cfg = self.ctx, self.config
        if cfg.calibration:
            return []
        try:
            with ctx.testbed(StarTopo(2), "calibration-unshaped") as bed:
                probes = run_probes(bed, elements=max(tj.elements for tj in cfg.jobs), iterations=3,
                                    udp_port=INA_UDP_BASE + 900, record=ctx.record, progress=ctx.progress)
        except AgentFailure as exc:
            ctx.error(f"calibration probes: {exc}")
            return None
        probes.append(run_startup_probe(repeats=3, record=ctx.record, progress=ctx.progress))
        return probes

    def trace_probes(self, bed: Any) -> list[dict]:
        """The probes on the trace's own star (``bed``: its switch, links, round trip), before each repetition's
        runs: the trace's process conditions, with a controller whose pool grants every probe job its slots.
        One job's window round trip (window_probe_slots, window-bound), then the shared ceiling: the trace's jobs
        all at once, each with the largest tensor, the trace's request (its BDP), ``--check`` and the
        controller polled as in the trace. The calibration takes their medians over the repetitions; none of
        it comes from the trace's own runs, which the comparison predicts."""
        from topologies.experiments.calibrate import (
            run_lifecycle_probe,
            run_ring_probe,
            run_shared_probe,
            run_window_probe,
        )

        ctx, cfg = self.ctx, self.config
        elements = max(tj.elements for tj in cfg.jobs)
        jobs = [dataclasses.replace(job, args=("--elements", str(elements), "--iterations", str(SHARED_CALLS),
                                               "--warmup", "1", "--check"))
                for job in self.jobs_for(1.0, "first-fit", 0)]
        bed.start_controller(pool=len(jobs) * cfg.demand_slots, policy="first-fit")

        def poll(t: float) -> None:  # what the trace's memory sampling costs
            bed.controller_state()

        try:
            lifecycle = run_lifecycle_probe(bed, jobs[0].hosts, udp_port=INA_UDP_BASE + 930, record=ctx.record,
                                            progress=ctx.progress, args=("--check",))
            window = run_window_probe(bed, jobs[0].hosts, elements=elements, iterations=3,
                                      slots=window_probe_slots(cfg.demand_slots), rtt_ms=cfg.rtt_ms, bw_mbps=cfg.bw_mbps,
                                      udp_port=INA_UDP_BASE + 940, record=ctx.record, progress=ctx.progress, args=("--check",))
            ring = run_ring_probe(bed, jobs[0].hosts, sizes=ring_probe_sizes(cfg.jobs), iterations=3, rtt_ms=cfg.rtt_ms,
                                  bw_mbps=cfg.bw_mbps, udp_port=INA_UDP_BASE + 960, record=ctx.record, progress=ctx.progress,
                                  args=("--check",))
            shared = run_shared_probe(bed, jobs, slots=cfg.demand_slots, udp_port=INA_UDP_BASE + 950, record=ctx.record,
                                      progress=ctx.progress, bw_mbps=cfg.bw_mbps, rtt_ms=cfg.rtt_ms, on_sample=poll)
        except AgentFailure as exc:
            ctx.error(f"calibration probes on the trace's star: {exc}")
            return []
        cond = shared.get("conditions") or {}
        ctx.progress(f"  shared ceiling {shared.get('gradients_per_s') or 0:.0f} gradients/s; cores busy "
                     f"{cond.get('busy_cores', 0):.2f} (switch {cond.get('switch_cores', 0):.2f}, agents "
                     f"{cond.get('agents_cores', 0):.2f}, others {cond.get('others_cores', 0):.2f}), load "
                     f"{cond.get('loadavg_start', 0):.1f}-{cond.get('loadavg_end', 0):.1f}")
        return [lifecycle, window, *ring, shared]

    def write_calibration(self, probes: list[dict]) -> Path:
        """calibration.toml (ina-sim's [calibration]): the given file's, or the probes' (medians of the repeated trace
        probes, the lab's measurements mapped onto the cluster model)."""
        ctx, cfg = self.ctx, self.config
        path = ctx.out_dir / "calibration.toml"
        if cfg.calibration:
            try:
                return write_calibration(LabCalibration(model=read_calibration(Path(cfg.calibration))), path)
            except ConfigError as exc:
                raise ExperimentError(str(exc)) from None
        repeats = sum(1 for r in probes if r.get("probe") == "ina-shared-pps")
        pauses = move_pauses([r for r in ctx.rows if r.get("kind") == "job"])
        pause = median(pauses) if pauses else None
        lab = calibration_from(probes, ring_goodput=None, rtt_ms=cfg.rtt_ms, realloc_pause_s=pause,
                               source=f"ina-exp multijob ({ctx.options.switch}): unshaped 2-worker probes; window probe "
                                      f"({window_probe_slots(cfg.demand_slots)} slots) and shared ceiling on the trace's own star "
                                      f"({cfg.bw_mbps:g} Mbit/s, {cfg.demand_slots} slots, --check, controller polled), its capacity from the probe's CPU per gradient and the cores left to it; medians of {repeats} probe sets, one before each "
                                      f"repetition; {cfg.rtt_ms:g} ms round trip carried; move pause the median of "
                                      f"{len(pauses)} moves' in the trace's rows (the agents' pause stats); {ctx.out_dir.name}")
        return write_calibration(lab, path)

    def simulate(self) -> None:
        ctx, cfg = self.ctx, self.config
        measured = [r for r in ctx.rows if r.get("kind") == "job" and r.get("busy_steady_s")]
        cal_path = getattr(self, "_cal_path", None)
        if not measured or cal_path is None:
            return
        ctx.store.doc["files"]["calibration"] = cal_path.name
        calibration = read_calibration(cal_path)
        ctx.progress(f"ina-sim: the same traces with {cal_path.name}")
        sim_dir = ctx.out_dir / "sim"
        for (supply, pool, policy), rows in sorted(group_by(measured, "supply", "pool", "policy").items(),
                                                   key=lambda kv: (-kv[0][0], kv[0][2])):
            requested, min_slots = job_request(policy, cfg.demand_slots, pool, len(cfg.jobs))
            startup = {job[0]: median(r["steady_from_s"] - r["arrival_s"] for r in rs) for job, rs in group_by(rows, "job").items()}
            label = f"pool{pool}-{policy}"
            predicted = simulate_trace(cfg.jobs, requested=requested, min_slots=min_slots, pool=pool,
                                       policy=controller_policy(policy), bw_mbps=cfg.bw_mbps, calibration=calibration,
                                       out=sim_dir / label, startup=startup, skip_first=True,
                                       record=lambda config, label=label: ctx.simulated(label, config))
            for job, rs in sorted(group_by(rows, "job").items()):
                sim = predicted.get(job[0])
                if sim is None or not sim["busy_s"]:
                    continue
                busy = median(r["busy_steady_s"] for r in rs)
                diff = (busy - sim["busy_s"]) / sim["busy_s"]
                ctx.record({"kind": "sim", "supply": supply, "pool": pool, "policy": policy, "job": job[0],
                            "testbed_s": busy, "sim_s": sim["busy_s"], "rel_diff": diff, "sim_backend": sim["final_backend"],
                            "sim_history": sim["history"], "within_tolerance": abs(diff) <= TOLERANCE})
        sims = [r for r in ctx.rows if r.get("kind") == "sim"]
        if sims:
            worst = max(abs(r["rel_diff"]) for r in sims)
            ctx.progress(f"testbed vs ina-sim: {sum(r['within_tolerance'] for r in sims)}/{len(sims)} jobs within "
                         f"±{TOLERANCE:.0%}, largest difference {worst:.1%}")

    # --- results ---------------------------------------------------------------------------------------
    @staticmethod
    def summarize(rows: list[dict], config: MultijobConfig) -> dict:
        runs = []
        jobs = [r for r in rows if r.get("kind") == "job" and r.get("jct_s") is not None]
        for (supply, pool, policy), rs in sorted(group_by(jobs, "supply", "pool", "policy").items(),
                                                 key=lambda kv: (-kv[0][0], str(kv[0][2]))):
            entry: dict[str, Any] = {"supply": supply, "pool": pool, "policy": policy,
                                     "repetitions": len({r.get("rep") for r in rs})}
            for name, prio in (("all", None), ("high", HIGH), ("low", LOW)):
                per_rep = []
                for rr in group_by([r for r in rs if prio is None or r["priority"] == prio], "rep").values():
                    jcts = sorted(r["jct_s"] for r in rr)
                    per_rep.append((sum(jcts) / len(jcts), _p95(jcts)))
                if per_rep:
                    means, p95s = [m for m, _ in per_rep], [p for _, p in per_rep]
                    entry[f"{name}_mean_jct_s"] = median(means)
                    entry[f"{name}_mean_jct_min_s"], entry[f"{name}_mean_jct_max_s"] = min(means), max(means)
                    entry[f"{name}_p95_jct_s"] = median(p95s)
                    busy = [sum(r["busy_s"] for r in rr) / len(rr) for _, rr in
                            group_by([r for r in rs if (prio is None or r["priority"] == prio) and r.get("busy_s")], "rep").items()]
                    entry[f"{name}_mean_busy_s"] = median(busy)  # the same without agent start-up and exit
                    phased = [r for r in rs if (prio is None or r["priority"] == prio) and r.get("phases_s")]
                    if phased:  # each phase: the median over the repetitions of its mean over the jobs
                        entry[f"{name}_phases_s"] = {
                            k: median(sum(r["phases_s"][k] for r in rr) / len(rr) for _, rr in group_by(phased, "rep").items())
                            for k in PHASES}
            entry["jct_s"] = {r["job"]: median(x["jct_s"] for x in rs if x["job"] == r["job"]) for r in rs}
            entry["busy_s"] = {r["job"]: median(x["busy_s"] for x in rs if x["job"] == r["job"]) for r in rs}
            loads = [r["conditions"] for r in rows if r.get("kind") == "memory" and r.get("conditions")
                     and r.get("supply") == supply and r.get("policy") == policy]
            for key in ("busy_cores", "others_cores", "agents_cores", "switch_cores"):  # the machine during its runs
                if loads:
                    entry[key] = median(c[key] for c in loads)
            runs.append(entry)
        probes = [r for r in rows if r.get("kind") == "probe" and r.get("conditions")]
        memory = [{"supply": r["supply"], "policy": r["policy"], "rep": r.get("rep"), "samples": r["samples"]}
                  for r in rows if r.get("kind") == "memory"]
        sims = [r for r in rows if r.get("kind") == "sim" and r.get("rel_diff") is not None]
        sim = {}
        if sims:
            diffs = [abs(r["rel_diff"]) for r in sims]
            sim = {"tolerance": TOLERANCE, "jobs_compared": len(sims),
                   "within_tolerance": sum(1 for d in diffs if d <= TOLERANCE),
                   "median_abs_rel_diff": median(diffs), "max_abs_rel_diff": max(diffs),
                   "p95_abs_rel_diff": _p95(diffs),
                   "per_run": [{k: r[k] for k in ("supply", "policy", "job", "testbed_s", "sim_s", "rel_diff")} for r in sims],
                   **_per_repetition(rows, sims)}
        targets = _targets(runs)
        reps = sorted({r.get("rep") for r in jobs if r.get("rep") is not None})
        if len(reps) > 1:  # each repetition against its own unlimited run
            targets["per_repetition"] = [{"rep": k, **_targets(MultijobExperiment.summarize(
                [r for r in rows if r.get("kind") == "job" and r.get("rep") == k], config)["runs"])} for k in reps]
        pauses = move_pauses(jobs)
        return {"trace": [vars(tj) for tj in config.jobs], "bdp_slots": bdp_slots(config.rtt_ms, config.bw_mbps),
                "runs": runs, "targets": targets, "memory": memory, "simulator": sim,
                "move_pauses": {"moves": len(pauses), "median_s": median(pauses) if pauses else None,
                                "max_s": max(pauses, default=None)},
                "ring_steps": ring_steps_summary(rows, config.bw_mbps),
                "probes": [{"probe": r["probe"], "gradients_per_s": r.get("gradients_per_s"),
                            "seconds_median": r.get("seconds_median"), "cpu_s_per_agent": r.get("cpu_s_per_agent"),
                            **shared_cpu_summary(r),
                            **{k: r["conditions"].get(k) for k in ("busy_cores", "others_cores", "agents_cores",
                                                                   "switch_cores", "loadavg_start")}} for r in probes],
                "errors": sum(1 for r in rows if r.get("error"))}

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = []
        for run in summary.get("runs", []):
            def fig(name: str, run: dict = run) -> str:
                if run.get(f"{name}_mean_jct_s") is None:
                    return f"{name} -"
                return (f"{name} mean {run[f'{name}_mean_jct_s']:.2f} s [{run[f'{name}_mean_jct_min_s']:.2f}-"
                        f"{run[f'{name}_mean_jct_max_s']:.2f}] p95 {run[f'{name}_p95_jct_s']:.2f} s")
            lines.append(f"supply {run['supply']:.0%} (pool {run['pool']}) {run['policy']} ({run['repetitions']} runs): "
                         f"JCT {fig('all')}; {fig('high')}; {fig('low')}")
        t = summary.get("targets") or {}
        if t.get("best_policy"):
            lines.append(f"at 50 %: best policy {t['best_policy']} mean JCT {t['best_vs_unlimited']:.2f}x unlimited "
                         f"(target <= 1.15: {'met' if t['best_within_15pct'] else 'MISSED'})")
        if t.get("static_vs_unlimited") is not None:
            lines.append(f"at 50 %: static partition mean JCT {t['static_vs_unlimited']:.2f}x unlimited")
        if t.get("priority_high_speedup_over_static") is not None:
            lines.append(f"at 50 %: priority policy's high-priority mean JCT {t['priority_high_speedup_over_static']:.2f}x "
                         f"better than static (target >= 1.35: {'met' if t['priority_high_speedup_over_static'] >= 1.35 else 'MISSED'})")
        for rep in t.get("per_repetition", []):
            figures = [f"{k} {rep[k]:.2f}" for k in ("best_vs_unlimited", "static_vs_unlimited",
                                                     "priority_high_speedup_over_static") if rep.get(k) is not None]
            if figures:
                lines.append(f"  repetition {rep['rep']}: " + ", ".join(figures))
        for run in summary.get("runs", []):
            if run.get("high_phases_s"):
                lines.append(f"supply {run['supply']:.0%} {run['policy']}: high-priority JCT phases (s){_phases_text(run['high_phases_s'])}")
        moves = summary.get("move_pauses") or {}
        if moves.get("moves"):
            lines.append(f"moves of running jobs: {moves['moves']}, pause (slowest worker back where it stopped) median "
                         f"{moves['median_s'] * 1e3:.0f} ms, max {moves['max_s'] * 1e3:.0f} ms")
        ring = summary.get("ring_steps") or {}
        if ring.get("call_s"):
            calls = ", ".join(f"{int(e) * 4 // 1024} KiB {s:.3f} s" for e, s in ring["call_s"].items())
            fitted = (f"step overhead {ring['overhead_us'] / 1000:.1f} ms, goodput {ring['goodput_fraction']:.3f} of the link"
                      if ring.get("overhead_us") is not None else "no fit")
            lines.append(f"ring probe ({ring['workers']} workers): {calls}; {fitted}")
        sim = summary.get("simulator")
        if sim:
            lines.append(f"testbed vs ina-sim: {sim['within_tolerance']}/{sim['jobs_compared']} jobs within ±{sim['tolerance']:.0%} "
                         f"(median |diff| {sim['median_abs_rel_diff']:.1%}, p95 {sim.get('p95_abs_rel_diff', 0.0):.1%}, "
                         f"max {sim['max_abs_rel_diff']:.1%})")
            for rep in sim.get("per_repetition", []):
                lines.append(f"  repetition {rep['rep']}: {rep['within_tolerance']}/{rep['jobs']} within (median "
                             f"{rep['median_abs_rel_diff'] or 0:.1%}), other work on the machine: median "
                             f"{rep['others_cores_median'] or 0:.2f} cores")
            background = sim.get("by_background") or {}
            for name, sign in (("quiet", "<="), ("loaded", ">")):
                b = background.get(name) or {}
                if b.get("jobs"):
                    lines.append(f"  {name} runs (other work {sign} {background['quiet_cores']:g} cores): "
                                 f"{b['within_tolerance']}/{b['jobs']} within (median {b['median_abs_rel_diff']:.1%})")
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: MultijobConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        runs = summary.get("runs", [])
        sims = (summary.get("simulator") or {}).get("per_run", [])
        fig, axes = figure(4, 1, width=4.4, height=3.6)
        ax_h, ax_l, ax_m, ax_s = axes[0]
        policies = [p for p in POLICIES + BASELINES if any(r["policy"] == p for r in runs)]
        colors = {**COLORS, "static": "#ff7f0e", "fcfs": "#7f7f7f"}
        for ax, name, title in ((ax_h, "high", "high priority"), (ax_l, "low", "low priority")):
            for p in policies:
                pts = sorted((r for r in runs if r["policy"] == p and r.get(f"{name}_mean_jct_s") is not None),
                             key=lambda r: r["supply"])
                if not pts:
                    continue
                xs = [r["supply"] * 100 for r in pts]
                ys = [r[f"{name}_mean_jct_s"] for r in pts]
                ax.errorbar(xs, ys, yerr=[[y - r[f"{name}_mean_jct_min_s"] for y, r in zip(ys, pts)],
                                          [r[f"{name}_mean_jct_max_s"] - y for y, r in zip(ys, pts)]],
                            marker="o", capsize=3, color=colors.get(p), label=p)
                ax.plot(xs, [r[f"{name}_p95_jct_s"] for r in pts], ls=":", marker="x", color=colors.get(p), alpha=0.6)
            ax.set_title(f"{title}: mean JCT (solid), p95 (dotted)", fontsize=9)
            ax.set_xlabel("pool (% of summed BDP requests)")
            ax.set_ylabel("job completion time (s)")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            legend(ax, fontsize=7)
        half = min((r["supply"] for r in summary.get("memory", [])), key=lambda s: abs(s - 0.5), default=None)
        for m in summary.get("memory", []):
            if m["supply"] == half and m.get("rep") in (1, None) and m["samples"]:
                ts, slots = zip(*m["samples"])
                ax_m.step(ts, slots, where="post", color=colors.get(m["policy"]), label=m["policy"])
        ax_m.set_title(f"switch memory in use, pool {half:.0%}" if half is not None else "switch memory in use", fontsize=9)
        ax_m.set_xlabel("time since the first arrival (s)")
        ax_m.set_ylabel("slots granted")
        ax_m.grid(alpha=0.3)
        legend(ax_m, fontsize=7)
        if sims:
            hi = max(max(r["testbed_s"], r["sim_s"]) for r in sims) * 1.1
            lo = min(min(r["testbed_s"], r["sim_s"]) for r in sims) * 0.8
            ax_s.plot([lo, hi], [lo, hi], color="#444444", lw=0.8)
            ax_s.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)], [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)],
                              color="#cccccc", alpha=0.5, label=f"±{TOLERANCE:.0%}")
            for p in policies:
                pts = [r for r in sims if r["policy"] == p]
                if pts:
                    ax_s.scatter([r["sim_s"] for r in pts], [r["testbed_s"] for r in pts], color=colors.get(p), label=p, s=18)
            ax_s.set_xlim(lo, hi)
            ax_s.set_ylim(lo, hi)
            ax_s.set_xlabel("ina-sim prediction (s)")
            ax_s.set_ylabel("testbed busy time (s)")
            ax_s.set_title("each job: testbed vs simulator", fontsize=9)
            ax_s.grid(alpha=0.3)
            legend(ax_s, fontsize=7)
        else:
            ax_s.axis("off")
        note(fig, f"trace of {len(config.jobs)} jobs (docs/experiments.md), each asks {config.demand_slots} slots (its BDP); "
                  f"{config.bw_mbps:g} Mbit/s links, {config.rtt_ms:g} ms round trip; static: pool/J each, no reallocation; "
                  f"fcfs: whole request or ring")
        save(fig, path, "Job trace sharing switch memory")


QUIET_CORES = 0.1  # a trace run beside at most this much other work on the machine (conditions.others_cores) is quiet


def _per_repetition(rows: list[dict], sims: list[dict]) -> dict:
    """Each repetition's jobs against the same predictions (the simulator's per pool, policy and job), with the
    machine's load in its runs; and the runs split by the other work on the machine (``QUIET_CORES``): what the
    comparison shows apart from the background the testbed shares the machine with."""
    predicted = {(r["supply"], r["policy"], r["job"]): r["sim_s"] for r in sims}
    others = {(r["supply"], r["policy"], r.get("rep")): (r.get("conditions") or {}).get("others_cores")
              for r in rows if r.get("kind") == "memory"}
    by_rep: dict[Any, list[float]] = {}
    by_load: dict[str, list[float]] = {"quiet": [], "loaded": []}
    loads: dict[Any, list[float]] = {}
    for r in rows:
        key = (r.get("supply"), r.get("policy"), r.get("job"))
        if r.get("kind") != "job" or not r.get("busy_steady_s") or key not in predicted:
            continue
        diff = abs(r["busy_steady_s"] - predicted[key]) / predicted[key]
        by_rep.setdefault(r.get("rep"), []).append(diff)
        load = others.get((r.get("supply"), r.get("policy"), r.get("rep")))
        if load is not None:
            by_load["quiet" if load <= QUIET_CORES else "loaded"].append(diff)
    for (_, _, rep), load in others.items():
        if load is not None:
            loads.setdefault(rep, []).append(load)

    def stats(diffs: list[float]) -> dict:
        return {"jobs": len(diffs), "within_tolerance": sum(1 for d in diffs if d <= TOLERANCE),
                "median_abs_rel_diff": median(diffs), "p95_abs_rel_diff": _p95(diffs) if diffs else None}

    return {"per_repetition": [{"rep": rep, **stats(d), "others_cores_median": median(loads.get(rep, [])),
                                "others_cores_max": max(loads.get(rep, []), default=None)} for rep, d in sorted(by_rep.items())],
            "by_background": {"quiet_cores": QUIET_CORES, **{k: stats(v) for k, v in by_load.items()}}}


def _p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank) of a small sample."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _targets(runs: list[dict]) -> dict:
    """The experiment's targets at 50 % of the summed requests, against unlimited memory (first-fit at 100 %)."""
    def at(supply: float, policy: str) -> dict | None:
        return next((r for r in runs if abs(r["supply"] - supply) < 1e-9 and r["policy"] == policy), None)

    unlimited = at(1.0, "first-fit") or next((r for r in runs if abs(r["supply"] - 1.0) < 1e-9), None)
    half = [r for r in runs if abs(r["supply"] - 0.5) < 1e-9 and r.get("all_mean_jct_s")]
    out: dict[str, Any] = {}
    static, prio = at(0.5, "static"), at(0.5, "priority")
    if static and prio and static.get("high_mean_jct_s") and prio.get("high_mean_jct_s"):  # needs no unlimited run
        out["priority_high_speedup_over_static"] = static["high_mean_jct_s"] / prio["high_mean_jct_s"]
    if not unlimited or not half or not unlimited.get("all_mean_jct_s"):
        return out
    ref = unlimited["all_mean_jct_s"]
    best = min((r for r in half if r["policy"] in POLICIES), key=lambda r: r["all_mean_jct_s"], default=None)
    if best:
        out.update(best_policy=best["policy"], best_vs_unlimited=best["all_mean_jct_s"] / ref,
                   best_within_15pct=best["all_mean_jct_s"] / ref <= 1.15)
    if static and static.get("all_mean_jct_s"):
        out["static_vs_unlimited"] = static["all_mean_jct_s"] / ref
    return out


def _joined(workers: list[dict], calls: list[float], exited: float) -> dict:
    """The job's all-reduce time once its last worker joined, and when that was (seconds after the trace
    start): a worker's first call includes waiting for the job's slower-starting agents (process start-up
    skew, 0.1-1 s under load), so the first call counts as its shortest worker's (the last to join, who
    waits for nobody); the later calls as their slowest worker's (``per_call_max``)."""
    firsts = [w["seconds"][0] for w in workers if w.get("seconds")]
    if not calls or not firsts:
        return {"busy_joined_s": None, "joined_s": None}
    busy = sum(calls) - calls[0] + min(firsts)
    return {"busy_joined_s": busy, "joined_s": max(0.0, exited - busy)}


def _steady(calls: list[float], exited: float) -> dict:
    """The job's all-reduce time after its first call, and when that began (seconds after the trace start).

    The first call is the job's warm-up: it waits for the job's slower-starting agents and carries their
    first grant synchronisation (0.3-2 s under load, even for the last agent to join: ``_joined``); the
    other experiments time calls after one warm-up too. The comparison with ina-sim uses the rest."""
    if len(calls) < 2:
        return {"busy_steady_s": None, "steady_from_s": None}
    busy = sum(calls[1:])
    return {"busy_steady_s": busy, "steady_from_s": max(0.0, exited - busy)}


# indices in an agent's pause record [stop, barrier, back, replayed, ring_lost, generation, kind] (docs/agent.md)
PAUSE_STOP, PAUSE_BACK, PAUSE_GENERATION, PAUSE_KIND = 0, 2, 5, 6


def move_pauses(rows: list[dict]) -> list[float]:
    """Each move's pause of a running job (seconds): from a worker's stop until it is back where the move stopped it
    (the SyncGeneration barrier and any replay), its slowest worker's. Not in it: the time from the new grant to the
    stop, in which the job still progresses (a move off the ring may finish the ring op in flight first), and the ring
    work an aborted op loses (ina-sim's ``ring_move_restarts_op``).
    One value per move, the workers' records joined on the move's generation: a move some worker did not record (a
    newer grant came before it was back) is left out, and so is a move onto the ring, whose replay is a ring op that
    ina-sim already charges as ring time."""
    out: list[float] = []
    for row in rows:
        per_worker = row.get("pauses") or []
        by_generation: dict[int, list] = {}
        for records in per_worker:
            for p in records or []:
                if isinstance(p, (list, tuple)) and len(p) > PAUSE_KIND:
                    by_generation.setdefault(int(p[PAUSE_GENERATION]), []).append(p)
        for _, move in sorted(by_generation.items()):
            if len(move) != len(per_worker) or any(p[PAUSE_KIND] == Backend.RING for p in move):
                continue
            out.append(max(float(p[PAUSE_BACK]) - float(p[PAUSE_STOP]) for p in move))
    return out


PHASES = ("launch", "imports", "join", "calls", "close", "exit")


def job_phases(workers: list[dict], arrival_s: float) -> dict[str, float] | None:
    """A job's completion time split into phases that sum to it (seconds), each ending at its slowest worker's
    mark: ``launch`` (arrival to its agents' processes being started), ``imports`` (to the last ``main``: the
    interpreter and the agent's imports), ``join`` (to the last agent joined, first grant in hand), ``calls``
    (to the last call's end), ``close`` (closing barrier and release), ``exit`` (to the last process's exit seen).
    None when an agent gave no timeline."""
    lines = [(w.get("runner") or {}).get("timeline_s") for w in workers]
    if not workers or any(not t for t in lines):
        return None
    marks = {k: max(t[k] for t in lines) if all(t.get(k) is not None for t in lines) else None
             for k in ("main", "opened", "last_call", "closed")}
    if any(v is None for v in marks.values()):
        return None
    launched = max(float(w["runner"]["launched_s"]) for w in workers)
    exited = max(float(w["runner"]["exited_s"]) for w in workers)
    points = [arrival_s, launched, marks["main"], marks["opened"], marks["last_call"], marks["closed"], exited]
    return {name: round(b - a, 3) for name, a, b in zip(PHASES, points, points[1:])}


def _phases_text(phases: dict[str, float] | None) -> str:
    return "" if not phases else " (" + " ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ")"


def _granted_slots(snapshot: dict) -> dict[str, int]:
    out = {}
    for job in snapshot.get("jobs", []):
        grant = job.get("grant", {})
        out[job.get("name")] = sum(int(s.get("num_slots", 0)) for s in grant.get("switches", []))
    return out


def _history(workers: list[dict]) -> list[str]:
    """The backends the job ran on, in order (from the agents' generation history)."""
    hist = (workers[0].get("stats") or {}).get("generation_history") or []
    out: list[str] = []
    for entry in hist:
        b = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 else str(entry)
        if not out or out[-1] != b:
            out.append(b)
    return out or [str(workers[0].get("backend"))]


def simulate_trace(jobs: tuple[TraceJob, ...], *, requested: int, min_slots: int, pool: int, policy: str, bw_mbps: float,
                   calibration: Calibration, out: Path, startup: dict[int, float] | None = None,
                   skip_first: bool = False, record: Callable[[SimConfig], None] | None = None) -> dict[int, dict]:
    """Run one trace through ina-sim (in process; its trace, per-job results and configuration written to `out`); per
    job number: jct_s (arrival to finish), busy_s (jct_s less the start-up), final_backend, history. Every job arrives at
    its time and asks ``requested`` slots (``min_slots`` at least); the testbed's star is one rack, its agents follow
    their grant. ``out/sim.toml`` is the run's whole configuration (``ina-sim run --config`` runs it again from
    ``out/trace.csv``); ``record`` is called with it.

    ``startup``: per job number, how long after its arrival its workers had all joined on the testbed (the
    trace's ``startup_s``: the job holds its slots but makes no progress). Agent start-up is the testbed's,
    not something ina-sim predicts; given it, the jobs overlap in the simulator as they did on the testbed.
    ``skip_first``: each job runs one all-reduce fewer (its first is the testbed's warm-up, ``_steady``), which runs
    within its start-up instead (trace column startup_iterations: its packets load the shared switch meanwhile)."""
    startup = startup or {}
    trace = []
    for tj in jobs:
        warmup = 1 if skip_first and tj.iterations > 1 else 0
        trace.append(JobSpec(tj.job, tj.arrival_s, tj.workers, tj.elements * 4, tj.iterations - warmup, (0.0,),
                             priority=tj.priority, slots=requested, min_slots=min_slots,
                             weight=2.0 if tj.priority == HIGH else 1.0, startup_s=round(startup.get(tj.job, 0.0), 6),
                             startup_iterations=warmup))
    rate = bw_mbps / 1000
    cluster = ClusterSpec(racks=1, workers_per_rack=sum(tj.workers for tj in jobs), slots_per_switch=pool,
                          host_gbps=rate, uplink_gbps=rate)
    config = SimConfig(policies=(policy,), placement="pack", follow_grant=True, cluster=cluster, calibration=calibration,
                       trace=out / "trace.csv", out=out, plot=False)
    result = simulate(config, policy, trace)
    out.mkdir(parents=True, exist_ok=True)
    write_trace(config.trace, trace)
    write_config(config, out / "sim.toml", f"ina-sim run --config: the simulated trace's whole configuration ({policy}, "
                                           f"pool {pool})")
    if record is not None:
        record(config)
    write_policy(out, result)
    return {r.job_id: {"jct_s": r.jct_s, "busy_s": r.jct_s - startup.get(r.job_id, 0.0),
                       "final_backend": r.history[-1][1] if r.history else "",
                       "history": "|".join(f"{t:.3f}:{b}:{s}" for t, b, s in r.history)} for r in result.jobs}
