"""Experiment 3: concurrent jobs sharing the switch's aggregator memory, per allocation policy.

J jobs of ``workers_per_job`` workers each (a star of J x W hosts, every link ``bw_mbps``) run at the
same time, each asking the switch for ``demand_slots`` slots. The switch's pool (what the controller may
hand out) is a fraction of the total demand: 100 %, 50 %, 25 % or 0 % of J x demand_slots. For each
supply and policy the controller is restarted with that pool and policy, the runner registers the jobs
in order (job 1 first: a deterministic admission order, which first-fit and priority depend on), and
then every agent starts at once and joins its job by id, so that the jobs really overlap. Job k asks with priority k-1 (later jobs are more important, so ``priority`` preempts) and
weight 2 for job 1, 1 for the others (so ``weighted`` differs from ``equal``). A job without slots runs
on the ring and is upgraded when slots free up.

Per job: the time of its all-reduces (``busy_s``, the sum of its calls, each the slowest worker's), its
throughput (tensor bytes per second), the slots it was granted when all jobs were admitted, and the
backends it ran on. Then the same scenario (same jobs, pool, link speed; constants from calibration
probes) goes through ``ina-sim``, and each job's predicted time is compared with the measured one.
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.experiments import register
from topologies.experiments.aggregate import allreduce_row, group_by, median
from topologies.errors import ExperimentError
from topologies.experiments.base import Experiment
from topologies.experiments.testbed import INA_UDP_BASE, AgentFailure, AgentJob

POLICIES = ("equal", "first-fit", "weighted", "priority")
TOLERANCE = 0.15  # stated tolerance of the testbed vs simulator comparison (relative, per job)


@dataclass(frozen=True)
class MultijobConfig:
    """Experiment 3's configuration.

    Args:
        jobs: concurrent job counts (2..4).
        workers_per_job: workers of each job (INA beats ring from 4 on with this wire format).
        supply: pool sizes as fractions of the total demand (J x demand_slots).
        policies: controller policies (equal, first-fit, weighted, priority). 0 % supply runs once.
        demand_slots: slots each job asks for.
        elements, iterations, warmup: each job's all-reduces.
        bw_mbps: every host link (Mbit/s).
        simulate: run the same scenarios through ina-sim and compare.
        calibration: a calibration JSON for ina-sim instead of measuring one (probes on a 2-host star).
    """

    jobs: tuple[int, ...] = (2, 3, 4)
    workers_per_job: int = 4
    supply: tuple[float, ...] = (1.0, 0.5, 0.25, 0.0)
    policies: tuple[str, ...] = POLICIES
    demand_slots: int = 4
    elements: int = 8192
    iterations: int = 10
    warmup: int = 1
    bw_mbps: float = 1.0
    simulate: bool = True
    calibration: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(int(j) for j in self.jobs))
        object.__setattr__(self, "supply", tuple(float(s) for s in self.supply))
        object.__setattr__(self, "policies", tuple(self.policies))
        if not self.jobs or any(not 1 <= j <= 8 for j in self.jobs):
            raise ValueError(f"jobs must be between 1 and 8, got {list(self.jobs)}")
        if any(not 0 <= s <= 1 for s in self.supply) or not self.supply:
            raise ValueError(f"supply fractions must be in [0, 1], got {list(self.supply)}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise ValueError(f"policies must be some of {', '.join(POLICIES)}, got {list(self.policies)}")
        if self.workers_per_job < 2 or self.demand_slots < 1 or self.elements < 1 or self.iterations < 1:
            raise ValueError("workers_per_job >= 2, demand_slots, elements and iterations >= 1")
        if max(self.jobs) * self.demand_slots > 1024:
            raise ValueError("jobs x demand_slots must fit the switch's 1024 slots")


def pool_size(jobs: int, demand: int, supply: float) -> int:
    return int(math.floor(jobs * demand * supply + 1e-9))


@register
class MultijobExperiment(Experiment):
    name = "multijob"
    aliases = ("exp3",)
    title = "Concurrent jobs sharing switch memory: throughput and completion time per policy and slot supply"
    Config = MultijobConfig
    options = (
        ("--jobs", "jobs", "ints", "concurrent job counts, e.g. 2,3,4"),
        ("--workers-per-job", "workers_per_job", int, "workers per job"),
        ("--supply", "supply", "floats", "pool as fractions of demand, e.g. 1,0.5,0.25,0"),
        ("--policies", "policies", "strs", "policies, e.g. equal,first-fit,weighted,priority"),
        ("--demand", "demand_slots", int, "slots each job asks for"),
        ("--elements", "elements", int, "float32 elements per all-reduce"),
        ("--iterations", "iterations", int, "all-reduces per job"),
        ("--bw", "bw_mbps", float, "link bandwidth, Mbit/s"),
        ("--calibration", "calibration", str, "ina-sim calibration JSON (default: measure one)"),
        ("--no-simulate", "simulate", "false", "skip the ina-sim comparison"),
    )

    @classmethod
    def presets(cls) -> dict[str, MultijobConfig]:
        return {
            "tiny": MultijobConfig(jobs=(2,), supply=(1.0, 0.5, 0.0), policies=("equal", "first-fit"),
                                   elements=4096, iterations=4),
            "small": MultijobConfig(jobs=(2,), supply=(1.0, 0.5, 0.25, 0.0), policies=("equal", "first-fit"),
                                    iterations=6),
            "full": MultijobConfig(),
        }

    # --- measuring -------------------------------------------------------------------------------------
    def scenarios(self) -> list[tuple[int, float, str]]:
        """(jobs, supply, policy) in run order; 0 % supply (everyone on the ring) once per job count."""
        out = []
        for J in self.config.jobs:
            for s in self.config.supply:
                if pool_size(J, self.config.demand_slots, s) == 0:
                    out.append((J, s, "none"))
                else:
                    out += [(J, s, p) for p in self.config.policies]
        return out

    def jobs_for(self, J: int, run: int) -> list[AgentJob]:
        cfg = self.config
        W = cfg.workers_per_job
        args = ("--elements", str(cfg.elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup))
        return [
            AgentJob(f"mj{run}-j{k}", tuple(f"h{(k - 1) * W + i}" for i in range(1, W + 1)), "allreduce", backend="auto",
                     args=args, requested_slots=cfg.demand_slots, udp_port=INA_UDP_BASE + run,
                     priority=k - 1, weight=2.0 if k == 1 else 1.0, tensor_elements=cfg.elements)
            for k in range(1, J + 1)
        ]

    def run(self) -> None:
        from topologies.topos import StarTopo

        cfg, ctx = self.config, self.ctx
        scenarios = self.scenarios()
        run = 0
        for J in cfg.jobs:
            mine = [sc for sc in scenarios if sc[0] == J]
            ctx.progress(f"J={J}: star of {J * cfg.workers_per_job} hosts, {cfg.bw_mbps:g} Mbit/s links")
            with ctx.testbed(StarTopo(J * cfg.workers_per_job, bw=cfg.bw_mbps), f"j{J}") as bed:
                for _, supply, policy in mine:
                    run += 1
                    pool = pool_size(J, cfg.demand_slots, supply)
                    label = f"J={J} supply={supply:.0%} pool={pool} policy={policy}"
                    ctx.progress(f"{label} ({run}/{len(scenarios)})")
                    bed.start_controller(pool=pool, policy=policy if policy != "none" else "first-fit")
                    jobs = self.jobs_for(J, run)
                    snapshot: dict[str, Any] = {}
                    try:
                        results = bed.run_jobs(jobs, register_first=True,
                                               on_admitted=lambda: snapshot.update(bed.controller_state()))
                    except AgentFailure as exc:
                        ctx.error(f"{label}: {exc}")
                        ctx.record({"kind": "job", "jobs": J, "supply": supply, "pool": pool, "policy": policy, "error": str(exc)})
                        continue
                    granted = _granted_slots(snapshot)
                    for k, job in enumerate(jobs, start=1):
                        workers = results[job.name]
                        row = allreduce_row(workers, kind="job", jobs=J, supply=supply, pool=pool, policy=policy, job=k,
                                            workers=len(job.hosts), demand=cfg.demand_slots, priority=job.priority,
                                            weight=job.weight)
                        calls = row["seconds"]
                        row["busy_s"] = sum(calls) if calls else None
                        row["throughput_mbps"] = (row["bytes"] * len(calls) * 8 / row["busy_s"] / 1e6) if row["busy_s"] else None
                        row["wall_s"] = max(w["runner"]["exited_s"] for w in workers) - min(w["runner"]["launched_s"] for w in workers)
                        row["start_s"] = min(w["runner"]["launched_s"] for w in workers)
                        row["slots_at_admission"] = granted.get(job.name)
                        row["backends"] = _history(workers)
                        ctx.record(row)
                    jobs_rows = [r for r in ctx.rows if r.get("kind") == "job" and r.get("jobs") == J and r.get("pool") == pool
                                 and r.get("policy") == policy and not r.get("error")]
                    ctx.progress("  " + "; ".join(
                        f"job {r['job']}: {r['throughput_mbps']:.2f} Mbit/s, {r['busy_s']:.2f} s, slots {r['slots_at_admission']}, "
                        f"{'/'.join(r['backends'])}" for r in jobs_rows[-J:]))
        if cfg.simulate:
            self.simulate()

    # --- the simulator ---------------------------------------------------------------------------------
    def calibration(self) -> Path:
        from topologies.experiments.calibrate import calibration_from, ring_fraction, run_probes, write_calibration
        from topologies.topos import StarTopo

        ctx, cfg = self.ctx, self.config
        path = ctx.out_dir / "calibration.json"
        if cfg.calibration:
            from simulator.calibration import CalibrationError, load_calibration

            try:
                cal = load_calibration(cfg.calibration)
            except CalibrationError as exc:
                raise ExperimentError(str(exc)) from None
            write_calibration(cal, path)
            return path
        with ctx.testbed(StarTopo(2), "calibration-unshaped") as bed:
            probes = run_probes(bed, elements=cfg.elements, iterations=max(3, cfg.iterations // 2),
                                udp_port=INA_UDP_BASE + 900, record=ctx.record, progress=ctx.progress)
        ring_rows = [dict(r, backend="ring", seconds_median=r["seconds_median"])
                     for r in ctx.rows if r.get("kind") == "job" and r.get("pool") == 0 and r.get("seconds_median")]
        cal = calibration_from(probes, ring_goodput=ring_fraction(ring_rows, cfg.bw_mbps),
                               source=f"ina-exp multijob ({ctx.options.switch}): unshaped 2-worker probes; ring goodput "
                                      f"from the 0 % supply runs on {cfg.bw_mbps:g} Mbit/s links; {ctx.out_dir.name}")
        write_calibration(cal, path)
        return path

    def simulate(self) -> None:
        ctx, cfg = self.ctx, self.config
        measured = [r for r in ctx.rows if r.get("kind") == "job" and r.get("busy_s")]
        if not measured:
            return
        try:
            cal_path = self.calibration()
        except AgentFailure as exc:
            ctx.error(f"calibration probes: {exc}")
            return
        ctx.store.doc["files"]["calibration"] = cal_path.name
        ctx.progress(f"ina-sim: the same scenarios with {cal_path.name}")
        sim_dir = ctx.out_dir / "sim"
        for (J, supply, pool, policy), rows in sorted(group_by(measured, "jobs", "supply", "pool", "policy").items(),
                                                      key=lambda kv: (kv[0][0], -kv[0][1], kv[0][3])):
            predicted = simulate_scenario(
                jobs=J, workers_per_job=cfg.workers_per_job, elements=cfg.elements, iterations=cfg.iterations,
                demand=cfg.demand_slots, pool=pool, policy=policy if policy != "none" else "first-fit",
                bw_mbps=cfg.bw_mbps, calibration=cal_path, out=sim_dir / f"j{J}-pool{pool}-{policy}")
            for r in sorted(rows, key=lambda r: r["job"]):
                sim = predicted.get(r["job"])
                if sim is None:
                    continue
                diff = (r["busy_s"] - sim["jct_s"]) / sim["jct_s"] if sim["jct_s"] else None
                ctx.record({"kind": "sim", "jobs": J, "supply": supply, "pool": pool, "policy": policy, "job": r["job"],
                            "testbed_s": r["busy_s"], "sim_s": sim["jct_s"], "rel_diff": diff,
                            "sim_backend": sim["final_backend"], "sim_history": sim["history"],
                            "within_tolerance": diff is not None and abs(diff) <= TOLERANCE})
        sims = [r for r in ctx.rows if r.get("kind") == "sim"]
        if sims:
            worst = max(abs(r["rel_diff"]) for r in sims if r["rel_diff"] is not None)
            ctx.progress(f"testbed vs ina-sim: {sum(r['within_tolerance'] for r in sims)}/{len(sims)} jobs within "
                         f"±{TOLERANCE:.0%}, largest difference {worst:.1%}")

    # --- results ---------------------------------------------------------------------------------------
    @staticmethod
    def summarize(rows: list[dict], config: MultijobConfig) -> dict:
        runs = []
        jobs = [r for r in rows if r.get("kind") == "job" and r.get("busy_s")]
        for (J, supply, pool, policy), rs in sorted(group_by(jobs, "jobs", "supply", "pool", "policy").items(),
                                                    key=lambda kv: (kv[0][0], -kv[0][1], str(kv[0][3]))):
            tps = [r["throughput_mbps"] for r in rs]
            runs.append({
                "jobs": J, "supply": supply, "pool": pool, "policy": policy,
                "throughput_mbps": {r["job"]: r["throughput_mbps"] for r in rs},
                "busy_s": {r["job"]: r["busy_s"] for r in rs},
                "slots": {r["job"]: r.get("slots_at_admission") for r in rs},
                "mean_throughput_mbps": sum(tps) / len(tps), "min_throughput_mbps": min(tps),
                "makespan_s": max(r["busy_s"] for r in rs), "mean_jct_s": sum(r["busy_s"] for r in rs) / len(rs),
            })
        sims = [r for r in rows if r.get("kind") == "sim" and r.get("rel_diff") is not None]
        sim = {}
        if sims:
            diffs = [abs(r["rel_diff"]) for r in sims]
            sim = {"tolerance": TOLERANCE, "jobs_compared": len(sims),
                   "within_tolerance": sum(1 for d in diffs if d <= TOLERANCE),
                   "median_abs_rel_diff": median(diffs), "max_abs_rel_diff": max(diffs),
                   "per_run": [{k: r[k] for k in ("jobs", "supply", "policy", "job", "testbed_s", "sim_s", "rel_diff")} for r in sims]}
        return {"runs": runs, "simulator": sim, "errors": sum(1 for r in rows if r.get("error"))}

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = []
        for run in summary.get("runs", []):
            per = ", ".join(f"job {k}: {v:.2f} Mbit/s ({run['slots'].get(k)} slots)" for k, v in sorted(run["throughput_mbps"].items()))
            lines.append(f"J={run['jobs']} supply {run['supply']:.0%} (pool {run['pool']}) {run['policy']}: {per}; "
                         f"makespan {run['makespan_s']:.2f} s")
        sim = summary.get("simulator")
        if sim:
            lines.append(f"testbed vs ina-sim: {sim['within_tolerance']}/{sim['jobs_compared']} jobs within ±{sim['tolerance']:.0%} "
                         f"(median |diff| {sim['median_abs_rel_diff']:.1%}, max {sim['max_abs_rel_diff']:.1%})")
            for r in sim["per_run"]:
                lines.append(f"  J={r['jobs']} supply {r['supply']:.0%} {r['policy']} job {r['job']}: testbed {r['testbed_s']:.2f} s, "
                             f"ina-sim {r['sim_s']:.2f} s, difference {r['rel_diff']:+.1%}")
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: MultijobConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        runs = summary.get("runs", [])
        js = sorted({r["jobs"] for r in runs})
        sims = (summary.get("simulator") or {}).get("per_run", [])
        ncols = 3 if sims else 2
        fig, axes = figure(ncols, max(1, len(js)), width=4.6, height=3.5)
        policies = [p for p in POLICIES if any(r["policy"] == p for r in runs)]
        for row, J in enumerate(js):
            ax_t, ax_j = axes[row][0], axes[row][1]
            mine = [r for r in runs if r["jobs"] == J]
            base = [r for r in mine if r["policy"] == "none"]
            for p in policies:
                pts = sorted([r for r in mine if r["policy"] == p] + base, key=lambda r: r["supply"])
                xs = [r["supply"] * 100 for r in pts]
                ax_t.errorbar(xs, [r["mean_throughput_mbps"] for r in pts],
                              yerr=[[r["mean_throughput_mbps"] - r["min_throughput_mbps"] for r in pts], [0] * len(pts)],
                              marker="o", capsize=3, color=COLORS.get(p), label=p)
                ax_j.plot(xs, [r["makespan_s"] for r in pts], marker="o", color=COLORS.get(p), label=f"{p} (last job)")
                ax_j.plot(xs, [r["mean_jct_s"] for r in pts], marker="x", ls="--", color=COLORS.get(p), alpha=0.6)
            ax_t.set_title(f"{J} jobs x {config.workers_per_job} workers: per-job throughput", fontsize=9)
            ax_t.set_xlabel("slot supply (% of demand)")
            ax_t.set_ylabel("Mbit/s (mean; bar to slowest job)")
            ax_t.set_ylim(bottom=0)
            ax_j.set_title(f"{J} jobs: completion time (solid: last, dashed: mean)", fontsize=9)
            ax_j.set_xlabel("slot supply (% of demand)")
            ax_j.set_ylabel("all-reduce time per job (s)")
            ax_j.set_ylim(bottom=0)
            for ax in (ax_t, ax_j):
                ax.grid(alpha=0.3)
                ax.set_xticks([s * 100 for s in sorted(set(config.supply))])
            legend(ax_t, fontsize=7)
            if sims and row == 0:
                ax_s = axes[0][2]
                hi = max(max(r["testbed_s"], r["sim_s"]) for r in sims) * 1.1
                lo = min(min(r["testbed_s"], r["sim_s"]) for r in sims) * 0.8
                ax_s.plot([lo, hi], [lo, hi], color="#444444", lw=0.8)
                ax_s.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)], [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)],
                                  color="#cccccc", alpha=0.5, label=f"±{TOLERANCE:.0%}")
                for p in policies + ["none"]:
                    pts = [r for r in sims if r["policy"] == p]
                    if pts:
                        ax_s.scatter([r["sim_s"] for r in pts], [r["testbed_s"] for r in pts], color=COLORS.get(p, "#777777"),
                                     label=p if p != "none" else "0 % (ring)", s=18)
                ax_s.set_xlim(lo, hi)
                ax_s.set_ylim(lo, hi)
                ax_s.set_xlabel("ina-sim prediction (s)")
                ax_s.set_ylabel("testbed (s)")
                ax_s.set_title("each job: testbed vs simulator", fontsize=9)
                ax_s.grid(alpha=0.3)
                legend(ax_s, fontsize=7)
            elif ncols == 3:
                axes[row][2].axis("off")
        note(fig, f"each job: {config.iterations} all-reduces of {config.elements} float32, asks {config.demand_slots} slots; "
                  f"{config.bw_mbps:g} Mbit/s links; 0 % supply: every job on the ring")
        save(fig, path, "Multi-job switch memory: " + ", ".join(f"{j} jobs" for j in js))


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


def simulate_scenario(*, jobs: int, workers_per_job: int, elements: int, iterations: int, demand: int, pool: int,
                      policy: str, bw_mbps: float, calibration: Path, out: Path) -> dict[int, dict]:
    """Run one scenario through ina-sim (in process); per job number: jct_s, final_backend, history."""
    from simulator.cli import main as sim_main

    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.csv"
    lines = ["job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s,priority,slots,min_slots,weight"]
    for k in range(1, jobs + 1):
        lines.append(f"{k},0,{workers_per_job},{elements * 4},{iterations},0,{k - 1},{demand},1,{2.0 if k == 1 else 1.0}")
    trace.write_text("\n".join(lines) + "\n")
    argv = ["run", "--trace", str(trace), "--policy", policy, "--placement", "pack", "--racks", "1",
            "--workers-per-rack", str(jobs * workers_per_job), "--slots", str(pool), "--host-gbps", str(bw_mbps / 1000),
            "--uplink-gbps", str(bw_mbps / 1000), "--calibration", str(calibration), "--out", str(out), "--no-plot", "--quiet"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = sim_main(argv)
    if code:
        raise ExperimentError(f"ina-sim failed ({code}) for {out.name}: {buf.getvalue().strip()[-200:]}")
    result = {}
    with (out / f"{policy}_jobs.csv").open() as fh:
        for row in csv.DictReader(fh):
            result[int(row["job_id"])] = {"jct_s": float(row["jct_s"]), "final_backend": row["final_backend"],
                                          "history": row["history"]}
    return result

