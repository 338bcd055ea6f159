"""``ina-sim sweep GRID.toml``: a grid of configurations (policies x pool sizes x INA fractions x seeds x ...) run on
any :class:`concurrent.futures.Executor`, one table and one plot per swept parameter, with confidence intervals
over the seeds.

The grid file is read with inaproto/config.py into :class:`SweepConfig`: a ``[base]`` table (an ina-sim
configuration, as ``ina-sim run --print-config`` prints it) and a ``[grid]`` table whose keys are settings of
that configuration (dotted, quoted: ``"cluster.slots_per_switch" = [128, 256]``), plus ``policy`` (one policy per
point) and ``seed`` (the runs averaged over). Every point is one task (:func:`run_point`) whose result is its
summary: the same grid gives the same tables on any executor.
"""
from __future__ import annotations

import concurrent.futures
import copy
import csv
import itertools
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto.config import ConfigError, as_dict, load, reference, setting
from simulator.config import SimConfig
from simulator.report import summarize
from simulator.runs import load_trace, simulate

__all__ = ["METRICS", "Point", "SweepConfig", "points", "run_point", "run_sweep", "tables", "write_sweep"]

METRICS = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "mean_queue_s", "slot_utilisation", "slot_utilisation_effective",
           "spine_slot_utilisation",
           "makespan_s", "deadline_misses", "uplink_bytes_total", "mean_range_changes")
POLICY, SEED = "policy", "seed"


@dataclass(frozen=True)
class SweepConfig:
    """A grid of ina-sim runs around one configuration."""

    base: SimConfig = setting(factory=SimConfig, doc="the configuration every point starts from")
    grid: dict[str, list[Any]] = setting(
        factory=dict, doc="setting -> its values; `policy`: the policies, `seed`: the seeds averaged over")
    metrics: tuple[str, ...] = setting(METRICS[:3] + ("slot_utilisation",), "summary metrics tabulated and plotted")
    confidence: float = setting(0.95, "confidence of the intervals over seeds (Student's t)")
    out: Path = setting(Path("results/sweep"), "output directory")

    def __post_init__(self) -> None:
        known = {d.key for d in reference(SimConfig)} | {POLICY, SEED}
        for key, values in self.grid.items():
            if key not in known:
                raise ValueError(f"grid: {key!r} is not a setting of the configuration (see ina-sim run --print-config)")
            if not values or len(set(map(repr, values))) != len(values):
                raise ValueError(f"grid: {key!r} needs distinct values")
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"metrics: {', '.join(unknown)} unknown; valid: {', '.join(METRICS)}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    @property
    def axes(self) -> dict[str, list[Any]]:
        """The grid, with the base's policies as the `policy` axis when the grid has none."""
        return self.grid if POLICY in self.grid else {POLICY: list(self.base.policies), **self.grid}

    @property
    def swept(self) -> list[str]:
        """The grid's keys other than the seed, in the file's order."""
        return [k for k in self.axes if k != SEED]


@dataclass(frozen=True)
class Point:
    """One run of the grid: its values of the grid's keys and the configuration they make."""

    values: tuple[tuple[str, Any], ...]
    config: SimConfig
    policy: str


def points(sweep: SweepConfig) -> Iterator[Point]:
    """Every combination of the grid's values, as configurations (the base with the point's settings over it)."""
    base = _nested(as_dict(sweep.base))
    axes = sweep.axes
    for combo in itertools.product(*axes.values()):
        values = tuple(zip(axes, combo))
        settings = {("policies" if k == POLICY else k): ([v] if k == POLICY else v) for k, v in values}
        try:
            config = load(SimConfig, None, {**copy.deepcopy(base), **settings})
        except ConfigError as exc:
            raise ConfigError(f"grid point {dict(values)}: {exc}") from None
        yield Point(values, config, dict(values)[POLICY])


def _nested(plain: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration's values without the unset ones (TOML has no null; they are the defaults)."""
    return {k: _nested(v) if isinstance(v, Mapping) else v for k, v in plain.items() if v is not None}


def run_point(config: SimConfig, policy: str) -> dict:
    """One point: its trace under one policy; the run's summary."""
    return summarize(simulate(config, policy, load_trace(config).jobs))


def run_sweep(sweep: SweepConfig, executor: concurrent.futures.Executor) -> list[dict]:
    """Every point of the grid on `executor`; one row per point: the grid's values, then the metrics."""
    grid = list(points(sweep))
    futures = [executor.submit(run_point, p.config, p.policy) for p in grid]
    rows = []
    for point, future in zip(grid, futures):
        summary = future.result()
        rows.append({**dict(point.values), **{m: summary[m] for m in sweep.metrics}})
    return rows


def tables(sweep: SweepConfig, rows: Sequence[dict]) -> dict[str, list[dict]]:
    """Per swept parameter, its table: one row per combination of the swept values (the seeds folded), each metric's
    mean over the seeds and the half-width of its confidence interval."""
    swept = sweep.swept
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in swept), []).append(row)
    folded = []
    for key, runs in groups.items():
        entry: dict[str, Any] = {**dict(zip(swept, key)), "seeds": len(runs)}
        for metric in sweep.metrics:
            mean, half = _interval([float(r[metric]) for r in runs], sweep.confidence)
            entry[metric], entry[f"{metric}_ci"] = mean, half
        folded.append(entry)
    out = {}
    for param in swept:
        others = [k for k in swept if k != param]
        out[param] = sorted(folded, key=lambda e: ([_order(e[k]) for k in others], _order(e[param])))
    return out


def _order(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def _interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """Mean and the half-width of its Student's t confidence interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    from scipy.stats import t  # scipy comes with scikit-learn

    return mean, float(t.ppf((1 + confidence) / 2, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))


def write_sweep(sweep: SweepConfig, rows: Sequence[dict], *, plot: bool = True) -> list[Path]:
    """points.csv (every run), and per swept parameter by_<parameter>.csv and (`plot`) by_<parameter>.png."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    written = [_write_csv(sweep.out / "points.csv", rows)]
    for param, table in tables(sweep, rows).items():
        name = param.replace(".", "_")
        written.append(_write_csv(sweep.out / f"by_{name}.csv", table))
        if plot:
            written.append(_plot(sweep, param, table, sweep.out / f"by_{name}.png"))
    return written


def _write_csv(path: Path, rows: Sequence[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    return path


def _plot(sweep: SweepConfig, param: str, table: Sequence[dict], path: Path) -> Path:
    """One panel per metric: the metric against `param`, one line per combination of the other swept values,
    error bars the confidence interval over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [k for k in sweep.swept if k != param]
    xs = sorted({e[param] for e in table}, key=_order)
    numeric = all(isinstance(x, (int, float)) for x in xs)
    fig, axes = plt.subplots(1, len(sweep.metrics), figsize=(4.5 * len(sweep.metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], sweep.metrics):
        for label, line in itertools.groupby(table, key=lambda e: tuple(e[k] for k in others)):
            line = list(line)
            x = [e[param] if numeric else xs.index(e[param]) for e in line]
            ax.errorbar(x, [e[metric] for e in line], yerr=[e[f"{metric}_ci"] for e in line], marker="o", capsize=3,
                        label=", ".join(f"{k}={v}" for k, v in zip(others, label)) or None)
        if not numeric:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_xlabel(param)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    if others:
        axes[0][0].legend(fontsize=7)
    seeds = len(sweep.axes.get(SEED, [sweep.base.seed]))
    fig.suptitle(f"{param}: means over {seeds} seed(s), {sweep.confidence:.0%} confidence intervals")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
