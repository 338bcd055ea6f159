"""``ina-exp``: run the testbed's experiments, one command each, from topology to plot.

    ina-exp list
    ina-exp run allreduce --small                  # experiment 1, small configuration, embedded switch
    ina-exp run allreduce --workers 2,4,8 --bw 2   # experiment options replace the preset's values
    ina-exp run multijob --switch bmv2 --out /tmp/results
    ina-exp run all --small
    ina-exp plot results/allreduce/latest             # summary and PNG again from a results folder
    ina-exp report                                    # results/report.html: the newest run of each experiment
    ina-exp report results/allreduce --last 3         # the 3 newest runs of one experiment as repetitions

A run starts the topology, switches, controller and agents, measures, and writes
``<out>/<experiment>/<timestamp>/`` (``results.json`` with the configuration, ``results.csv``,
``measurements.jsonl``, a PNG, the testbeds' logs under ``runs/``); the last line printed is the plot's
path. ``ina-exp report`` sets the runs' figures beside the published figures they reproduce and marks each
experiment's targets met or missed, on one HTML page. Progress goes to stderr. Everything it started is stopped on success, failure, Ctrl-C and SIGTERM.
Exit status: 0 done, 1 a measurement or the run failed, 2 usage error (one line), 130 interrupted.
docs/experiments.md describes each experiment.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self, TextIO

from inaproto.cli import Parser, UsageError

PROG = "ina-exp"
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130  # usage errors: inaproto.cli.EXIT_USAGE (2)


def _number_list(cast: type, what: str):
    """An argparse type for comma-separated values of `cast` (at least one)."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(cast(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        return values

    return parse


_ints = _number_list(int, "integers")
_floats = _number_list(float, "numbers")


