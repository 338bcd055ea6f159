"""Experiment 2: heterogeneous workers, equal vs static vs adaptive data allocation (``ina-agent train``).

Every run trains the same MLP (``host_agent/train.py``) with the same global batch on a star of INA
workers. Worker 0 is ``r`` times slower than the others (``r`` = 1, 2, 3); the allocation mode decides how
many samples of each global batch each worker computes: ``equal`` (B/n each, everyone waits for the slow
one), ``static`` (in proportion to speeds profiled once) or ``adaptive`` (re-split from measured speeds
every ``update_every`` steps). Membership: "2 fast" alone, "2 fast + 1 slow" (a slow worker added) and
"3 fast" (the slow worker replaced by a fast one) come out of the same runs with ``workers=3``.

Compute is emulated: the MLP's numpy compute is well under a millisecond, far below the all-reduce, so
every worker runs with ``--slowdown base x r`` (the agent's ``SlowdownCompute`` runs the real compute, then
sleeps ``(factor - 1)`` times as long: a slow accelerator that leaves the 2 host CPUs to others). With
``speed_change`` and an agent that supports ``--slowdown-at STEP:FACTOR``, worker 0's speed changes mid-run.

Per run: time per step, samples per second, time to a target training loss (first step whose global loss
is at or below it, times the mean step time; every mode computes the same global-batch gradient, so the
loss curves agree and only the time per step differs), each worker's share of time spent in all-reduce
and its wait fraction (all-reduce time beyond the least-waiting worker's, over its run time), the final
accuracy and the final batch split.
"""
from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.experiments import register
from topologies.experiments.base import Experiment
from topologies.experiments.testbed import INA_UDP_BASE, AgentFailure, AgentJob, agent_command

MODES = ("equal", "static", "adaptive")


@dataclass(frozen=True)
class HeteroConfig:
    """Experiment 2's configuration.

    Args:
        workers: workers in the ratio runs (worker 0 is the slow one).
        ratios: slow worker's slowdown relative to the others (1 = homogeneous).
        modes: allocation modes.
        membership: also run the "2 fast" baseline (with ratio 1 and the largest ratio at workers=3 this
            gives: adding a slow worker, and replacing it by a fast one).
        speed_change: a run where worker 0 turns from fast to ``max(ratios)`` times slower at the middle
            step (needs ``ina-agent train --slowdown-at``; skipped otherwise).
        steps, global_batch, lr, update_every, seed: training (``ina-agent train``).
        base_slowdown: emulated compute of a fast worker, in multiples of the real numpy compute.
        target_loss: time-to-target threshold; None: 1.05 x the largest final loss among the runs.
        backend: all-reduce backend of the training jobs.
    """

    workers: int = 3
    ratios: tuple[float, ...] = (1.0, 2.0, 3.0)
    modes: tuple[str, ...] = MODES
    membership: bool = True
    speed_change: bool = True
    steps: int = 80
    global_batch: int = 1536
    lr: float = 0.5
    update_every: int = 5
    seed: int = 0
    base_slowdown: float = 30.0
    target_loss: float | None = None
    backend: str = "ina"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratios", tuple(float(r) for r in self.ratios))
        object.__setattr__(self, "modes", tuple(self.modes))
        if self.workers < 2 or any(r < 1 for r in self.ratios) or not self.ratios:
            raise ValueError("workers >= 2 and ratios >= 1")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes must be some of {', '.join(MODES)}, got {list(self.modes)}")
        if self.steps < 2 or self.global_batch < self.workers or self.base_slowdown < 1:
            raise ValueError("steps >= 2, global_batch >= workers, base_slowdown >= 1")


