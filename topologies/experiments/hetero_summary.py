"""Experiment 2's rows and figures: one row per training run, medians over seeds with their spread, the targets.

Pure functions of the agents' JSON (``ina-agent train --json``): no testbed needed. The keys of rows and of
the summary are stable and listed in docs/experiments.md (experiment 2).

- A step lasts as long as its slowest worker: the step's wall time is the maximum over the workers.
- The all-reduce itself (``t_comm``, waiting excluded) is, per step, the shortest all-reduce call among
  the workers: the last worker to arrive does not wait. A worker's wait is its call minus that.
- Ideal reduction of the time per step against equal allocation, for constant speeds v_i, per-sample cost
  c at speed 1 and n workers: 1 - (B c / sum v + t_comm) / ((B/n) c / min v + t_comm), with t_comm
  measured in the same runs (median of the scenario's runs of that seed).
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from topologies.experiments.aggregate import median

__all__ = ["MODES", "ideal_reduction", "report", "stats", "summarize", "train_row"]

MODES = ("equal", "static", "adaptive")


def stats(values: Iterable[float | None]) -> dict[str, Any]:
    """Median, min, max and count of the values that are not None (None everywhere if there are none)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def ideal_reduction(speeds: Sequence[float], global_batch: int, per_sample_s: float, t_comm_s: float) -> float:
    """1 - (B c / sum v + t) / ((B/n) c / min v + t): proportional split against equal split, per step."""
    n, B, c = len(speeds), global_batch, per_sample_s
    return 1.0 - (B * c / sum(speeds) + t_comm_s) / (B / n * c / min(speeds) + t_comm_s)


def train_row(results: Sequence[Mapping[str, Any]], *, global_batch: int, per_sample_s: float, **ident: Any) -> dict[str, Any]:
    """One row from every worker's ``ina-agent train`` JSON (rank order by ``worker_id``)."""
    res = sorted(results, key=lambda r: r.get("worker_id", 0))
    r0 = res[0]
    steps = min(len(r["step_wall_s"]) for r in res)
    wall = [max(r["step_wall_s"][i] for r in res) for i in range(steps)]
    comm = [[r["step_comm_s"][i] for r in res] for i in range(steps)]
    t_comm = [min(c) for c in comm]
    total_wall = sum(wall) or 1e-9
    seconds = max(float(r["seconds"]) for r in res)
    samples = global_batch * steps
    return {
        "kind": "train",
        **ident,
        "workers": len(res),
        "steps": steps,
        "global_batch": global_batch,
        "per_sample_s": per_sample_s,
        "seconds": seconds,
        "step_ms_median": statistics.median(wall) * 1e3,
        "step_ms_mean": total_wall / steps * 1e3,
        "t_comm_ms": statistics.median(t_comm) * 1e3,
        "compute_ms_median": [statistics.median(r["step_compute_s"][:steps]) * 1e3 for r in res],
        # the wall time from a step's start to the worker's all-reduce call (its compute as the host saw it)
        "compute_wall_ms_median": [statistics.median(w - c for w, c in zip(r["step_wall_s"][:steps], r["step_comm_s"][:steps])) * 1e3
                                   for r in res],
        "wait_fraction": [sum(c[w] - t for c, t in zip(comm, t_comm)) / total_wall for w in range(len(res))],
        "samples_per_s": samples / seconds,
        "us_per_sample": seconds / samples * 1e6,
        "accuracy": float(r0["accuracy"]),
        "test_loss": float(r0["test_loss"]),
        "target_accuracy": r0.get("target_accuracy"),
        "time_to_target_s": r0.get("time_to_target_s"),
        "evals": list(r0.get("evals", [])),
        "losses": list(r0["losses"]),
        "batch_sizes": [list(b) for b in r0["batch_sizes"]],
        "step_wall_s": wall,
        "final_batch": list(r0["batch_sizes"][-1]),
        "same_model": len({r.get("final_params_digest") for r in res}) == 1,
        "granted_backend": sorted({str(r.get("backend")) for r in res}),
        "compute_overruns": sum(int(r.get("compute_overruns", 0)) for r in res),
        "profile_s": max(float(r.get("profile_seconds", 0.0)) for r in res),
    }


def _constant(speeds: Sequence[str]) -> list[float] | None:
    try:
        return [float(s) for s in speeds]
    except ValueError:  # a schedule with changes
        return None


def _key(r: Mapping[str, Any]) -> tuple:
    return (r["scenario"], r["backend"], r.get("compute", "emulated"))


