"""``ina-exp report``: one self-contained HTML page of results a person looks at.

For every experiment found: its plot beside the published figure it reproduces (its anchors), each stated target
marked met or missed per repetition and on the median over the repetitions [min-max], a chart of the same, the
figures the run printed, its summary, and every run's full configuration (the experiment's, and every daemon's it
started: the settings that differ from the daemon's defaults), commit, machine and load. Plots are
embedded as data URIs and the style sheet is inline: the page is one file, opened from disk, with no network and
no script.

    runs = find_runs([Path("results")], last=1)       # the newest run of each experiment
    path = write_report(group_runs(runs), Path("results/report.html"))
"""
from __future__ import annotations

import base64
import datetime
import functools
import html
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.errors import ExperimentError
from topologies.experiments import get_experiment, load_all
from topologies.experiments.base import Comparison, Experiment
from topologies.experiments.targets import Judgement, Repetition, judge, repetitions

__all__ = ["ExperimentRuns", "Run", "find_runs", "group_runs", "machine_text", "render", "write_report"]

RESULTS_FILE = "results.json"
UNFINISHED = "running"  # a run still going (or killed outright): left out when folders are searched
NOT_CONFIG = {"experiment", "title", "status", "started", "finished", "duration_s", "environment", "rows", "summary",
              "files", "errors", "stopped_after_results", "traceback"}  # every other key of results.json is configuration
DAEMONS = "daemons"  # results.json's record of every daemon's configuration (topologies/daemons.py)