@functools.lru_cache(maxsize=1)
def train_flags() -> frozenset[str]:
    """The options this ``ina-agent train`` accepts (the agent is developed alongside)."""
    try:
        out = subprocess.run([*agent_command(), "train", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(tok.strip(",[]") for tok in out.split() if tok.startswith("--"))


@register
class HeteroExperiment(Experiment):
    name = "hetero"
    aliases = ("exp2",)
    title = "Heterogeneous workers: equal vs static vs adaptive data allocation"
    Config = HeteroConfig
    options = (
        ("--workers", "workers", int, "workers (worker 0 is the slow one)"),
        ("--ratios", "ratios", "floats", "slow worker's slowdown, e.g. 1,2,3"),
        ("--modes", "modes", "strs", "allocation modes, e.g. equal,static,adaptive"),
        ("--steps", "steps", int, "training steps"),
        ("--global-batch", "global_batch", int, "samples per step over all workers"),
        ("--base-slowdown", "base_slowdown", float, "emulated compute of a fast worker (x numpy compute)"),
        ("--target-loss", "target_loss", float, "time-to-target threshold (training loss)"),
        ("--no-membership", "membership", "false", "skip the 2-fast baseline"),
        ("--no-speed-change", "speed_change", "false", "skip the mid-run speed change"),
    )

    @classmethod
    def presets(cls) -> dict[str, HeteroConfig]:
        return {
            "tiny": HeteroConfig(ratios=(1.0, 3.0), modes=("equal", "static"), membership=False, speed_change=False,
                                 steps=10, global_batch=768, base_slowdown=10.0),
            "small": HeteroConfig(ratios=(1.0, 3.0), steps=40, speed_change=False),
            "full": HeteroConfig(),
        }

    def scenarios(self) -> list[dict[str, Any]]:
        cfg = self.config
        out = []
        for r in cfg.ratios:
            slow = cfg.base_slowdown * r
            out.append({"scenario": f"ratio {r:g}:1", "ratio": r, "workers": cfg.workers,
                        "slowdowns": [slow] + [cfg.base_slowdown] * (cfg.workers - 1)})
        if cfg.membership:
            out.append({"scenario": f"{cfg.workers - 1} fast", "ratio": None, "workers": cfg.workers - 1,
                        "slowdowns": [cfg.base_slowdown] * (cfg.workers - 1)})
        if cfg.speed_change:
            if "--slowdown-at" in train_flags():
                r = max(cfg.ratios)
                out.append({"scenario": f"speed change 1->{r:g} at step {cfg.steps // 2}", "ratio": r, "workers": cfg.workers,
                            "slowdowns": [cfg.base_slowdown] * cfg.workers,
                            "change": (cfg.steps // 2, cfg.base_slowdown * r)})
            else:
                self.ctx.progress("speed change skipped: this ina-agent train has no --slowdown-at STEP:FACTOR")
                self.ctx.store.doc.setdefault("notes", []).append(
                    "mid-run speed change not run: ina-agent train has no --slowdown-at option")
        return out

    def run(self) -> None:
        from topologies.topos import StarTopo

        cfg, ctx = self.config, self.ctx
        scenarios = self.scenarios()
        total = len(scenarios) * len(cfg.modes)
        k = 0
        with ctx.testbed(StarTopo(cfg.workers), "star") as bed:
            for sc in scenarios:
                hosts = tuple(f"h{i}" for i in range(1, sc["workers"] + 1))
                for mode in cfg.modes:
                    k += 1
                    ctx.progress(f"{sc['scenario']}, {mode} ({k}/{total}): {sc['workers']} workers, slowdowns "
                                 f"{'/'.join(f'{s:g}' for s in sc['slowdowns'])}, {cfg.steps} steps")
                    args = ("--allocation", mode, "--steps", str(cfg.steps), "--global-batch", str(cfg.global_batch),
                            "--lr", str(cfg.lr), "--update-every", str(cfg.update_every), "--seed", str(cfg.seed))
                    per_worker = {}
                    for wid, s in enumerate(sc["slowdowns"]):
                        extra = ("--slowdown", f"{s:g}")
                        if sc.get("change") and wid == 0:
                            extra += ("--slowdown-at", f"{sc['change'][0]}:{sc['change'][1]:g}")
                        per_worker[wid] = extra
                    job = AgentJob(f"tr{k}-{mode}", hosts, "train", backend=cfg.backend, args=args, worker_args=per_worker,
                                   udp_port=INA_UDP_BASE + k)
                    try:
                        results = bed.run_jobs([job])[job.name]
                    except AgentFailure as exc:
                        ctx.error(f"{sc['scenario']} {mode}: {exc}")
                        ctx.record({"kind": "train", "scenario": sc["scenario"], "mode": mode, "error": str(exc)})
                        continue
                    row = train_row(results, scenario=sc["scenario"], ratio=sc["ratio"], mode=mode,
                                    slowdowns=sc["slowdowns"], global_batch=cfg.global_batch)
                    ctx.record(row)
                    ctx.progress(f"  {row['step_ms']:.1f} ms/step, {row['samples_per_s']:.0f} samples/s, accuracy "
                                 f"{row['accuracy']:.3f}, wait {'/'.join(f'{w:.0%}' for w in row['wait_fraction'])}, "
                                 f"final split {row['final_batch']}")

    @staticmethod
    def summarize(rows: list[dict], config: HeteroConfig) -> dict:
        ok = [r for r in rows if r.get("kind") == "train" and r.get("losses")]
        target = config.target_loss
        if target is None and ok:
            target = 1.05 * max(r["losses"][-1] for r in ok)
        runs = []
        for r in ok:
            t = time_to_target(r, target) if target is not None else None
            runs.append({k: r.get(k) for k in ("scenario", "ratio", "mode", "step_ms", "samples_per_s", "accuracy",
                                               "wait_fraction", "comm_fraction", "final_batch", "seconds")}
                        | {"time_to_target_s": t})
        # Membership: adding the slow worker and replacing it with a fast one, per mode.
        membership = {}
        if ok and config.ratios:
            worst = f"ratio {max(config.ratios):g}:1"
            base = f"{config.workers - 1} fast"
            homog = "ratio 1:1" if 1.0 in config.ratios else None
            for mode in config.modes:
                get = {r["scenario"]: r for r in runs if r["mode"] == mode}
                entry = {}
                for label, sc in (("fast_only", base), ("with_slow", worst), ("slow_replaced", homog)):
                    if sc and sc in get:
                        entry[label] = get[sc]["samples_per_s"]
                if entry:
                    membership[mode] = entry
        return {"target_loss": target, "runs": runs, "membership": membership,
                "errors": sum(1 for r in rows if r.get("error"))}

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = [f"target loss {summary['target_loss']:.4f}" if summary.get("target_loss") else "no runs"]
        for r in summary.get("runs", []):
            ttt = f"{r['time_to_target_s']:.2f} s" if r.get("time_to_target_s") is not None else "not reached"
            lines.append(f"{r['scenario']:<22} {r['mode']:<9} {r['step_ms']:6.1f} ms/step {r['samples_per_s']:6.0f} samples/s "
                         f"to target {ttt:>11}, accuracy {r['accuracy']:.3f}, wait {'/'.join(f'{w:.0%}' for w in r['wait_fraction'])}, "
                         f"split {r['final_batch']}")
        for mode, m in summary.get("membership", {}).items():
            lines.append(f"membership ({mode}): " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} samples/s" for k, v in m.items()))
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: HeteroConfig, path: Path) -> None:
        import numpy as np

        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        runs = summary.get("runs", [])
        fig, axes = figure(3, 1, width=4.6, height=3.8)
        ax_t, ax_w, ax_m = axes[0]
        ratio_runs = [r for r in runs if r["scenario"].startswith("ratio")]
        ratios = sorted({r["ratio"] for r in ratio_runs})
        modes = [m for m in MODES if any(r["mode"] == m for r in runs)]
        width = 0.8 / max(1, len(modes))
        for i, mode in enumerate(modes):
            xs, ys = [], []
            for j, ratio in enumerate(ratios):
                r = next((r for r in ratio_runs if r["mode"] == mode and r["ratio"] == ratio), None)
                if r and r.get("time_to_target_s") is not None:
                    xs.append(j + (i - (len(modes) - 1) / 2) * width)
                    ys.append(r["time_to_target_s"])
            ax_t.bar(xs, ys, width=width, color=COLORS[mode], label=mode)
        ax_t.set_xticks(range(len(ratios)))
        ax_t.set_xticklabels([f"{r:g}:1" for r in ratios])
        ax_t.set_xlabel("slow : fast compute time (worker 0 slow)")
        ax_t.set_ylabel(f"time to training loss {summary.get('target_loss') or 0:.3f} (s)")
        ax_t.set_title("time to target", fontsize=9)
        legend(ax_t, fontsize=8)
        ax_t.grid(alpha=0.3, axis="y")

        # Wait fraction of every worker at the largest ratio.
        worst = max(ratios) if ratios else None
        for i, mode in enumerate(modes):
            r = next((r for r in ratio_runs if r["mode"] == mode and r["ratio"] == worst), None)
            if r:
                n = len(r["wait_fraction"])
                xs = np.arange(n) + (i - (len(modes) - 1) / 2) * width
                ax_w.bar(xs, [w * 100 for w in r["wait_fraction"]], width=width, color=COLORS[mode], label=mode)
                ax_w.set_xticks(range(n))
                ax_w.set_xticklabels([f"w{k}{' (slow)' if k == 0 and worst and worst > 1 else ''}" for k in range(n)])
        ax_w.set_ylabel("time waiting for others (%)")
        ax_w.set_title(f"per-worker wait at {worst:g}:1" if worst else "per-worker wait", fontsize=9)
        ax_w.grid(alpha=0.3, axis="y")
        legend(ax_w, fontsize=8)

        mem = summary.get("membership", {})
        labels = [("fast_only", f"{config.workers - 1} fast"), ("with_slow", "+1 slow"), ("slow_replaced", "slow -> fast")]
        for i, mode in enumerate(modes):
            m = mem.get(mode, {})
            xs = [j + (i - (len(modes) - 1) / 2) * width for j, (k, _) in enumerate(labels) if k in m]
            ys = [m[k] for k, _ in labels if k in m]
            ax_m.bar(xs, ys, width=width, color=COLORS[mode], label=mode)
        other = [r for r in runs if not r["scenario"].startswith("ratio") and "fast" not in r["scenario"]]
        ax_m.set_xticks(range(len(labels)))
        ax_m.set_xticklabels([lab for _, lab in labels])
        ax_m.set_ylabel("training throughput (samples/s)")
        ax_m.set_title("membership: add a slow worker, replace it", fontsize=9)
        ax_m.grid(alpha=0.3, axis="y")
        if mem:
            legend(ax_m, fontsize=8)
        for r in other:  # the speed-change run, as text
            ax_m.annotate(f"{r['scenario']} ({r['mode']}): {r['samples_per_s']:.0f}/s", (0.02, 0.95), xycoords="axes fraction",
                          fontsize=6, va="top")
        accs = [r["accuracy"] for r in runs]
        acc = f"final accuracy {min(accs):.3f}-{max(accs):.3f}" if accs else ""
        note(fig, f"{config.steps} steps, global batch {config.global_batch}, emulated compute {config.base_slowdown:g}x numpy per "
                  f"fast worker; backend {config.backend}; {acc}")
        save(fig, path, HeteroExperiment.title)


def train_row(results: list[dict], **extra: Any) -> dict[str, Any]:
    """One row from every worker's ``ina-agent train`` JSON."""
    results = sorted(results, key=lambda r: r.get("worker_id", 0))
    seconds = [float(r["seconds"]) for r in results]
    comm = [float(r.get("comm_seconds", 0.0)) for r in results]
    steps = len(results[0].get("losses", []))
    wall = max(seconds)
    least = min(comm)
    batch = results[0].get("batch_sizes") or [[]]
    row = {
        "kind": "train",
        **extra,
        "workers": len(results),
        "steps": steps,
        "seconds": wall,
        "step_ms": wall / steps * 1e3 if steps else None,
        "samples_per_s": extra.get("global_batch", 0) * steps / wall if wall else None,
        "accuracy": float(results[0].get("accuracy", 0.0)),
        "losses": list(results[0].get("losses", [])),
        "comm_fraction": [c / s if s else 0.0 for c, s in zip(comm, seconds)],
        "wait_fraction": [(c - least) / s if s else 0.0 for c, s in zip(comm, seconds)],
        "compute_seconds": [float(r.get("compute_seconds", 0.0)) for r in results],
        "final_batch": list(batch[-1]),
        "batch_history": [list(b) for b in batch[:: max(1, len(batch) // 12)]],
        "same_model": len({r.get("final_params_digest") for r in results}) == 1,
        "backend": results[0].get("backend"),
    }
    if "step_seconds" in results[0]:
        row["step_seconds"] = list(results[0]["step_seconds"])
    return row


def time_to_target(row: dict, target: float) -> float | None:
    """Seconds until the global training loss first reaches ``target`` (per-step times if the agent
    reports them, else the step count times the mean step time)."""
    losses = row.get("losses") or []
    for i, loss in enumerate(losses):
        if loss <= target:
            if row.get("step_seconds"):
                steps = row["step_seconds"]
                return float(sum(steps[: i + 1]))
            return (i + 1) * row["seconds"] / len(losses)
    return None
