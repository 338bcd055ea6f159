"""Experiment 2's plot (``hetero.png``) and the straggler's shares over time (``hetero_shares.png``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from topologies.experiments.hetero_summary import MODES
from topologies.experiments.plotting import COLORS, figure, legend, note, save

__all__ = ["plot", "plot_shares"]


def _bars(ax: Any, groups: list[str], values: dict[str, list[tuple[float | None, float | None, float | None]]]) -> None:
    """Grouped bars (one colour per mode) with min-max error bars."""
    modes = [m for m in MODES if m in values]
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        xs, ys, lo, hi = [], [], [], []
        for j, (med, mn, mx) in enumerate(values[mode]):
            if med is not None:
                xs.append(j + (i - (len(modes) - 1) / 2) * width)
                ys.append(med)
                lo.append(med - mn)
                hi.append(mx - med)
        ax.bar(xs, ys, width=width, color=COLORS[mode], label=mode, yerr=[lo, hi], capsize=2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7)
    ax.grid(alpha=0.3, axis="y")


def _run(summary: dict, scenario: str, mode: str, backend: str, compute: str = "emulated") -> dict | None:
    return next((r for r in summary.get("runs", []) if r["scenario"] == scenario and r["mode"] == mode
                 and r["backend"] == backend and r["compute"] == compute), None)


def _triple(s: dict | None, scale: float = 1.0) -> tuple:
    if not s or s.get("median") is None:
        return (None, None, None)
    return (s["median"] * scale, s["min"] * scale, s["max"] * scale)


def plot(rows: list[dict], summary: dict, config: Any, path: Path) -> None:
    fig, axes = figure(4, 2, width=4.2, height=3.4)
    (ax_step, ax_ideal, ax_strag, ax_share), (ax_accs, ax_acct, ax_mem, ax_back) = axes
    backend = getattr(config, "backend", "ina")
    ok = [r for r in rows if r.get("kind") == "train" and not r.get("error") and r.get("step_wall_s")]

    # 1. time per step vs ratio (emulated, main backend)
    ratios = [f"ratio {r:g}:1" for r in getattr(config, "ratios", ())]
    groups = ratios + [s for s in {r["scenario"] for r in ok if r["scenario_kind"] == "mixed"}]
    _bars(ax_step, [g.replace("ratio ", "") for g in groups],
          {m: [_triple((_run(summary, g, m, backend) or {}).get("step_ms")) for g in groups] for m in MODES})
    ax_step.set_ylabel("time per step (ms, median)")
    ax_step.set_title(f"time per step ({backend})", fontsize=9)
    legend(ax_step, fontsize=7)

    # 2. reduction vs ideal
    ideal = [e for e in summary.get("ideal", []) if e["compute"] == "emulated" and (e["ideal_reduction"] or {}).get("median")]
    labels = [f"{e['scenario'].replace('ratio ', '')}\n{e['backend']}" for e in ideal]
    for i, mode in enumerate(("static", "adaptive")):
        xs = [j + (i - 0.5) * 0.35 for j in range(len(ideal))]
        trip = [_triple(e.get(f"{mode}_reduction"), 100) for e in ideal]
        ax_ideal.bar(xs, [t[0] or 0 for t in trip], width=0.35, color=COLORS[mode], label=mode,
                     yerr=[[(t[0] or 0) - (t[1] or 0) for t in trip], [(t[2] or 0) - (t[0] or 0) for t in trip]], capsize=2)
    ax_ideal.scatter(range(len(ideal)), [e["ideal_reduction"]["median"] * 100 for e in ideal], marker="_", s=300, color="k",
                     label="ideal", zorder=3)
    ax_ideal.scatter(range(len(ideal)), [e["ideal_reduction"]["median"] * 90 for e in ideal], marker="_", s=300,
                     color="#888888", label="90 % of ideal", zorder=3)
    ax_ideal.set_xticks(range(len(ideal)))
    ax_ideal.set_xticklabels(labels, fontsize=6)
    ax_ideal.set_ylabel("time per step saved vs equal (%)")
    ax_ideal.set_title("reduction vs the ideal (same run's all-reduce time)", fontsize=9)
    ax_ideal.grid(alpha=0.3, axis="y")
    legend(ax_ideal, fontsize=7)

    # 3. straggler: step time over steps; 4. its shares
    strag = [r for r in ok if r["scenario"] == "straggler" and r["seed"] == min((x["seed"] for x in ok), default=0)]
    for r in strag:
        ax_strag.plot(range(1, len(r["step_wall_s"]) + 1), [t * 1e3 for t in r["step_wall_s"]], color=COLORS[r["mode"]],
                      label=r["mode"], lw=1)
    tail = [t * 1e3 for r in strag for t in r["step_wall_s"][1:]]
    if tail:  # the first step (warm-up) would flatten the others
        ax_strag.set_ylim(0, 1.3 * max(tail))
    ax_strag.set_xlabel("step")
    ax_strag.set_ylabel("step wall time (ms)")
    st = summary.get("straggler") or {}
    gain = (st.get("adaptive_vs_static") or {}).get("median")
    ax_strag.set_title("straggler: worker 0 at 1/3 speed in the middle third" +
                       (f"\nadaptive {gain:.0%} faster to target than static" if gain is not None else ""), fontsize=8)
    ax_strag.grid(alpha=0.3)
    legend(ax_strag, fontsize=7)
    _shares(ax_share, strag)

    # 5-6. accuracy vs samples and vs time, the largest ratio, first seed
    worst = f"ratio {max(getattr(config, 'ratios', (1.0,))):g}:1"
    curves = [r for r in ok if r["scenario"] == worst and r["backend"] == backend and r.get("compute") == "emulated"
              and r["seed"] == min((x["seed"] for x in ok), default=0)]
    for r in curves:
        ev = r.get("evals") or []
        ax_accs.plot([e["samples"] for e in ev], [e["accuracy"] for e in ev], color=COLORS[r["mode"]], label=r["mode"], lw=1)
        ax_acct.plot([e["seconds"] for e in ev], [e["accuracy"] for e in ev], color=COLORS[r["mode"]], label=r["mode"], lw=1)
    for ax, xl in ((ax_accs, "samples"), (ax_acct, "training time (s)")):
        ax.axhline(getattr(config, "target_accuracy", 0.9), color="#888888", ls="--", lw=0.8)
        ax.set_xlabel(xl)
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.set_title(f"{worst}: accuracy vs {xl.split(' ')[-2] if ' ' in xl else xl}", fontsize=9)
        legend(ax, fontsize=7, loc="lower right")

    # 7. membership: time per sample
    mem = summary.get("membership", {})
    labs = [("fast_only", "2 fast"), ("with_slow", "+1 slow"), ("slow_replaced", "slow -> fast")]
    _bars(ax_mem, [lab for _, lab in labs],
          {m: [_triple(mem.get(m, {}).get(k, {}).get("us_per_sample")) for k, _ in labs] for m in MODES if m in mem})
    if mem:
        any_mode = next(iter(mem.values()))
        for j, (k, _) in enumerate(labs):
            if k in any_mode:
                ax_mem.annotate(f"speed {any_mode[k]['total_speed']:.2f}", (j, 0), xytext=(0, 2), textcoords="offset points",
                                ha="center", fontsize=6)
    ax_mem.set_ylabel("time per sample (us)")
    ax_mem.set_title("membership: add a slow worker, replace it", fontsize=9)
    legend(ax_mem, fontsize=7)

    # 8. plug-in: the mixed cluster on every backend
    mixed = sorted({r["scenario"] for r in ok if r["scenario_kind"] == "mixed"})
    if mixed:
        backs = [b for b in ("ina", "ring", "rina") if any(r["backend"] == b for r in ok if r["scenario"] == mixed[0])]
        _bars(ax_back, backs, {m: [_triple((_run(summary, mixed[0], m, b) or {}).get("step_ms")) for b in backs] for m in MODES})
        ax_back.set_title(f"{mixed[0]}: every backend", fontsize=9)
    torch_runs = [r for r in summary.get("runs", []) if r["compute"] == "torch"]
    if torch_runs:
        txt = "PyTorch CNN, " + torch_runs[0]["scenario"] + ": " + ", ".join(
            f"{r['mode']} {r['step_ms']['median']:.0f} ms" for r in torch_runs if r["step_ms"]["median"] is not None)
        ax_back.annotate(txt, (0.02, 0.97), xycoords="axes fraction", fontsize=6, va="top")
    ax_back.set_ylabel("time per step (ms, median)")
    legend(ax_back, fontsize=7, loc="lower right")

    note(fig, f"{getattr(config, 'steps', '?')} steps, global batch {getattr(config, 'global_batch', '?')}, emulated "
              f"{getattr(config, 'per_sample_ms', '?')} ms/sample at speed 1, seeds {list(getattr(config, 'seeds', ()))}; "
              f"bars: median, whiskers: min-max over seeds; digits MLP (numpy)")
    save(fig, path, "Experiment 2: " + "heterogeneous workers, equal vs static vs adaptive allocation")
    if strag:
        plot_shares(strag, path.with_name("hetero_shares.png"))


def _shares(ax: Any, runs: list[dict]) -> None:
    for r in runs:
        if r["mode"] == "equal":
            continue
        B = r["global_batch"]
        ax.plot(range(1, len(r["batch_sizes"]) + 1), [b[0] / B for b in r["batch_sizes"]], color=COLORS[r["mode"]],
                label=f"{r['mode']}: worker 0", lw=1.2)
    if runs:
        r = runs[0]
        T = len(r["batch_sizes"])
        ideal = [(1 / 3 if T // 3 <= s < 2 * T // 3 else 1.0) for s in range(T)]
        ax.plot(range(1, T + 1), [v / (v + 2) for v in ideal], color="k", ls=":", lw=1, label="proportional to speed")
    ax.set_xlabel("step")
    ax.set_ylabel("worker 0's share of the global batch")
    ax.set_ylim(0, 0.5)
    ax.set_title("straggler: worker 0's share", fontsize=9)
    ax.grid(alpha=0.3)
    legend(ax, fontsize=7)


def plot_shares(runs: list[dict], path: Path) -> None:
    """The straggler's shares over time alone (docs/agent-allocation.md)."""
    fig, axes = figure(1, 1, width=5.6, height=3.4)
    _shares(axes[0][0], runs)
    save(fig, path, "Straggler: shares of the global batch over time")