@dataclass(frozen=True)
class Run:
    """One ``ina-exp run``: its folder and its results.json."""

    path: Path
    doc: Mapping[str, Any]

    @classmethod
    def load(cls, path: Path) -> Run:
        folder = path.parent if path.name == RESULTS_FILE else path
        try:
            doc = json.loads((folder / RESULTS_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ExperimentError(f"{folder}: no readable {RESULTS_FILE} ({type(exc).__name__}: {exc})") from None
        if not isinstance(doc, dict) or "experiment" not in doc:
            raise ExperimentError(f"{folder / RESULTS_FILE}: not an ina-exp results file")
        return cls(folder.resolve(), doc)

    @property
    def name(self) -> str:
        return str(self.doc["experiment"])

    @property
    def label(self) -> str:
        return self.path.name

    @property
    def environment(self) -> Mapping[str, Any]:
        return self.doc.get("environment") or {}


def _runs_in(folder: Path) -> list[Path]:
    """The run folders directly in ``folder``, oldest first (their names are their start times)."""
    return sorted((p for p in folder.iterdir() if not p.is_symlink() and (p / RESULTS_FILE).is_file()),
                  key=lambda p: p.name)


def _newest(folder: Path, last: int) -> list[Run]:
    runs = [Run.load(p) for p in _runs_in(folder)]
    return [r for r in runs if r.doc.get("status") != UNFINISHED][-last:]


def find_runs(paths: Sequence[Path], last: int = 1) -> list[Run]:
    """The runs ``paths`` name: a run folder (or its results.json) is that run; an experiment's folder
    (``results/allreduce``) gives its ``last`` newest finished runs; a results root (``results``) that for each
    experiment in it. Each run once."""
    found: dict[Path, Run] = {}
    for path in paths:
        if path.name == RESULTS_FILE or (path / RESULTS_FILE).is_file():
            runs = [Run.load(path)]
        elif path.is_dir() and _runs_in(path):
            runs = _newest(path, last)
        elif path.is_dir():
            runs = [r for sub in sorted(path.iterdir()) if sub.is_dir() and not sub.is_symlink()
                    for r in _newest(sub, last)]
        else:
            raise ExperimentError(f"{path}: no such results folder")
        for run in runs:
            found.setdefault(run.path, run)
    return list(found.values())


@dataclass(frozen=True)
class ExperimentRuns:
    """The runs of one experiment (its repetitions), oldest first, with the experiment's class (None: a name this
    version does not know; its runs are shown without anchors or targets)."""

    name: str
    experiment: type[Experiment] | None
    runs: tuple[Run, ...]

    @functools.cached_property
    def repetitions(self) -> list[Repetition]:
        """Every run's repetitions, oldest run first."""
        return [rep for run in self.runs for rep in repetitions(self.experiment, run.doc, run.label)]

    @functools.cached_property
    def judgements(self) -> list[Judgement]:
        """Each declared target over the repetitions."""
        return [judge(t, self.repetitions) for t in (self.experiment.targets if self.experiment else ())]

    @property
    def same_configuration(self) -> bool:
        """Whether every run measured the same thing (options and configuration; where the results went and how much
        was printed aside): only then are they repetitions of one measurement."""
        def measured(run: Run) -> str:
            options = {k: v for k, v in (run.doc.get("options") or {}).items() if k not in ("out", "quiet")}
            return json.dumps([options, run.doc.get("config")], sort_keys=True, default=str)

        return len({measured(r) for r in self.runs}) == 1

    @property
    def title(self) -> str:
        return self.experiment.title if self.experiment else str(self.runs[-1].doc.get("title", self.name))


def group_runs(runs: Iterable[Run]) -> list[ExperimentRuns]:
    """Runs grouped by experiment, in the registry's order (`ina-exp list`), each group oldest first."""
    order = list(load_all())
    by: dict[str, list[Run]] = {}
    for run in runs:
        by.setdefault(run.name, []).append(run)
    groups = []
    for name in sorted(by, key=lambda n: (order.index(n) if n in order else len(order), n)):
        try:
            cls: type[Experiment] | None = get_experiment(name)
        except KeyError:
            cls = None
        ordered = sorted(by[name], key=lambda r: (str(r.doc.get("started") or ""), r.label))
        groups.append(ExperimentRuns(name, cls, tuple(ordered)))
    return groups


# --- small pieces of HTML ----------------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _scalar(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _compact(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + " …"


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _value(value: Any, depth: int = 0) -> str:
    """A JSON value as HTML: mappings as two-column tables, lists of records as tables, the rest as text."""
    if _is_scalar(value):
        return _e(_scalar(value))
    if isinstance(value, Mapping):
        if not value:
            return "–"
        if depth >= 3:
            return f"<code>{_e(_compact(value))}</code>"
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_value(v, depth + 1)}</td></tr>" for k, v in value.items())
        return f'<table class="kv">{rows}</table>'
    items = list(value)
    if items and all(isinstance(x, Mapping) for x in items) and depth < 3:
        return _records(items, depth)
    if all(_is_scalar(x) for x in items) and len(items) <= 24:
        return _e(", ".join(_scalar(x) for x in items)) or "–"
    return f"<code>{_e(_compact(items))}</code>"


def _records(items: list[Mapping[str, Any]], depth: int, limit: int = 60) -> str:
    columns: list[str] = []
    for item in items:
        columns += [k for k in item if k not in columns]
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(item.get(c), depth)}</td>" for c in columns) + "</tr>"
                   for item in items[:limit])
    more = f'<p class="note">… {len(items) - limit} more</p>' if len(items) > limit else ""
    return f'<div class="wide"><table class="grid"><tr>{head}</tr>{body}</table></div>{more}'


def _cell(value: Any, depth: int) -> str:
    if _is_scalar(value) or (isinstance(value, list) and all(_is_scalar(x) for x in value) and len(value) <= 8):
        return _value(value, depth + 1)
    return f"<code>{_e(_compact(value, 80))}</code>"


def _png(data: bytes, alt: str, cls: str = "plot") -> str:
    return f'<img class="{cls}" alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'


def _verdict(met: bool | None) -> str:
    if met is None:
        return '<span class="verdict none">not measured</span>'
    return '<span class="verdict met">met</span>' if met else '<span class="verdict missed">missed</span>'


def machine_text(env: Mapping[str, Any]) -> str:
    """A machine in one line: CPU model, cores, memory, OS, kernel, Python (what results.json recorded of it)."""
    parts = [str(env["cpu_model"]) if env.get("cpu_model") else None,
             f"{env['cpus']} cores" if env.get("cpus") else None,
             f"{env['memory_gib']:g} GiB" if env.get("memory_gib") else None,
             str(env["os"]) if env.get("os") else None,
             f"kernel {env['kernel']}" if env.get("kernel") else None,
             f"Python {env['python']}" if env.get("python") else None]
    return ", ".join(p for p in parts if p) or "not recorded"


