"""What every experiment shares: its class shape, the run context, progress lines and incremental results.

An experiment is a class with a frozen ``Config`` dataclass, three presets (``tiny`` for CI, ``small`` for
a demo, ``full``), a ``run()`` that measures and calls ``ctx.record(row)`` after every measurement, and two
static functions that turn rows into a summary and a PNG; it declares, as data, the published figures it sets
itself beside (``anchors``) and its stated targets on that summary (``targets``), which ``ina-exp report`` and the
docs' figures table judge. The run context writes, as it goes, into ``results/<experiment>/<timestamp>/``:

| file | content |
|---|---|
| ``results.json`` | status, options, the experiment's config, every daemon's whole configuration (``daemons``: \
topologies/daemons.py), environment, every row, the summary, file names |
| ``results.csv`` | one line per row (lists as JSON) |
| ``measurements.jsonl`` | one row per line, appended as measured (what survives a crash) |
| ``<experiment>.png`` | the plot |
| ``runs/<label>/`` | each testbed's run directory: topology.json, the daemons' configuration files (``config/``), \
switch/controller/agent logs, agent JSON |
"""
from __future__ import annotations

import csv
import dataclasses
import enum
import io
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TextIO

from topologies.errors import ExperimentError

__all__ = [
    "SIZES",
    "Anchor",
    "Comparison",
    "Experiment",
    "ResultStore",
    "RunContext",
    "RunOptions",
    "Target",
    "flatten_row",
    "load_average",
    "machine",
    "rows_to_csv",
]

SIZES = ("tiny", "small", "full")


@dataclass(frozen=True)
class RunOptions:
    """Options of one ``ina-exp run``, common to every experiment (written into results.json)."""

    switch: str = "ina-switch"  # ina-switch | bmv2
    size: str = "small"  # tiny | small | full
    out: str = "results"
    log_level: str = "warn"  # the switches' -L level (info/warn keep the packet path fast)
    agent_timeout: float = 180.0  # seconds one measurement's agents may take before they are stopped
    quiet: bool = False


@dataclass(frozen=True)
class Anchor:
    """A published figure an experiment sets itself beside (the rows of ANCHORS.md): the anchors' own claims, on
    their hardware; what this scale model should match is the shape of the effect, not absolute times."""

    system: str
    source: str
    figure: str  # the figure as published
    reproduced_by: str  # what in this experiment's results reproduces its effect


class Comparison(enum.Enum):
    """How a target's quantity is judged against its bound."""

    AT_MOST = "at most"
    AT_LEAST = "at least"
    WITHIN = "within"  # |quantity - 1| <= bound: the value within a relative bound of its reference
    HOLDS = "holds"  # the value is true


@dataclass(frozen=True)
class Target:
    """One stated target of an experiment, judged on its summary: per repetition, and on the median over them.

    Args:
        words: the target as a sentence a reader checks (what, where, the bound).
        key: where its value is in the summary: dotted names, list indices (``points[-1]``), selections of list
            elements (``rina[ina_fraction=1,loss=0]``) and ``*`` (every element). Where the key finds several
            values, the worst of them is judged (the largest for AT_MOST, the farthest for WITHIN, ...).
        comparison, bound: the judgement (``bound`` unused for HOLDS).
        reference: a summary key (same syntax) or a number the value is divided by before it is judged: the
            quantity is value / reference.
        fmt: format spec of the quantity (``".2f"``, ``".0%"``).
    """

    words: str
    key: str
    comparison: Comparison
    bound: float | None = None
    reference: str | float | None = None
    fmt: str = ".2f"

    def __post_init__(self) -> None:
        if (self.bound is None) != (self.comparison is Comparison.HOLDS):
            raise ValueError(f"{self.key}: a bound for every comparison but HOLDS, none for HOLDS")

    def met(self, quantity: float | bool) -> bool:
        """Whether one quantity (a repetition's, or the median over them) meets the target."""
        if self.comparison is Comparison.HOLDS:
            return bool(quantity)
        q, bound = float(quantity), float(self.bound)  # type: ignore[arg-type]
        if self.comparison is Comparison.AT_MOST:
            return q <= bound
        if self.comparison is Comparison.AT_LEAST:
            return q >= bound
        return abs(q - 1.0) <= bound

    def worst(self, quantities: list[float | bool]) -> float | bool:
        """The quantity judged where the key finds several: the one farthest on the wrong side of the bound."""
        if self.comparison is Comparison.HOLDS:
            return all(bool(q) for q in quantities)
        if self.comparison is Comparison.AT_MOST:
            return max(float(q) for q in quantities)
        if self.comparison is Comparison.AT_LEAST:
            return min(float(q) for q in quantities)
        return max((float(q) for q in quantities), key=lambda q: abs(q - 1.0))

    def bound_text(self) -> str:
        """The bound as a reader sees it: ``<= 1.15``, ``>= 90%``, ``1 ± 0.10``, ``true``."""
        if self.comparison is Comparison.HOLDS:
            return "true"
        bound = format(self.bound, self.fmt)
        return {Comparison.AT_MOST: f"<= {bound}", Comparison.AT_LEAST: f">= {bound}"}.get(
            self.comparison, f"1 ± {bound}")