def summarize(rows: list[dict], config: Any) -> dict:
    ok = [r for r in rows if r.get("kind") == "train" and not r.get("error") and r.get("step_wall_s")]
    by_run: dict[tuple, list[dict]] = {}
    for r in ok:
        by_run.setdefault((*_key(r), r["mode"]), []).append(r)
    runs = []
    for (scenario, backend, compute, mode), rs in by_run.items():
        runs.append({"scenario": scenario, "scenario_kind": rs[0]["scenario_kind"], "backend": backend, "compute": compute, "mode": mode,
                     "seeds": sorted(r["seed"] for r in rs), "step_ms": stats(r["step_ms_median"] for r in rs),
                     "t_comm_ms": stats(r["t_comm_ms"] for r in rs), "us_per_sample": stats(r["us_per_sample"] for r in rs),
                     "time_to_target_s": stats(r["time_to_target_s"] for r in rs),
                     "slowest_compute_ms": stats(max(r["compute_ms_median"]) for r in rs),
                     "slowest_compute_wall_ms": stats(max(r["compute_wall_ms_median"]) for r in rs if r.get("compute_wall_ms_median")),
                     "compute_overruns": stats(r["compute_overruns"] for r in rs),
                     "profile_s": stats(r.get("profile_s") for r in rs),
                     "accuracy": stats(r["accuracy"] for r in rs), "final_batch": rs[0]["final_batch"],
                     "wait_fraction": rs[0]["wait_fraction"], "same_model": all(r["same_model"] for r in rs)})

    # Per scenario and seed: the modes side by side.
    by_seed: dict[tuple, dict[str, dict]] = {}
    for r in ok:
        by_seed.setdefault((*_key(r), r["seed"]), {})[r["mode"]] = r

    ideal = []
    for key in sorted({_key(r) for r in ok if r["scenario_kind"] in ("ratio", "mixed")}, key=str):
        per_seed = [m for (s, b, c, _), m in by_seed.items() if (s, b, c) == key and "equal" in m]
        if not per_seed:
            continue
        entry: dict[str, Any] = {"scenario": key[0], "backend": key[1], "compute": key[2]}
        speeds = _constant(per_seed[0]["equal"]["speeds"])
        ideals = []
        for m in per_seed:
            t = median(r["t_comm_ms"] for r in m.values()) / 1e3
            if speeds and key[2] == "emulated":
                ideals.append(ideal_reduction(speeds, m["equal"]["global_batch"], m["equal"]["per_sample_s"], t))
        entry["ideal_reduction"] = stats(ideals)
        for mode in ("static", "adaptive"):
            reds = [1 - m[mode]["step_ms_median"] / m["equal"]["step_ms_median"] for m in per_seed if mode in m]
            entry[f"{mode}_reduction"] = stats(reds)
            if ideals and min(ideals) > 0.05:
                fr = [1 - m[mode]["step_ms_median"] / m["equal"]["step_ms_median"] for m in per_seed if mode in m]
                entry[f"{mode}_of_ideal"] = stats(f / i for f, i in zip(fr, ideals))
        ideal.append(entry)

    straggler: dict[str, Any] = {}
    sm = [m for (s, b, c, _), m in by_seed.items() if s == "straggler"]
    if sm:
        for mode in MODES:
            straggler[f"{mode}_time_to_target_s"] = stats(m[mode]["time_to_target_s"] for m in sm if mode in m)
            straggler[f"{mode}_step_ms"] = stats(m[mode]["step_ms_median"] for m in sm if mode in m)
        straggler["adaptive_vs_static"] = stats(
            1 - m["adaptive"]["time_to_target_s"] / m["static"]["time_to_target_s"] for m in sm
            if "adaptive" in m and "static" in m and m["adaptive"]["time_to_target_s"] and m["static"]["time_to_target_s"])

    convergence = []
    for key in sorted({_key(r) for r in ok}, key=str):
        accs = {mode: [m[mode]["accuracy"] for (s, b, c, _), m in by_seed.items() if (s, b, c) == key and mode in m]
                for mode in MODES}
        if not accs["equal"]:
            continue
        eq = stats(accs["equal"])
        entry = {"scenario": key[0], "backend": key[1], "compute": key[2], "equal": eq}
        for mode in ("static", "adaptive"):
            if accs[mode]:
                st = stats(accs[mode])
                entry[mode] = st | {"diff_pp": (st["median"] - eq["median"]) * 100,
                                    "within_spread": eq["min"] - 1e-9 <= st["median"] <= eq["max"] + 1e-9}
        convergence.append(entry)
    diffs = [abs(e[m]["diff_pp"]) for e in convergence for m in ("static", "adaptive") if m in e]

    membership: dict[str, Any] = {}
    ratios = [r for r in getattr(config, "ratios", ()) if r > 1]
    if ratios:
        worst = max(ratios)
        plan = (("fast_only", "2 fast", 2.0), ("with_slow", f"ratio {worst:g}:1", 2.0 + 1.0 / worst),
                ("slow_replaced", "ratio 1:1", 3.0))
        for mode in MODES:
            entry = {}
            for label, scenario, total_speed in plan:
                us = [r["us_per_sample"] for r in ok if r["scenario"] == scenario and r["mode"] == mode
                      and r["backend"] == config.backend and r.get("compute", "emulated") == "emulated"]
                if us:
                    entry[label] = {"us_per_sample": stats(us), "total_speed": total_speed}
            if entry:
                membership[mode] = entry

    targets = {
        "ideal_90": all((e.get(f"{m}_of_ideal") or {}).get("median", 1) >= 0.9 for e in ideal for m in ("static", "adaptive")
                        if e["compute"] == "emulated") if ideal else None,
        "straggler_15": (straggler.get("adaptive_vs_static", {}).get("median") or 0) >= 0.15 if sm else None,
        "convergence_1pp": max(diffs) <= 1.0 if diffs else None,
        "max_accuracy_diff_pp": max(diffs) if diffs else None,
    }
    return {"target_accuracy": getattr(config, "target_accuracy", None), "runs": runs, "ideal": ideal,
            "straggler": straggler, "convergence": convergence, "membership": membership, "targets": targets,
            "errors": sum(1 for r in rows if r.get("error"))}