def _load_text(env: Mapping[str, Any]) -> str:
    def one(key: str) -> str | None:
        v = env.get(key)
        return "/".join(f"{x:.2f}" for x in v) if isinstance(v, list) and v else None

    start, end = one("loadavg_start"), one("loadavg_end")
    if not start and not end:
        return "not recorded"
    return f"{start or '?'} at the start, {end or '?'} at the end (1, 5, 15-minute averages)"


def _commit_text(env: Mapping[str, Any]) -> str:
    commit = env.get("git_commit")
    if not commit:
        return "not recorded"
    return f"{commit} (with local changes)" if env.get("git_modified") else str(commit)


# --- one experiment ------------------------------------------------------------------------------------------
def _anchors(group: ExperimentRuns) -> str:
    if group.experiment is None or not group.experiment.anchors:
        return '<p class="note">No published figure is declared for this experiment.</p>'
    cards = []
    for a in group.experiment.anchors:
        cards.append(f'<div class="anchor"><h4>{_e(a.system)}</h4><p class="source">{_e(a.source)}</p>'
                     f"<p><b>Published:</b> <i>{_e(a.figure)}</i></p><p><b>Here:</b> {_e(a.reproduced_by)}</p></div>")
    return "".join(cards)


def _plots(group: ExperimentRuns) -> str:
    """The newest run's plot large; the other runs' plots folded under it."""
    out = []
    for k, run in enumerate(reversed(group.runs)):
        name = (run.doc.get("files") or {}).get("plot")
        path = run.path / name if name else None
        if path is None or not path.is_file():
            out.append(f'<p class="note">Run {_e(run.label)} has no plot.</p>')
            continue
        img = f"<figure>{_png(path.read_bytes(), f'{group.name} plot, run {run.label}')}<figcaption>run {_e(run.label)}, " \
              f"{_e(path.name)}</figcaption></figure>"
        out.append(img if k == 0 else f"<details><summary>plot of run {_e(run.label)}</summary>{img}</details>")
    return "".join(out)


def _targets_table(judgements: Sequence[Judgement]) -> str:
    if not judgements:
        return '<p class="note">No targets are declared for this experiment.</p>'
    rows = []
    for j in judgements:
        t = j.target
        reference = f" over <code>{_e(t.reference)}</code>" if isinstance(t.reference, str) else \
            (f" over {_e(t.reference)}" if t.reference is not None else "")
        per = " ".join(f'<span class="rep {"ok" if t.met(q) else "bad"}" title="{_e(label)}">'
                       f"{_e('yes' if q is True else 'no' if q is False else format(q, t.fmt))}</span>"
                       for label, q in j.values) or "–"
        count = f"{j.met_count} of {len(j.values)}" if j.values else "–"
        rows.append(f"<tr><td>{_e(t.words)}<br><code class=\"key\">{_e(t.key)}</code>{reference}</td>"
                    f"<td>{_e(t.bound_text())}</td><td>{per}</td><td>{count}</td><td>{_e(j.text())}</td>"
                    f"<td>{_verdict(j.met)}</td></tr>")
    return ('<table class="grid targets"><tr><th>target (summary key)</th><th>bound</th><th>each repetition</th>'
            "<th>repetitions met</th><th>median [min-max]</th><th>on the median</th></tr>" + "".join(rows) + "</table>")