class Experiment:
    """Base of every experiment. Subclasses set the class attributes and implement :meth:`run`.

    Class attributes:
        name: the ``ina-exp run`` name; aliases: other names (``exp1``).
        title: one line for ``ina-exp list`` and the plot.
        Config: a frozen dataclass; ``presets()`` gives its tiny/small/full values.
        options: experiment options for the command line, ``(flag, field, type, help)``; a value given
            replaces that field of the preset (lists: comma-separated).
        needs_faults: the experiment uses ina-switch's fault options (not available on BMv2).
        anchors: the published figures it sets itself beside; targets: its stated targets (``ina-exp report``
            and docs/experiments.md's figures table judge them).
        repetition_key: the row field that numbers a run's repetitions (None: a run is one repetition); each
            repetition's rows are summarized apart to judge the targets per repetition.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    title: ClassVar[str] = ""
    Config: ClassVar[type] = object
    options: ClassVar[tuple[tuple[str, str, Any, str], ...]] = ()
    needs_faults: ClassVar[bool] = False
    anchors: ClassVar[tuple[Anchor, ...]] = ()
    targets: ClassVar[tuple[Target, ...]] = ()
    repetition_key: ClassVar[str | None] = None

    def __init__(self, config: Any, ctx: RunContext) -> None:
        self.config = config
        self.ctx = ctx

    # --- configuration -------------------------------------------------------------------------------
    @classmethod
    def presets(cls) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def make_config(cls, size: str, overrides: Mapping[str, Any] | None = None) -> Any:
        """The ``size`` preset with ``overrides`` (field -> value; None means keep the preset's)."""
        presets = cls.presets()
        if size not in presets:
            raise ExperimentError(f"{cls.name}: no {size!r} configuration (sizes: {', '.join(presets)})")
        changes = {k: v for k, v in (overrides or {}).items() if v is not None}
        try:
            return dataclasses.replace(presets[size], **changes)
        except (TypeError, ValueError) as exc:
            raise ExperimentError(f"{cls.name}: {exc}") from None

    # --- the work ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Measure; call ``self.ctx.record(row)`` after every measurement."""
        raise NotImplementedError

    @staticmethod
    def summarize(rows: list[dict], config: Any) -> dict:
        """Aggregate rows into the summary written into results.json (and printed)."""
        return {}

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: Any, path: Path) -> None:
        """Write the experiment's PNG to ``path``."""
        raise NotImplementedError

    @staticmethod
    def report(summary: dict) -> list[str]:
        """Lines printed at the end of a run (the figures)."""
        return []


def flatten_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row for CSV: nested values (lists, dicts) become JSON text, None an empty cell."""
    out = {}
    for k, v in row.items():
        if isinstance(v, (list, tuple, dict)):
            out[k] = json.dumps(v, sort_keys=True)
        elif v is None:
            out[k] = ""
        else:
            out[k] = v
    return out


def rows_to_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """CSV text of rows whose keys may differ (columns: union of keys, in first-seen order)."""
    rows = [flatten_row(r) for r in rows]
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(r)
    return buf.getvalue()


def _first_line_with(path: str, prefix: str) -> str | None:
    """The value after ``prefix`` and its separator on the first line of ``path`` that starts with it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(prefix):
                    return line[len(prefix):].lstrip(" \t:=").strip().strip('"') or None
    except OSError:
        return None
    return None


