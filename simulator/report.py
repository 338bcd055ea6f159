"""Results of simulation runs as files: per-job CSV, timeline CSV, summary JSON/CSV, comparison PNG.

A policy's own files are written where it ran (:func:`write_policy`); the comparison (:func:`write_comparison`)
needs only each policy's summary, its jobs' completion times and its switch memory over time (simulator.runs'
PolicyRun)."""
from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inaproto.backends import SimBackend
from simulator.engine import SimResult

__all__ = ["PolicyRun", "plot_comparison", "summarize", "write_comparison", "write_jobs_csv", "write_policy", "write_summary",
           "write_timeline_csv"]

@dataclass(frozen=True)
class PolicyRun:
    """What a comparison needs of one policy's run: its summary, its jobs' completion times, its switch memory over
    time ((time, ToR slots held) rows), and the CPU time its task took."""

    policy: str
    summary: dict
    jct_s: np.ndarray
    memory: np.ndarray
    cpu_s: float


JOB_COLUMNS = (
    "job_id", "arrival_s", "start_s", "finish_s", "jct_s", "queue_s", "num_workers", "racks", "priority",
    "deadline_s", "deadline_missed", "slots_requested", "range_changes", "final_backend", "ina_share", "history",
    "uplink_bytes",
)


def _time_averages(timeline: Sequence[tuple], end: float) -> np.ndarray:
    """Per timeline column after the time, the mean over [0, end] of the step function it changes at each point."""
    points = np.array(timeline, dtype=float).reshape(-1, 5)
    if end <= 0 or not len(points):
        return np.zeros(4)
    t = points[:, 0]
    until = np.minimum(np.append(t[1:], end), end)
    held = np.clip(until - t, 0.0, None)
    return held @ points[:, 1:] / end


_AGGREGATING = (SimBackend.INA, SimBackend.RINA, SimBackend.TREE)


def summarize(result: SimResult) -> dict:
    """Headline numbers of one run (times in seconds, utilisations as fractions)."""
    jobs, cluster = result.jobs, result.cluster
    jct = np.array([j.jct_s for j in jobs], dtype=float)
    queue = np.array([j.queue_s for j in jobs], dtype=float)
    priority = np.array([j.priority for j in jobs], dtype=int)
    end = max((j.finish_s for j in jobs), default=0.0)
    first = min((j.arrival_s for j in jobs), default=0.0)
    capacity = cluster.ina_switches * cluster.slots_per_switch
    with_deadline = [j for j in jobs if j.deadline_s is not None]
    backend_time = dict.fromkeys(SimBackend, 0.0)
    for job in jobs:
        for backend, seconds in job.backend_seconds().items():
            backend_time[backend] = backend_time.get(backend, 0.0) + seconds
    run_time = sum(backend_time.values()) or 1.0
    held, aggregating, busy, spine = _time_averages(result.timeline, end)

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if values.size else 0.0

    return {
        "policy": result.policy,
        "placement": result.placement,
        "jobs_finished": len(jobs),
        "jobs_unfinished": result.unfinished,
        "mean_jct_s": float(jct.mean()) if jct.size else 0.0,
        "p50_jct_s": pct(jct, 50),
        "p99_jct_s": pct(jct, 99),
        "mean_queue_s": float(queue.mean()) if queue.size else 0.0,
        "p99_queue_s": pct(queue, 99),
        "mean_jct_s_by_priority": {str(p): float(jct[priority == p].mean()) for p in np.unique(priority)},
        "makespan_s": end - first,
        "slot_utilisation": float(held) / capacity if capacity else 0.0,
        "slot_utilisation_effective": float(aggregating) / capacity if capacity else 0.0,
        "worker_utilisation": float(busy) / cluster.total_workers,
        "spine_slot_utilisation": float(spine) / cluster.spine_slots if cluster.spine_slots else 0.0,
        "uplink_bytes_total": float(sum(j.uplink_bytes for j in jobs)),
        "deadline_jobs": len(with_deadline),
        "deadline_misses": sum(1 for j in with_deadline if j.deadline_missed),
        "backend_time_share": {b: t / run_time for b, t in backend_time.items()},
        "mean_range_changes": float(np.mean([j.range_changes for j in jobs])) if jobs else 0.0,
        "events": result.events,
        "wall_s": result.wall_s,
        "events_per_s": result.events / result.wall_s if result.wall_s > 0 else 0.0,
    }


def write_jobs_csv(path: Path, result: SimResult) -> None:
    """One row per finished job; history is ``time:backend:slots`` entries joined by ``|`` (no field holds a comma)."""
    lines = [",".join(JOB_COLUMNS)]
    for job in result.jobs:
        seconds = job.backend_seconds()
        run = sum(seconds.values())
        ina_share = sum(seconds.get(b, 0.0) for b in _AGGREGATING) / run if run > 0 else 0.0
        deadline = "" if job.deadline_s is None else job.deadline_s
        missed = "" if job.deadline_missed is None else int(job.deadline_missed)
        final = job.history[-1][1] if job.history else ""
        history = "|".join(f"{t:.3f}:{b}:{s}" for t, b, s in job.history)
        lines.append(f"{job.job_id},{job.arrival_s:.6f},{job.start_s:.6f},{job.finish_s:.6f},{job.jct_s:.6f},"
                     f"{job.queue_s:.6f},{job.num_workers},{job.racks},{job.priority},{deadline},{missed},"
                     f"{job.slots_requested},{job.range_changes},{final},{ina_share:.4f},{history},{job.uplink_bytes:.0f}")
    path.write_text("\n".join(lines) + "\n")