def _strs(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


_TYPES = {"ints": _ints, "floats": _floats, "strs": _strs}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Run the INA testbed's experiments (topology, switches, controller, agents) and plot them.")
    sub = p.add_subparsers(dest="command", metavar="{list,run,plot,report}", parser_class=Parser)
    lst = sub.add_parser("list", help="the experiments, their options and configurations")
    lst.add_argument("-v", "--verbose", action="store_true", help="also print each configuration")
    run = sub.add_parser("run", help="run one experiment (or all)", add_help=False,
                         usage="ina-exp run NAME|all [--tiny|--small|--full] [--switch ina-switch|bmv2] [--out DIR] [experiment options]")
    run.add_argument("-h", "--help", action="store_true", help="this help, with the experiment's own options")
    run.add_argument("experiment", nargs="?", help="experiment name (see `ina-exp list`) or 'all'")
    size = run.add_mutually_exclusive_group()
    size.add_argument("--tiny", dest="size", action="store_const", const="tiny", help="the CI configuration (seconds)")
    size.add_argument("--small", dest="size", action="store_const", const="small", help="a small, fast configuration (under a minute)")
    size.add_argument("--full", dest="size", action="store_const", const="full", help="the full configuration (minutes; default)")
    run.add_argument("--switch", choices=("ina-switch", "bmv2"), default="ina-switch", help="switch target (default: ina-switch)")
    run.add_argument("--out", default="results", help="results folder (default: results/)")
    run.add_argument("--rtt-ms", type=float, default=None, metavar="MS",
                     help="round trip added between each worker and its switch (ina-switch --link-delay, MS/2 each "
                          "way; docs/topologies.md); default: the size preset's (0 on bmv2, which cannot delay)")
    run.add_argument("--agent-timeout", type=float, default=180.0, metavar="S", help="longest wait for one measurement's agents (default 180)")
    run.add_argument("--switch-log-level", default="warn", choices=("trace", "debug", "info", "warn", "error", "off"),
                     help="the switches' -L level (default warn; trace is slow)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    run.set_defaults(size="full")
    replot = sub.add_parser("plot", help="the summary and plot again, from a results folder (no root needed)")
    replot.add_argument("results", help="a results folder (results/<experiment>/<timestamp>) or its results.json")
    rep = sub.add_parser("report", help="one HTML page: each experiment's figures beside the published ones, its "
                                        "targets met or missed (no root needed)")
    rep.add_argument("results", nargs="*", type=Path,
                     help="run folders (results/allreduce/<time>), experiment folders (results/allreduce: the newest "
                          "runs) or results roots; default: results")
    rep.add_argument("--last", type=int, default=1, metavar="N",
                     help="from a folder, the N newest finished runs of each experiment, as repetitions (default 1)")
    rep.add_argument("-o", "--out", type=Path, metavar="FILE",
                     help="the page (default: report.html in the folder the runs' experiment folders are in)")
    rep.add_argument("--figures", type=Path, metavar="FILE",
                     help="also write these runs' figures summary (docs/figures.json: the docs' figures table)")
    rep.add_argument("--markdown", type=Path, metavar="FILE",
                     help="print the figures table made from the figures summary FILE (reads no results)")
    rep.add_argument("--into", type=Path, metavar="DOC",
                     help="with --markdown: replace the table between DOC's figures markers instead of printing it")
    p.run_parser = run  # type: ignore[attr-defined]  (for `ina-exp run NAME --help`)
    return p


def experiment_parser(exp_cls: Any) -> argparse.ArgumentParser:
    """The options of one experiment (they replace fields of the chosen preset)."""
    p = Parser(prog=f"{PROG} run {exp_cls.name}", add_help=False)
    for flag, field, kind, help_text in exp_cls.options:
        if kind == "false":
            p.add_argument(flag, dest=field, action="store_const", const=False, default=None, help=help_text)
        elif kind == "true":
            p.add_argument(flag, dest=field, action="store_const", const=True, default=None, help=help_text)
        else:
            p.add_argument(flag, dest=field, type=_TYPES.get(kind, kind), default=None, help=help_text)
    return p


def _list(verbose: bool, out: TextIO) -> int:
    from topologies.experiments import ALIASES, load_all

    exps = load_all()
    for name, cls in exps.items():
        aliases = [a for a, n in ALIASES.items() if n == name]
        print(f"{name:<10} {'(' + ', '.join(aliases) + ')' if aliases else '':<8} {cls.title}", file=out)
        if cls.options:
            print("           options: " + " ".join(o[0] for o in cls.options), file=out)
        if verbose:
            for size, cfg in cls.presets().items():
                print(f"           --{size}: {dataclasses.asdict(cfg)}", file=out)
    print("run one with: ina-exp run NAME [--tiny|--small|--full] [--switch ina-switch|bmv2] [--out DIR] [options]", file=out)
    return EXIT_OK


def _replot(path: Path, out: TextIO) -> int:
    """Summary and PNG again from a results folder (after changing a plot, or for a run that was cut short)."""
    from topologies.experiments import get_experiment

    doc_path = path if path.name == "results.json" else path / "results.json"
    try:
        import json

        doc = json.loads(doc_path.read_text())
        cls = get_experiment(doc["experiment"])
        known = {f.name for f in dataclasses.fields(cls.Config)}  # a field this version no longer has is left out
        config = cls.Config(**{k: v for k, v in doc["config"].items() if k in known})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{doc_path}: not an ina-exp results file ({type(exc).__name__}: {exc})") from None
    doc["summary"] = cls.summarize(doc["rows"], config)
    plot_path = doc_path.parent / f"{cls.name}.png"
    cls.plot(doc["rows"], doc["summary"], config, plot_path)
    doc.setdefault("files", {})["plot"] = plot_path.name
    doc_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    for line in cls.report(doc["summary"]):
        print(line, file=out)
    print(f"plot: {plot_path}", file=out)
    return EXIT_OK


def _report(args: argparse.Namespace, out: TextIO) -> int:
    """The results page (and the figures summary) of the runs named, or the figures table of a summary."""
    from topologies.errors import ExperimentError
    from topologies.experiments import figures, report

    if args.into and not args.markdown:
        raise UsageError("--into DOC needs --markdown FILE (the figures summary the table is made from)")
    if args.last < 1:
        raise UsageError("--last must be >= 1")
    try:
        if args.markdown:
            if args.results or args.figures or args.out:
                raise UsageError("--markdown reads a figures summary only: no results folders, --figures or --out")
            table = figures.markdown_table(figures.read_figures(args.markdown))
            if args.into:
                args.into.write_text(figures.insert_table(args.into.read_text(), table))
                print(f"figures table: {args.into}", file=out)
            else:
                out.write(table)
            return EXIT_OK
        roots = args.results or [Path("results")]
        runs = report.find_runs(roots, last=args.last)
        if not runs:
            raise UsageError(f"no results in {', '.join(map(str, roots))} (run an experiment first: "
                             "ina-exp run allreduce --small)")
        groups = report.group_runs(runs)
        path = report.write_report(groups, args.out or Path(os.path.commonpath([r.path.parent.parent for r in runs]))
                                   / "report.html")
        if args.figures:
            figures.write_figures(figures.figures_summary(groups, " ".join(["ina-exp", *sys.argv[1:]])), args.figures)
            print(f"figures: {args.figures}", file=out)
    except (ExperimentError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"report: {path}", file=out)
    return EXIT_OK


RUN_OPTIONS = (  # ``ina-exp run``'s own options, as its help lists them (one line each)
    ("--tiny | --small | --full", "the preset: CI (seconds), a demo (minutes) or the whole experiment (the default)"),
    ("--switch ina-switch|bmv2", "the switch target (default ina-switch)"),
    ("--out DIR", "results folder (default results/)"),
    ("--rtt-ms MS", "round trip added between each worker and its switch (default: the preset's; 0 on bmv2)"),
    ("--agent-timeout S", "longest wait for one measurement's agents (default 180)"),
    ("--switch-log-level LEVEL", "the switches' log level: trace (slow), debug, info, warn (default), error, off"),
    ("-q, --quiet", "no progress lines"),
)
_METAVARS = {"ints": "LIST", "floats": "LIST", "strs": "LIST", int: "N", float: "X", str: "TEXT"}


def _preset_text(value: Any) -> str:
    """A preset's value as the command line writes it: lists comma-separated, layouts as 2x4."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join("x".join(map(str, v)) if isinstance(v, (list, tuple)) else _preset_text(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return "none" if value is None else str(value)


HELP_WIDTH = 116  # an option's line; longer ones put the presets' values on a line of their own


def _option_lines(cls: Any, flag: str, field: str, kind: Any, help_text: str) -> list[str]:
    """One experiment option: its flag, what it sets, and the presets' values of its field (``[tiny 2,4 | small,
    full 2,8]``; one value where all agree; a switch's field as on or off)."""
    switch = kind in ("true", "false")
    shown = flag if switch else f"{flag} {_METAVARS.get(kind, 'LIST')}"
    presets = {size: _preset_text(getattr(cfg, field)) for size, cfg in cls.presets().items()}
    if switch and not all(text in ("on", "off") for text in presets.values()):
        return [f"  {shown:<26} {help_text}"]
    sizes: dict[str, list[str]] = {}
    for size, text in presets.items():
        sizes.setdefault(text, []).append(size)
    values = next(iter(sizes)) if len(sizes) == 1 else " | ".join(f"{', '.join(s)} {text}" for text, s in sizes.items())
    values = f"[{field} {values}]" if switch else f"[{values}]"
    line = f"  {shown:<26} {help_text} {values}"
    if len(line) <= HELP_WIDTH:
        return [line]
    below = f"  {'':<26} {values}"
    return [f"  {shown:<26} {help_text}", below if len(below) <= HELP_WIDTH else f"      {values}"]


def _run_help(name: str | None, out: TextIO) -> int:
    """``ina-exp run [NAME] --help``: the run's options and the experiment's, each on one line (one screen)."""
    lines = ["usage: ina-exp run NAME|all [--tiny|--small|--full] [run options] [experiment options]", "",
             "run options:", *(f"  {flag:<26} {text}" for flag, text in RUN_OPTIONS)]
    if name and name != "all":
        from topologies.experiments import get_experiment

        try:
            cls = get_experiment(name)
        except KeyError as exc:
            raise UsageError(str(exc).strip("'\"")) from None
        lines += ["", f"{cls.name}: {cls.title}",
                  "experiment options (each replaces the preset's value; [the presets' values]):",
                  *(line for option in cls.options for line in _option_lines(cls, *option)),
                  "", "Every preset's whole configuration: ina-exp list -v. The experiment: docs/experiments.md."]
    else:
        lines += ["", "Each experiment's own options: ina-exp run NAME --help (names: ina-exp list)."]
    print("\n".join(lines), file=out)
    return EXIT_OK


def _with_rtt(cls: Any, overrides: dict, rtt_ms: float | None, switch: str) -> dict:
    """The experiment's overrides with the run's ``--rtt-ms`` (configs with an ``rtt_ms`` field); on BMv2, which
    cannot hold frames, an explicit delay is refused and the presets' delay becomes 0."""
    if rtt_ms is not None and not (rtt_ms >= 0):
        raise UsageError(f"--rtt-ms {rtt_ms:g}: a round trip must be >= 0")
    if switch == "bmv2" and rtt_ms:
        raise UsageError("--rtt-ms: BMv2 cannot delay frames (no netem here; the delay is ina-switch's --link-delay); "
                         "use --switch ina-switch or --rtt-ms 0")
    fields = {f.name for f in dataclasses.fields(cls.Config)} if dataclasses.is_dataclass(cls.Config) else set()
    if "rtt_ms" not in fields:
        return overrides
    if rtt_ms is not None:
        return {**overrides, "rtt_ms": rtt_ms}
    if switch == "bmv2":
        return {**overrides, "rtt_ms": 0.0}
    return overrides


def _preflight(switch: str, classes: Sequence[Any]) -> None:
    """Refuse at once what cannot run here (instead of failing after the topology is up)."""
    if switch != "bmv2":
        return
    import shutil

    from topologies.experiments.testbed import BMV2_PROGRAM, REPO

    if not shutil.which("simple_switch_grpc"):
        raise UsageError("--switch bmv2: simple_switch_grpc is not on PATH (install BMv2, or use --switch ina-switch)")
    if not BMV2_PROGRAM.exists():
        raise UsageError(f"--switch bmv2 needs {BMV2_PROGRAM.relative_to(REPO)}: run `make p4` where p4c is installed")
    faulty = [c.name for c in classes if c.needs_faults]
    if faulty and len(classes) == 1:
        raise UsageError(f"{faulty[0]} injects loss with ina-switch's --fault-drop, which BMv2 does not have; use --switch ina-switch")


class _Signals:
    """SIGINT and SIGTERM raise KeyboardInterrupt once; while the run cleans up, more signals are ignored."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.count = 0
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        self.err.write(f"{PROG}: cleaning up, please wait\n")

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _out_dir(base: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / name / stamp
    k = 1
    while path.exists():
        k += 1
        path = base / name / f"{stamp}-{k}"
    path.mkdir(parents=True)
    latest = base / name / "latest"
    try:
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(path.name)
    except OSError:
        pass
    return path


def run_experiment(exp_cls: Any, config: Any, options: Any, out: TextIO, err: TextIO) -> tuple[int, Path | None]:
    """Run one experiment to its results folder; (exit status, plot path)."""
    from topologies.errors import ExperimentError
    from topologies.experiments.base import RunContext

    out_dir = _out_dir(Path(options.out).resolve(), exp_cls.name)  # child processes run in other folders
    ctx = RunContext(exp_cls, config, options, out_dir, stream=err)
    ctx.progress(f"{exp_cls.title}")
    ctx.progress(f"{options.size} configuration on {options.switch}: {dataclasses.asdict(config)}")
    ctx.progress(f"results in {out_dir}")
    status, code = "complete", EXIT_OK
    try:
        exp_cls(config, ctx).run()
    except KeyboardInterrupt:
        status, code = "interrupted", EXIT_INTERRUPTED
        err.write(f"{PROG}: interrupted; stopped everything, keeping what was measured\n")
    except ExperimentError as exc:
        status, code = "failed", EXIT_FAILED
        ctx.store.doc["errors"].append(str(exc))
        err.write(f"{PROG}: {exc}\n")
    except Exception as exc:  # a bug or an unexpected failure: one line here, the traceback in the results  # noqa: BLE001
        status, code = "failed", EXIT_FAILED
        ctx.store.doc["errors"].append(f"{type(exc).__name__}: {exc}")
        ctx.store.doc["traceback"] = traceback.format_exc()
        err.write(f"{PROG}: {exp_cls.name} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                  f" (traceback in {out_dir / 'results.json'})\n")
    if code == EXIT_OK and ctx.store.doc["errors"]:
        status, code = "complete with errors", EXIT_FAILED
    plot_path = _finish(exp_cls, config, ctx, status, err)
    for line in exp_cls.report(ctx.store.doc["summary"]):
        print(line, file=out)
    print(f"results: {out_dir / 'results.json'}", file=out)
    if plot_path is not None:
        print(f"plot: {plot_path}", file=out)
    out.flush()
    return code, plot_path


def _finish(exp_cls: Any, config: Any, ctx: Any, status: str, err: TextIO) -> Path | None:
    """Summary, plot and the final results.json, also after a failure (with whatever was measured)."""
    from topologies.experiments.base import load_average

    doc = ctx.store.doc
    plot_path = None
    try:
        doc["summary"] = exp_cls.summarize(ctx.rows, config)
    except Exception as exc:  # noqa: BLE001
        doc["errors"].append(f"summary failed: {type(exc).__name__}: {exc}")
    if ctx.rows:
        path = ctx.out_dir / f"{exp_cls.name}.png"
        try:
            exp_cls.plot(ctx.rows, doc["summary"], config, path)
            plot_path = path
            doc["files"]["plot"] = path.name
        except Exception as exc:  # noqa: BLE001
            doc["errors"].append(f"plot failed: {type(exc).__name__}: {exc}")
            err.write(f"{PROG}: plot failed: {type(exc).__name__}: {exc}\n")
    doc["files"].update({"results": "results.json", "csv": "results.csv" if ctx.rows else None,
                         "measurements": "measurements.jsonl"})
    doc["status"] = status
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    doc["environment"]["loadavg_end"] = load_average()
    doc["duration_s"] = round(time.monotonic() - ctx.started, 1)
    ctx.store.save()
    ctx.progress(f"{status} in {doc['duration_s']:.0f} s")
    return plot_path


def _final_cleanup(err: TextIO) -> None:
    """What a crashed earlier run left (dead runs' recorded processes, namespaces, ports); live runs of
    other processes are left alone, and nothing is removed by name."""
    try:
        from topologies.cleanup import cleanup_all

        report = cleanup_all(stop_live=False, sweep=False)
        if report.processes or report.interfaces or report.namespaces:
            err.write(f"{PROG}: cleanup of earlier runs: {report.summary()}\n")
    except Exception as exc:  # never hide the run's own result behind a cleanup problem  # noqa: BLE001
        err.write(f"{PROG}: cleanup: {type(exc).__name__}: {exc}\n")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, rest = build_parser().parse_known_args(argv)
        if args.command is None:
            raise UsageError("choose a command: list, run, plot or report (see ina-exp --help)")
        if args.command in ("list", "plot", "report") and rest:
            raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "list":
            return _list(args.verbose, out)
        if args.command == "plot":
            return _replot(Path(args.results), out)
        if args.command == "report":
            return _report(args, out)
    except UsageError as exc:
        return exc.report(PROG, err)
    with _Signals(err):  # from here on Ctrl-C and SIGTERM stop the run cleanly
        try:
            return _run(args, rest, out, err)
        except KeyboardInterrupt:
            err.write(f"{PROG}: interrupted\n")
            return EXIT_INTERRUPTED


def _run(args: argparse.Namespace, rest: list[str], out: TextIO, err: TextIO) -> int:
    try:
        from topologies.errors import ExperimentError
        from topologies.experiments import get_experiment, load_all
        from topologies.experiments.base import RunOptions

        if args.help:
            return _run_help(args.experiment, out)
        if not args.experiment:
            raise UsageError("name an experiment to run (see ina-exp list) or 'all'")
        if args.experiment == "all":
            if rest:
                raise UsageError(f"experiment options ({' '.join(rest)}) need one experiment, not 'all'")
            classes = list(load_all().values())
            if args.switch == "bmv2":
                skipped = [c.name for c in classes if c.needs_faults]
                classes = [c for c in classes if not c.needs_faults]
                if skipped:
                    print(f"{PROG}: skipping {', '.join(skipped)} on bmv2 (fault injection is ina-switch's)", file=err)
            overrides: list[dict] = [{} for _ in classes]
        else:
            try:
                exp_cls = get_experiment(args.experiment)
            except KeyError as exc:
                raise UsageError(str(exc).strip("'\"")) from None
            ns = experiment_parser(exp_cls).parse_args(rest)
            classes, overrides = [exp_cls], [vars(ns)]
        if args.agent_timeout <= 0:
            raise UsageError("--agent-timeout must be > 0")
        overrides = [_with_rtt(cls, ov, args.rtt_ms, args.switch) for cls, ov in zip(classes, overrides)]
        options = RunOptions(switch=args.switch, size=args.size, out=args.out, log_level=args.switch_log_level,
                             agent_timeout=args.agent_timeout, quiet=args.quiet)
        configs = []
        for cls, ov in zip(classes, overrides):
            try:
                configs.append(cls.make_config(args.size, ov))
            except ExperimentError as exc:
                raise UsageError(str(exc)) from None
        _preflight(args.switch, classes)
        if os.geteuid() != 0:
            raise UsageError("experiments build network namespaces and need root (run as root or with sudo)")
    except UsageError as exc:
        return exc.report(PROG, err)

    codes = []
    plots = []
    try:
        for cls, cfg in zip(classes, configs):
            code, plot = run_experiment(cls, cfg, options, out, err)
            codes.append(code)
            if plot:
                plots.append(plot)
            if code == EXIT_INTERRUPTED:
                break
    except KeyboardInterrupt:  # between experiments
        codes.append(EXIT_INTERRUPTED)
    finally:
        _final_cleanup(err)
    if len(classes) > 1 and plots:
        print("plots:", file=out)
        for p in plots:
            print(f"  {p}", file=out)
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if any(codes) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