def _targets_chart(group: ExperimentRuns, judgements: Sequence[Judgement]) -> str:
    """Each numeric target as a strip: the repetitions (dots, green met, red missed), their median (diamond) and
    the bound (line)."""
    shown = [j for j in judgements if j.values and j.target.comparison is not Comparison.HOLDS]
    if not shown:
        return ""
    from topologies.experiments.plotting import plt

    fig, axes = plt.subplots(len(shown), 1, figsize=(7.5, 0.95 * len(shown) + 0.5), squeeze=False)
    for ax, j in zip(axes[:, 0], shown):
        t, qs = j.target, [float(q) for q in j.quantities]
        ax.scatter(qs, [0] * len(qs), c=["#2ca02c" if t.met(q) else "#d62728" for q in qs], s=30, zorder=3)
        ax.scatter([j.median], [0], marker="D", s=60, facecolors="none", edgecolors="#222222", zorder=4)
        bounds = [1 - t.bound, 1 + t.bound] if t.comparison is Comparison.WITHIN else [t.bound]  # type: ignore[operator]
        for b in bounds:
            ax.axvline(b, color="#555555", ls="--", lw=1)
        lo, hi = min(qs + bounds), max(qs + bounds)
        pad = (hi - lo) * 0.15 or abs(hi) * 0.1 or 0.1
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_yticks([])
        ax.set_title(t.words if len(t.words) <= 110 else t.words[:107] + "...", fontsize=7.5, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return _png(buf.getvalue(), f"{group.name} targets: each repetition, the median and the bound", "chart")


def _figures(group: ExperimentRuns, run: Run) -> str:
    if group.experiment is None:
        return ""
    try:
        lines = group.experiment.report(run.doc.get("summary") or {})
    except Exception as exc:  # a summary of another version of the experiment  # noqa: BLE001
        lines = [f"(the figures of this summary cannot be printed by this version: {type(exc).__name__}: {exc})"]
    return f"<pre>{_e(chr(10).join(lines))}</pre>" if lines else ""


@functools.cache
def _daemon_defaults() -> dict[str, dict[str, Any]]:
    """Each daemon's default configuration, flattened to dotted keys: what a recorded configuration is shown against."""
    from controller.config import ControllerConfig
    from host_agent.options import AgentOptions
    from inaproto.config import as_dict
    from simulator.config import SimConfig
    from softswitch.config import SwitchConfig

    return {kind: _flat(as_dict(cls())) for kind, cls in (("switch", SwitchConfig), ("controller", ControllerConfig),
                                                           ("agents", AgentOptions), ("ina-sim", SimConfig))}


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value and all(isinstance(k, str) for k in value) and key != "switch_addresses":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _settings(kind: str, config: Any) -> str:
    """A daemon's recorded configuration: the settings that differ from its defaults, one ``key = value`` a line."""
    if not isinstance(config, Mapping):
        return f"<code>{_e(_compact(config))}</code>"
    defaults = _daemon_defaults().get(kind, {})
    flat = _flat(config)
    changed = [f"{k} = {json.dumps(v, default=str)}" for k, v in flat.items() if k not in defaults or defaults[k] != v]
    if not changed:
        return f'<span class="note">all {len(flat)} settings at their defaults</span>'
    return (f'<pre class="settings">{_e(chr(10).join(changed))}</pre>'
            f'<span class="note">{len(flat) - len(changed)} more at their defaults</span>')


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _ranges(ids: Sequence[int]) -> str:
    """Worker ids as ranges: 0-3, 5."""
    out: list[str] = []
    for i in sorted(ids):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def _testbed_daemons(label: str, record: Mapping[str, Any]) -> str:
    rows = [(f"switch {name}", _settings("switch", config)) for name, config in (record.get("switches") or {}).items()]
    rows += [(f"controller, start{'s' if len(e['starts']) > 1 else ''} {_ranges(e['starts'])}",
              _settings("controller", e.get("config"))) for e in record.get("controller") or []]
    rows += [("agents: " + "; ".join(f"{job} (workers {_ranges(ids)})" for job, ids in e["workers"].items()),
              _settings("agents", e.get("config"))) for e in record.get("agents") or []]
    jobs = sum(len(e["workers"]) for e in record.get("agents") or [])
    starts = sum(len(e["starts"]) for e in record.get("controller") or [])
    what = (f"{_count(len(record.get('switches') or {}), 'switch', 'switches')}, the controller "
            f"({_count(starts, 'start', 'starts')}), the agents of {_count(jobs, 'job', 'jobs')}")
    body = "".join(f"<tr><td>{_e(who)}</td><td>{settings}</td></tr>" for who, settings in rows)
    return (f"<details><summary>testbed <code>runs/{_e(label)}</code>: {_e(what)}</summary>"
            f'<table class="grid"><tr><th>daemon</th><th>settings not at their defaults</th></tr>{body}</table></details>')


def _daemons(daemons: Mapping[str, Any]) -> str:
    """Every daemon the run started, per testbed, and each simulated trace's ina-sim configuration."""
    if not isinstance(daemons, Mapping) or not daemons:
        return '<p class="note">No daemon configuration recorded.</p>'
    note = ('<p class="note">The whole configuration of every daemon this run started (results.json '
            "<code>daemons</code>; the files they read are in each testbed's <code>config/</code>).</p>")
    parts = [note]
    parts += [_testbed_daemons(label, record) for label, record in (daemons.get("runs") or {}).items()]
    sims = daemons.get("ina-sim") or {}
    if sims:
        body = "".join(f"<tr><td>{_e(label)}</td><td>{_settings('ina-sim', config)}</td></tr>" for label, config in sims.items())
        parts.append(f"<details><summary>ina-sim: {len(sims)} simulated trace(s) (<code>sim/</code>)</summary>"
                     f'<table class="grid"><tr><th>run</th><th>settings not at their defaults</th></tr>{body}</table>'
                     "</details>")
    return "".join(parts)


def _run_details(run: Run) -> str:
    env, doc = run.environment, run.doc
    status = str(doc.get("status", "?"))
    facts = [("folder", str(run.path)), ("status", status),
             ("started", doc.get("started")), ("finished", doc.get("finished")),
             ("duration", f"{doc['duration_s']:.0f} s" if isinstance(doc.get("duration_s"), (int, float)) else None),
             ("commit", _commit_text(env)), ("machine", machine_text(env)), ("load average", _load_text(env)),
             ("command", " ".join(map(str, env.get("argv") or [])) or None)]
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_scalar(v))}</td></tr>" for k, v in facts)
    config = "".join(f"<h5>{_e(k)}</h5>{_daemons(v) if k == DAEMONS else _value(v)}" for k, v in doc.items()
                     if k not in NOT_CONFIG)
    errors = doc.get("errors") or []
    errs = ("<h5>errors</h5><ul>" + "".join(f"<li>{_e(x)}</li>" for x in errors) + "</ul>") if errors else ""
    cls = "ok" if status == "complete" else "bad"
    return (f'<details class="run"><summary>run {_e(run.label)} <span class="status {cls}">{_e(status)}</span>, '
            f"{len(doc.get('rows') or [])} rows{f', {len(errors)} error(s)' if errors else ''}</summary><table class=\"kv\">{rows}</table>{errs}"
            f"<h5>configuration</h5>{config}</details>")


