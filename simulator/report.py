"""Results of simulation runs as files: per-job CSV, timeline CSV, summary JSON/CSV, comparison PNG."""
from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from inaproto.backends import SimBackend
from simulator.engine import SimResult

__all__ = ["plot_comparison", "summarize", "write_all", "write_jobs_csv", "write_summary", "write_timeline_csv"]

JOB_COLUMNS = (
    "job_id", "arrival_s", "start_s", "finish_s", "jct_s", "queue_s", "num_workers", "racks", "priority",
    "deadline_s", "deadline_missed", "slots_requested", "range_changes", "final_backend", "ina_share", "history",
    "uplink_bytes",
)


def _time_average(timeline: Sequence[tuple], column: int, end: float) -> float:
    """Mean over [0, end] of the step function whose value changes at each timeline point."""
    if end <= 0:
        return 0.0
    total = 0.0
    for (t, *values), nxt in zip(timeline, list(timeline[1:]) + [(end,)]):
        t_next = min(nxt[0], end)
        if t_next > t:
            total += values[column - 1] * (t_next - t)
    return total / end


def summarize(result: SimResult) -> dict:
    """Headline numbers of one run (times in seconds, utilisations as fractions)."""
    jobs = result.jobs
    jct = np.array([j.jct_s for j in jobs], dtype=float)
    queue = np.array([j.queue_s for j in jobs], dtype=float)
    end = max((j.finish_s for j in jobs), default=0.0)
    first = min((j.arrival_s for j in jobs), default=0.0)
    capacity = result.cluster.ina_switches * result.cluster.slots_per_switch
    with_deadline = [j for j in jobs if j.deadline_s is not None]
    backend_time = {b: 0.0 for b in SimBackend}
    for job in jobs:
        for backend, seconds in job.backend_seconds().items():
            backend_time[backend] = backend_time.get(backend, 0.0) + seconds
    run_time = sum(backend_time.values()) or 1.0

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
        "mean_jct_s_by_priority": {
            str(p): float(np.mean([j.jct_s for j in jobs if j.priority == p]))
            for p in sorted({j.priority for j in jobs})
        },
        "makespan_s": end - first,
        "slot_utilisation": _time_average(result.timeline, 1, end) / capacity if capacity else 0.0,
        "slot_utilisation_effective": _time_average(result.timeline, 2, end) / capacity if capacity else 0.0,
        "worker_utilisation": _time_average(result.timeline, 3, end) / result.cluster.total_workers,
        "spine_slot_utilisation": (_time_average(result.timeline, 4, end) / result.cluster.spine_slots
                                   if result.cluster.spine_slots else 0.0),
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
    """One row per finished job; history is ``time:backend:slots`` entries joined by ``|``."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(JOB_COLUMNS)
        for job in result.jobs:
            seconds = job.backend_seconds()
            run = sum(seconds.values())
            aggregated = sum(seconds.get(b, 0.0) for b in (SimBackend.INA, SimBackend.RINA, SimBackend.TREE))
            ina_share = aggregated / run if run > 0 else 0.0
            writer.writerow([
                job.job_id, f"{job.arrival_s:.6f}", f"{job.start_s:.6f}", f"{job.finish_s:.6f}", f"{job.jct_s:.6f}",
                f"{job.queue_s:.6f}", job.num_workers, job.racks, job.priority,
                "" if job.deadline_s is None else job.deadline_s,
                "" if job.deadline_missed is None else int(job.deadline_missed),
                job.slots_requested, job.range_changes, job.history[-1][1] if job.history else "",
                f"{ina_share:.4f}", "|".join(f"{t:.3f}:{b}:{s}" for t, b, s in job.history), f"{job.uplink_bytes:.0f}",
            ])


def write_timeline_csv(path: Path, result: SimResult) -> None:
    """Switch memory and worker occupancy over time, one row per change."""
    capacity = result.cluster.ina_switches * result.cluster.slots_per_switch
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["time_s", "slots_held", "slots_aggregating", "slot_capacity", "busy_workers", "spine_slots_held"])
        for t, held, effective, busy, spine in result.timeline:
            writer.writerow([f"{t:.6f}", held, effective, capacity, busy, spine])


def write_summary(out: Path, results: Sequence[SimResult], config: dict) -> list[dict]:
    summaries = [summarize(r) for r in results]
    (out / "summary.json").write_text(json.dumps({"config": config, "results": summaries}, indent=2) + "\n")
    flat = [k for k, v in summaries[0].items() if not isinstance(v, dict)] if summaries else []
    with open(out / "summary.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(flat + [f"share_{b}" for b in SimBackend])
        for s in summaries:
            writer.writerow([s[k] for k in flat] + [f"{s['backend_time_share'].get(b, 0.0):.4f}" for b in SimBackend])
    return summaries


def plot_comparison(path: Path, results: Sequence[SimResult], title: str = "") -> None:
    """Four panels: JCT CDF, JCT statistics, switch memory held over time, queueing and deadlines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [summarize(r) for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax_cdf, ax_bar, ax_mem, ax_q = axes.flat
    names = [r.policy for r in results]
    for result in results:
        jct = np.sort([j.jct_s for j in result.jobs])
        if jct.size:
            ax_cdf.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=result.policy)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (s)")
    ax_cdf.set_ylabel("fraction of jobs")
    ax_cdf.set_title("JCT distribution")
    ax_cdf.grid(alpha=0.3)
    if any(r.jobs for r in results):
        ax_cdf.legend()

    x = np.arange(len(results))
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

    for result in results:
        capacity = result.cluster.ina_switches * result.cluster.slots_per_switch
        if not capacity:
            continue
        t = np.array([p[0] for p in result.timeline])
        held = np.array([p[1] for p in result.timeline]) / capacity
        ax_mem.step(t / 3600, held, where="post", label=result.policy, linewidth=0.9)
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


def write_all(out: Path, results: Sequence[SimResult], config: dict, *, plot: bool = True) -> list[dict]:
    """Everything for one comparison: <policy>_jobs.csv, <policy>_timeline.csv, summary.*, comparison.png."""
    out.mkdir(parents=True, exist_ok=True)
    for result in results:
        write_jobs_csv(out / f"{result.policy}_jobs.csv", result)
        write_timeline_csv(out / f"{result.policy}_timeline.csv", result)
    summaries = write_summary(out, results, config)
    if plot and results:
        title = (
            f"{config.get('trace', '')}: {results[0].cluster.racks} racks x {results[0].cluster.workers_per_rack} "
            f"workers, {results[0].cluster.slots_per_switch} slots/switch, {results[0].cluster.host_gbps:g} Gbit/s hosts, "
            f"placement {results[0].placement}"
        )
        plot_comparison(out / "comparison.png", results, title)
    return summaries