def write_timeline_csv(path: Path, result: SimResult) -> None:
    """Switch memory and worker occupancy over time, one row per change."""
    capacity = result.cluster.ina_switches * result.cluster.slots_per_switch
    lines = ["time_s,slots_held,slots_aggregating,slot_capacity,busy_workers,spine_slots_held"]
    lines += [f"{t:.6f},{held},{effective},{capacity},{busy},{spine}" for t, held, effective, busy, spine in result.timeline]
    path.write_text("\n".join(lines) + "\n")


def write_policy(out: Path, result: SimResult) -> None:
    """<policy>_jobs.csv and <policy>_timeline.csv in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_jobs_csv(out / f"{result.policy}_jobs.csv", result)
    write_timeline_csv(out / f"{result.policy}_timeline.csv", result)


def write_summary(out: Path, summaries: Sequence[dict], config: dict) -> None:
    """summary.json (the configuration and every policy's summary) and summary.csv (one row per policy)."""
    (out / "summary.json").write_text(json.dumps({"config": config, "results": list(summaries)}, indent=2) + "\n")
    flat = [k for k, v in summaries[0].items() if not isinstance(v, dict)] if summaries else []
    with open(out / "summary.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(flat + [f"share_{b}" for b in SimBackend])
        for s in summaries:
            writer.writerow([s[k] for k in flat] + [f"{s['backend_time_share'].get(b, 0.0):.4f}" for b in SimBackend])


def plot_comparison(path: Path, runs: Sequence[PolicyRun], capacity: int, title: str = "") -> None:
    """Four panels: JCT CDF, JCT statistics, switch memory held over time, queueing and deadlines; `capacity`: the
    ToRs' slots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [r.summary for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax_cdf, ax_bar, ax_mem, ax_q = axes.flat
    names = [r.policy for r in runs]
    for run in runs:
        jct = np.sort(run.jct_s)
        if jct.size:
            ax_cdf.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=run.policy)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (s)")
    ax_cdf.set_ylabel("fraction of jobs")
    ax_cdf.set_title("JCT distribution")
    ax_cdf.grid(alpha=0.3)
    if any(r.jct_s.size for r in runs):
        ax_cdf.legend()

    x = np.arange(len(runs))
    width = 0.27
    base = summaries[0]
    lows = []
    for i, (key, label) in enumerate((("mean_jct_s", "mean"), ("p50_jct_s", "p50"), ("p99_jct_s", "p99"))):
        ratios = [s[key] / base[key] if base[key] else 1.0 for s in summaries]
        lows.extend(ratios)
        bars = ax_bar.bar(x + (i - 1) * width, ratios, width, label=f"{label} (1 = {base[key]:,.0f} s)")
        ax_bar.bar_label(bars, labels=[f"{r:.2f}" for r in ratios], fontsize=7, padding=1)
    ax_bar.set_xticks(x, names)
    ax_bar.set_ylim(max(0.0, min(lows) - 0.1), max(lows) + 0.05)
    ax_bar.set_ylabel(f"JCT relative to {base['policy']}")
    ax_bar.set_title("JCT by allocation policy (lower is better)")
    ax_bar.grid(axis="y", alpha=0.3)
    ax_bar.legend(fontsize=8, loc="lower right")

    for run in runs:
        if capacity:
            ax_mem.step(run.memory[:, 0] / 3600, run.memory[:, 1] / capacity, where="post", label=run.policy,
                        linewidth=0.9)
    ax_mem.set_xlabel("time (h)")
    ax_mem.set_ylabel("switch slots held (fraction)")
    ax_mem.set_ylim(0, 1.05)
    ax_mem.set_title("Switch memory utilisation")
    ax_mem.grid(alpha=0.3)
    if ax_mem.get_legend_handles_labels()[0]:
        ax_mem.legend()

    ax_q.bar(x - 0.2, [s["mean_queue_s"] for s in summaries], 0.4, label="mean queueing delay (s)")
    ax_q.set_xticks(x, names)
    ax_q.set_ylabel("queueing delay (s)")
    ax_q.grid(axis="y", alpha=0.3)
    twin = ax_q.twinx()
    twin.bar(x + 0.2, [s["deadline_misses"] for s in summaries], 0.4, color="tab:red", label="deadline misses")
    twin.set_ylabel("deadline misses (jobs)")
    ax_q.set_title("Queueing and deadlines")
    handles = ax_q.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax_q.legend(handles, [h.get_label() for h in handles], loc="upper right")

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_comparison(out: Path, runs: Sequence[PolicyRun], config: dict, capacity: int, title: str, *,
                     plot: bool = True) -> list[dict]:
    """summary.json, summary.csv and (`plot`) comparison.png for the policies' runs; returns their summaries."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = [r.summary for r in runs]
    write_summary(out, summaries, config)
    if plot and runs:
        plot_comparison(out / "comparison.png", runs, capacity, title)
    return summaries