def machine() -> dict[str, Any]:
    """What a figure was measured on: CPU model, cores, memory, operating system, kernel, Python."""
    mem_kib = _first_line_with("/proc/meminfo", "MemTotal")
    return {
        "cpu_model": _first_line_with("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
        "os": _first_line_with("/etc/os-release", "PRETTY_NAME") or platform.system(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15-minute load averages (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _git(*args: str) -> str | None:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {**machine(), "argv": sys.argv, "loadavg_start": load_average()}
    commit = _git("rev-parse", "--short", "HEAD")
    if commit is not None:
        env["git_commit"] = commit
        env["git_modified"] = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return env


class ResultStore:
    """results.json, results.csv and measurements.jsonl of one experiment run, rewritten after every row."""

    def __init__(self, out_dir: Path, experiment: str, title: str, options: RunOptions, config: Any) -> None:
        self.out_dir = out_dir
        self.doc: dict[str, Any] = {
            "experiment": experiment,
            "title": title,
            "status": "running",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "finished": None,
            "options": dataclasses.asdict(options),
            "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config),
            "daemons": {},  # every daemon's whole configuration: per testbed ("runs") and per simulated trace ("ina-sim")
            "environment": _environment(),
            "rows": [],
            "summary": {},
            "files": {},
            "errors": [],
            "stopped_after_results": [],  # agents the runner had to stop after they wrote results (should stay empty)
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out_dir / "measurements.jsonl"
        self.jsonl.touch()
        self.save()

    @property
    def rows(self) -> list[dict]:
        return self.doc["rows"]

    def add(self, row: dict) -> None:
        self.rows.append(row)
        with self.jsonl.open("a") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
        self.save()

    def save(self) -> None:
        tmp = self.out_dir / "results.json.tmp"
        tmp.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        os.replace(tmp, self.out_dir / "results.json")
        if self.rows:
            (self.out_dir / "results.csv").write_text(rows_to_csv(self.rows))


class RunContext:
    """What an experiment uses while it runs: options, output folder, progress lines, ``record``."""

    def __init__(self, experiment: type[Experiment], config: Any, options: RunOptions, out_dir: Path,
                 stream: TextIO | None = None) -> None:
        self.experiment = experiment
        self.config = config
        self.options = options
        self.out_dir = out_dir
        self.runs_dir = out_dir / "runs"
        self.store = ResultStore(out_dir, experiment.name, experiment.title, options, config)
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._run_count = 0

    @property
    def rows(self) -> list[dict]:
        return self.store.rows

    def progress(self, text: str) -> None:
        """One progress line on stderr: ``[allreduce 0:42] text``."""
        if self.options.quiet:
            return
        elapsed = int(time.monotonic() - self.started)
        self.stream.write(f"[{self.experiment.name} {elapsed // 60}:{elapsed % 60:02d}] {text}\n")
        self.stream.flush()

    def record(self, row: dict) -> None:
        """Keep one measurement (written at once to measurements.jsonl, results.json and results.csv)."""
        self.store.add(row)

    def error(self, text: str) -> None:
        """Note a failed measurement (the run goes on; ``ina-exp`` exits 1 at the end)."""
        self.store.doc["errors"].append(text)
        self.store.save()
        self.progress(f"FAILED: {text}")

    def run_job(self, bed: Any, job: Any, failed: Mapping[str, Any], *, label: str = "", **kwargs: Any) -> list[dict] | None:
        """The results of ``job``'s workers on ``bed`` (``Testbed.run_jobs``, ``kwargs`` passed on), or None when an
        agent failed: the error is then noted (after ``label``) and ``failed`` recorded with it, and the experiment
        goes on with its next run."""
        from topologies.experiments.testbed import AgentFailure

        try:
            return bed.run_jobs([job], **kwargs)[job.name]
        except AgentFailure as exc:
            self.error(f"{label}: {exc}" if label else str(exc))
            self.record({**failed, "error": str(exc)})
            return None

    def lingered(self, worker: str) -> None:
        """Note an agent that wrote its results but had to be stopped (the runner's fallback fired)."""
        self.store.doc["stopped_after_results"].append(worker)
        self.store.save()

    def daemons(self, run_dir: Path, record: dict) -> None:
        """Keep the daemons' configurations of the testbed in ``run_dir`` (its :class:`~topologies.daemons.DaemonRecord`
        as a dict), under results.json's ``daemons.runs.<run folder>``."""
        self.store.doc["daemons"].setdefault("runs", {})[run_dir.name] = record
        self.store.save()

    def simulated(self, label: str, config: Any) -> None:
        """Keep the configuration of one ina-sim run (a ``SimConfig``) under ``daemons.ina-sim.<label>``."""
        from inaproto.config import as_dict

        self.store.doc["daemons"].setdefault("ina-sim", {})[label] = as_dict(config)
        self.store.save()

    def new_run_dir(self, label: str) -> Path:
        """A fresh testbed run directory ``runs/<nn>-<label>``."""
        self._run_count += 1
        path = self.runs_dir / f"{self._run_count:02d}-{label}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def testbed(self, topo: Any, label: str, **kwargs: Any):
        """A :class:`~topologies.experiments.testbed.Testbed` for this run's switch target and options."""
        from topologies.experiments.testbed import Testbed

        run_dir = self.new_run_dir(label)
        return Testbed(topo, run_dir=run_dir, target=self.options.switch,
                       log_level=self.options.log_level, agent_timeout=self.options.agent_timeout,
                       progress=self.progress, on_linger=self.lingered,
                       on_daemons=lambda record: self.daemons(run_dir, record), **kwargs)