def _section(group: ExperimentRuns, judgements: Sequence[Judgement]) -> str:
    newest = group.runs[-1]
    met = sum(1 for j in judgements if j.met)
    measured = sum(1 for j in judgements if j.measured)
    parts = [f'<section id="{_e(group.name)}"><h2>{_e(group.name)}: {_e(group.title)}</h2>',
             (f'<p class="note">{len(group.runs)} run(s), {len(group.repetitions)} repetition(s); targets met on the '
              f"median: {met} of {measured} measured ({len(judgements)} declared).</p>")]
    if not group.same_configuration:
        parts.append('<p class="bad">These runs differ in their options or configuration (see each run below): their '
                     "figures are not repetitions of one measurement.</p>")
    parts += [f'<div class="side"><div class="figs">{_plots(group)}</div>',
              f'<div class="anchors"><h3>Published figure</h3>{_anchors(group)}</div></div>',
              f"<h3>Targets</h3>{_targets_table(judgements)}{_targets_chart(group, judgements)}",
              f"<h3>Figures (newest run)</h3>{_figures(group, newest)}",
              "<details><summary>Summary of the newest run (results.json <code>summary</code>)</summary>",
              f"{_value(newest.doc.get('summary') or {})}</details>",
              f"<h3>Runs</h3>{''.join(_run_details(r) for r in reversed(group.runs))}</section>"]
    return "".join(parts)


STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1500px;
       padding: 0 1.5em; color: #1b1b1b; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ccc; padding-bottom: 0.2em; margin-top: 2.2em; }
