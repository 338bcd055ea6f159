"""Each experiment's stated targets judged on its results: per repetition, and on the median over them.

An experiment declares its targets once, as data (``Experiment.targets``: :class:`~topologies.experiments.base.Target`,
a summary key, a comparison, a bound and the words). A repetition is one run (a results folder) or, for an
experiment with a ``repetition_key`` (experiment 3's trace runs, Rina's and the tree's repetitions, experiment 2's
seeds), each repetition inside a run: its rows are summarized apart, by the experiment's own ``summarize``, and
every target is judged on that summary. The median over the repetitions is judged too, and its spread stated.

``ina-exp report`` (the HTML page) and the figures table of docs/experiments.md (``figures.py``) both read this.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topologies.experiments.base import Comparison, Experiment, Target

__all__ = ["Judgement", "Repetition", "judge", "lookup", "measure", "repetitions", "value_text"]

_TOKEN = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


def _literal(text: str) -> Any:
    """A selection's value: a JSON literal (1, 0.5, true) or else the text itself (2x4, first-fit)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _step(values: list[Any], name: str | None, bracket: str | None) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if name == "*" or bracket == "*":
            out += list(v.values()) if isinstance(v, Mapping) else list(v) if isinstance(v, list) else []
        elif name is not None:
            if isinstance(v, Mapping) and name in v:
                out.append(v[name])
        elif isinstance(v, list) and re.fullmatch(r"-?\d+", bracket or ""):
            i = int(bracket)  # type: ignore[arg-type]
            if -len(v) <= i < len(v):
                out.append(v[i])
        elif isinstance(v, list):
            conditions = [c.split("=", 1) for c in (bracket or "").split(",") if "=" in c]
            out += [e for e in v if isinstance(e, Mapping)
                    and all(k.strip() in e and _same(e[k.strip()], _literal(x.strip())) for k, x in conditions)]
    return out


def lookup(doc: Any, key: str) -> list[Any]:
    """Every value at ``key`` in ``doc``: dotted names, ``[i]`` list indices, ``[field=value,...]`` selections of
    list elements (every match) and ``*`` (every element or value). A missing name gives nothing, not an error."""
    values = [doc]
    for bracket, name in _TOKEN.findall(key):
        values = _step(values, name or None, bracket if name == "" else None)
    return values


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def measure(target: Target, summary: Mapping[str, Any]) -> float | bool | None:
    """The quantity ``target`` judges in one summary (value / reference where it has one; the worst where its key
    finds several), or None where the summary does not hold it (not measured in that run)."""
    found = [v for v in lookup(summary, target.key) if v is not None]
    if target.comparison is Comparison.HOLDS:
        flags = [v for v in found if isinstance(v, bool)]
        return target.worst(flags) if flags else None
    if target.reference is None:
        quantities = [n for n in map(_number, found) if n is not None]
    else:
        refs = lookup(summary, target.reference) if isinstance(target.reference, str) else [target.reference]
        if len(refs) == 1:
            refs = refs * len(found)
        if len(refs) != len(found):
            return None
        pairs = [(_number(v), _number(r)) for v, r in zip(found, refs)]
        quantities = [v / r for v, r in pairs if v is not None and r]
    return target.worst(quantities) if quantities else None


@dataclass(frozen=True)
class Repetition:
    """One repetition's summary and where it came from (``label``: the run folder, and the repetition in it)."""

    label: str
    summary: Mapping[str, Any]


def repetitions(experiment: type[Experiment] | None, doc: Mapping[str, Any], label: str) -> list[Repetition]:
    """The repetitions of one run (``doc``: its results.json): each repetition's rows summarized apart where the
    experiment numbers them (rows without the number belong to every repetition), else the run's own summary."""
    stored = [Repetition(label, doc.get("summary") or {})]
    key = experiment.repetition_key if experiment is not None else None
    rows = doc.get("rows") or []
    numbers = sorted({r[key] for r in rows if key and r.get(key) is not None}, key=str)
    if len(numbers) <= 1:
        return stored
    try:
        config = experiment.Config(**doc["config"])  # type: ignore[union-attr]
        return [Repetition(f"{label} #{n}", experiment.summarize(  # type: ignore[union-attr]
            [r for r in rows if r.get(key) in (None, n)], config)) for n in numbers]
    except Exception:  # results of another version of the experiment: judge its stored summary  # noqa: BLE001
        return stored


@dataclass(frozen=True)
class Judgement:
    """A target over repetitions: each repetition's quantity (those that measured it) and the verdict on their
    median (HOLDS: on every repetition)."""

    target: Target
    values: tuple[tuple[str, float | bool], ...]

    @property
    def measured(self) -> bool:
        return bool(self.values)

    @property
    def quantities(self) -> list[float | bool]:
        return [q for _, q in self.values]

    @property
    def median(self) -> float | bool | None:
        if not self.values:
            return None
        if self.target.comparison is Comparison.HOLDS:
            return all(self.quantities)
        return statistics.median(float(q) for q in self.quantities)

    @property
    def spread(self) -> tuple[float, float] | None:
        if not self.values or self.target.comparison is Comparison.HOLDS:
            return None
        return min(float(q) for q in self.quantities), max(float(q) for q in self.quantities)

    @property
    def met(self) -> bool | None:
        """Met on the median over the repetitions (HOLDS: in every one); None where nothing measured it."""
        median = self.median
        return None if median is None else self.target.met(median)

    @property
    def met_count(self) -> int:
        """How many repetitions met it, each on its own."""
        return sum(1 for q in self.quantities if self.target.met(q))

    def text(self) -> str:
        """``1.04 [0.98-1.10]``, ``0.93``, ``held in 3 of 3`` or ``not measured``."""
        if not self.values:
            return "not measured"
        if self.target.comparison is Comparison.HOLDS:
            return f"held in {self.met_count} of {len(self.values)}"
        lo, hi = self.spread  # type: ignore[misc]
        return value_text(self.median, lo, hi, len(self.values), self.target.fmt)  # type: ignore[arg-type]


def value_text(median: float, lo: float, hi: float, count: int, fmt: str) -> str:
    """``median [min-max]`` (``[min to max]`` where a bound is negative), or the median alone for one value."""
    if count <= 1:
        return format(median, fmt)
    dash = " to " if lo < 0 or hi < 0 else "-"
    return f"{format(median, fmt)} [{format(lo, fmt)}{dash}{format(hi, fmt)}]"


def judge(target: Target, reps: Sequence[Repetition]) -> Judgement:
    """``target`` in every repetition that measured it."""
    values = []
    for rep in reps:
        q = measure(target, rep.summary)
        if q is not None:
            values.append((rep.label, q))
    return Judgement(target, tuple(values))