def _fmt(s: Mapping[str, Any] | None, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s["n"] > 1:
        return f"{s['median'] * scale:.{digits}f}{unit} [{s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f}]"
    return f"{s['median'] * scale:.{digits}f}{unit}"


def report(summary: dict) -> list[str]:
    lines = [f"target: held-out accuracy {summary.get('target_accuracy')}; medians over seeds [min-max]"]
    for r in summary.get("runs", []):
        lines.append(f"{r['scenario']:<16} {r['backend']:<4} {r['compute']:<8} {r['mode']:<8} "
                     f"{_fmt(r['step_ms'], unit=' ms/step')}, all-reduce {_fmt(r['t_comm_ms'], unit=' ms')}, slowest compute "
                     f"{_fmt(r.get('slowest_compute_ms'), unit=' ms')}, to target "
                     f"{_fmt(r['time_to_target_s'], unit=' s', digits=2)}, accuracy {_fmt(r['accuracy'], digits=3)}, "
                     f"split {r['final_batch']}")
    for e in summary.get("ideal", []):
        lines.append(f"{e['scenario']} [{e['backend']}, {e['compute']}]: ideal reduction {_fmt(e['ideal_reduction'], 100, ' %')}; "
                     f"static {_fmt(e['static_reduction'], 100, ' %')} ({_fmt(e.get('static_of_ideal'), 100, ' %')} of ideal), "
                     f"adaptive {_fmt(e['adaptive_reduction'], 100, ' %')} ({_fmt(e.get('adaptive_of_ideal'), 100, ' %')} of ideal)")
    st = summary.get("straggler") or {}
    if st:
        lines.append(f"straggler: time to target equal {_fmt(st.get('equal_time_to_target_s'), unit=' s', digits=2)}, static "
                     f"{_fmt(st.get('static_time_to_target_s'), unit=' s', digits=2)}, adaptive "
                     f"{_fmt(st.get('adaptive_time_to_target_s'), unit=' s', digits=2)}; adaptive vs static "
                     f"{_fmt(st.get('adaptive_vs_static'), 100, ' %')}")
    for mode, m in summary.get("membership", {}).items():
        lines.append(f"membership ({mode}): " + ", ".join(
            f"{k.replace('_', ' ')} {_fmt(v['us_per_sample'], unit=' us/sample')} (total speed {v['total_speed']:.2f})"
            for k, v in m.items()))
    t = summary.get("targets", {})
    lines.append(f"targets: >= 90 % of ideal {t.get('ideal_90')}, straggler >= 15 % {t.get('straggler_15')}, "
                 f"accuracy within 1 pp {t.get('convergence_1pp')} (largest difference {_fmt({'median': t.get('max_accuracy_diff_pp'), 'n': 1}, digits=2)} pp)")
    return lines