h3 { margin: 1.2em 0 0.4em; } h4 { margin: 0 0 0.3em; } h5 { margin: 0.8em 0 0.2em; }
table { border-collapse: collapse; margin: 0.3em 0; } th, td { padding: 0.2em 0.5em; vertical-align: top; text-align: left; }
table.grid th, table.grid td { border: 1px solid #d0d0d0; } table.grid th { background: #f2f2f2; }
table.targets td:nth-child(2), table.targets td:nth-child(5) { white-space: nowrap; }
table.kv th { color: #444; font-weight: 600; white-space: nowrap; } table.kv td { border-bottom: 1px solid #eee; }
code, pre { font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; } code.key { color: #555; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; }
pre.settings { margin: 0; padding: 0.3em 0.5em; white-space: pre-wrap; word-break: break-all; }
.wide { overflow-x: auto; max-width: 100%; }
.side { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.figs { flex: 1 1 800px; min-width: 0; } .anchors { flex: 0 1 340px; font-size: 13px; }
img.plot { max-width: 100%; height: auto; border: 1px solid #ddd; } img.chart { max-width: 100%; height: auto; }
figure { margin: 0; } figcaption, .note { color: #555; font-size: 12px; }
.anchor { background: #f5f8fc; border-left: 4px solid #1f77b4; padding: 0.4em 0.7em; margin-bottom: 0.6em; }
.anchor .source { color: #555; font-size: 12px; margin: 0; } .anchor p { margin: 0.3em 0; }
.anchors h3 { margin-top: 0; }
.verdict { font-weight: 700; padding: 0.05em 0.45em; border-radius: 3px; }
.met, .ok { color: #0d6b1f; } .verdict.met { background: #dff3e3; } .missed, .bad { color: #a31515; }
.verdict.missed { background: #fbe1e1; } .verdict.none { color: #666; background: #eee; }
.rep { display: inline-block; padding: 0 0.3em; margin: 0 0.15em 0.15em 0; border-radius: 3px; background: #f4f4f4; }
.status { font-weight: 600; } details { margin: 0.4em 0; } summary { cursor: pointer; }
details.run { border: 1px solid #e2e2e2; padding: 0.3em 0.6em; }
"""


def render(groups: Sequence[ExperimentRuns], generated: str | None = None) -> str:
    """The page for ``groups`` (one experiment each): a string of HTML, self-contained."""
    generated = generated or datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    judged = [(g, g.judgements) for g in groups]
    overview = []
    for g, js in judged:
        anchors = ", ".join(a.system for a in g.experiment.anchors) if g.experiment else "–"
        met, measured = sum(1 for j in js if j.met), sum(1 for j in js if j.measured)
        unmeasured = f", {len(js) - measured} not measured" if len(js) > measured else ""
        verdict = (f'<span class="met">{met} met</span>, <span class="missed">{measured - met} missed</span>{unmeasured}'
                   if js else "–")
        envs = {machine_text(r.environment) for r in g.runs}
        overview.append(f'<tr><td><a href="#{_e(g.name)}">{_e(g.name)}</a></td><td>{_e(anchors)}</td><td>{verdict}</td>'
                        f"<td>{len(g.repetitions)}</td><td>{len(g.runs)}</td>"
                        f"<td>{_e('; '.join(sorted({_commit_text(r.environment) for r in g.runs})))}</td>"
                        f"<td>{_e('; '.join(sorted(envs)))}</td></tr>")
    body = "".join(_section(g, js) for g, js in judged)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>INA testbed: results</title><style>{STYLE}</style>'
            f"</head><body><h1>INA testbed: results</h1><p class=\"note\">Generated {_e(generated)} by "
            f"<code>ina-exp report</code> from {sum(len(g.runs) for g in groups)} run(s). Each experiment: its plot "
            f"beside the published figure it reproduces, each stated target judged per repetition and on the median "
            f"over the repetitions [min-max], the figures it printed, its summary, and every run's configuration, "
            f"commit, machine and load. A testbed on one machine is a scale model: what should match the published "
            f"figures is the shape of the effect, not absolute times.</p>"
            f'<table class="grid"><tr><th>experiment</th><th>published figure</th><th>targets (on the median)</th>'
            f"<th>repetitions</th><th>runs</th><th>commit</th><th>machine</th></tr>{''.join(overview)}</table>"
            f"{body}</body></html>\n")


def write_report(groups: Sequence[ExperimentRuns], path: Path) -> Path:
    """Write the page to ``path`` (atomically: a reader never sees half a page); its absolute path."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(groups), encoding="utf-8")
    os.replace(tmp, path)
    return path
