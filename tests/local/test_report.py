"""ina-exp report without a testbed: targets declared as data and judged per repetition and on their median, the
results page over synthetic runs of all six experiments, the figures summary and its docs table. No root needed."""
from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import pytest

from tests.report_results import NAMES, synthetic_doc, write_all, write_run
from topologies import runner
from topologies.errors import ExperimentError
from topologies.experiments import get_experiment, load_all
from topologies.experiments.base import Comparison, Target
from topologies.experiments.figures import BEGIN, END, insert_table
from topologies.experiments.report import find_runs, group_runs
from topologies.experiments.targets import judge, lookup, measure, repetitions


def ina_exp(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = runner.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# --- targets as data ---------------------------------------------------------------------------------------------
SUMMARY = {"points": [{"workers": 2, "r": 0.9, "ideal": 1.0, "ok": True}, {"workers": 8, "r": 1.3, "ideal": 1.2, "ok": False}],
           "runs": {"tree": {"x": 1.0}, "star": {"x": 2.0}},
           "targets": [{"loss": 0.01, "share": 0.93}, {"loss": 0.05, "share": 0.6}]}


@pytest.mark.parametrize("key, values", [
    ("points[-1].r", [1.3]),
    ("points[0].workers", [2]),
    ("points.*.r", [0.9, 1.3]),
    ("points[workers=8].ideal", [1.2]),
    ("points[workers=8,ok=false].r", [1.3]),
    ("points[workers=8,ok=true].r", []),
    ("runs.*.x", [1.0, 2.0]),
    ("targets[loss=0.05].share", [0.6]),
    ("points[5].r", []),
    ("nothing.here", []),
])
def test_lookup_finds_every_value_a_key_names(key, values):
    assert lookup(SUMMARY, key) == values


def test_a_target_judges_the_worst_value_its_key_finds_against_its_reference():
    at_most = Target("r at most 1.1 x its ideal", "points.*.r", Comparison.AT_MOST, 1.1, reference="points.*.ideal")
    assert measure(at_most, SUMMARY) == pytest.approx(1.3 / 1.2)  # the larger of 0.9 and 1.083
    assert at_most.met(1.05) and not at_most.met(1.2)
    within = Target("r within 5 % of 1", "points.*.r", Comparison.WITHIN, 0.05, reference=1.0)
    assert measure(within, SUMMARY) == pytest.approx(1.3) and not within.met(1.3) and within.met(0.96)
    at_least = Target("share at least 70 %", "targets.*.share", Comparison.AT_LEAST, 0.7, fmt=".0%")
    assert measure(at_least, SUMMARY) == 0.6 and at_least.bound_text() == ">= 70%"
    holds = Target("every point ok", "points.*.ok", Comparison.HOLDS)
    assert measure(holds, SUMMARY) is False and holds.bound_text() == "true"
    assert measure(Target("absent", "points[workers=4].r", Comparison.AT_MOST, 1.0), SUMMARY) is None
    with pytest.raises(ValueError):
        Target("a bound is needed", "x", Comparison.AT_MOST)
    with pytest.raises(ValueError):
        Target("no bound for holds", "x", Comparison.HOLDS, 1.0)


def test_every_experiment_declares_anchors_and_targets_its_full_configuration_measures():
    assert list(load_all()) == list(NAMES)
    for name in NAMES:
        cls = get_experiment(name)
        assert cls.anchors and cls.targets, name
        reps = repetitions(cls, synthetic_doc(name, "full"), "run")
        for target in cls.targets:
            j = judge(target, reps)
            assert j.measured and j.met, (name, target.words, j.values)  # synthetic runs meet every target


def test_missed_targets_are_marked_missed():
    reps = repetitions(get_experiment("allreduce"), synthetic_doc("allreduce", "small", slow=2.0), "run")
    judgements = [judge(t, reps) for t in get_experiment("allreduce").targets]
    assert [j.met for j in judgements] == [False, False, False] and judgements[2].text() == "2.10"


def test_each_repetition_is_judged_and_the_median_over_them(tmp_path):
    for slow in (1.0, 1.0, 3.0):  # three runs: repetitions of one experiment
        write_run(tmp_path, "loss", "tiny", slow=slow)
    (group,) = group_runs(find_runs([tmp_path / "loss"], last=3))
    goodput = group.judgements[1]  # at 5 % loss, at least 70 % of lossless
    assert [round(q, 3) for q in goodput.quantities] == [0.833, 0.833, 0.625]
    assert goodput.met and goodput.met_count == 2 and goodput.text() == "83% [62%-83%]" and group.same_configuration
    assert not group.judgements[0].measured and group.judgements[0].met is None  # no 1 % point in --tiny
    # repetitions inside one run: each repetition's rows summarized apart
    reps = repetitions(get_experiment("rina"), synthetic_doc("rina", "small", repetitions=3), "run")
    assert [r.label for r in reps] == ["run #0", "run #1", "run #2"]
    j = judge(get_experiment("rina").targets[1], reps)  # Rina over single-switch INA, 1.02-1.04 by repetition
    assert [round(q, 2) for q in j.quantities] == [1.02, 1.03, 1.04] and j.text() == "1.03 [1.02-1.04]"


# --- the page ----------------------------------------------------------------------------------------------------
def test_report_over_tiny_results_of_all_six_shows_each_with_its_anchor_and_targets(tmp_path):
    write_all(tmp_path / "results", "tiny")
    code, out, err = ina_exp("report", str(tmp_path / "results"))
    assert code == 0, err
    path = Path(out.strip().split("report: ")[1])
    assert path == (tmp_path / "results" / "report.html").resolve()
    page = path.read_text()
    for name in NAMES:
        cls = get_experiment(name)
        section = page.split(f'<section id="{name}">')[1].split("</section>")[0]
        for anchor in cls.anchors:
            assert f"<h4>{html.escape(anchor.system)}</h4>" in section and html.escape(anchor.figure) in section
        for target in cls.targets:
            assert html.escape(target.words) in section, target.words
        assert 'class="verdict met"' in section and "<h5>config</h5>" in section and "<h5>options</h5>" in section
    assert page.count('src="data:image/png;base64,') == 2 * len(NAMES)  # each plot and its targets chart
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<script" not in page  # one file, no network
    assert "AMD" in page or "Intel" in page or "cores" in page  # the machine


def test_old_results_without_machine_plot_or_known_experiment_still_render(tmp_path):
    run_dir = write_run(tmp_path, "loss", "tiny")
    doc = json.loads((run_dir / "results.json").read_text())
    doc["environment"] = {"python": "3.11.2"}
    doc["files"] = {}
    (run_dir / "results.json").write_text(json.dumps(doc))
    other = tmp_path / "retired" / "20200101-000000"
    other.mkdir(parents=True)
    (other / "results.json").write_text(json.dumps({"experiment": "retired", "status": "complete", "summary": {"x": 1}}))
    code, _, err = ina_exp("report", str(tmp_path), "-o", str(tmp_path / "page.html"))
    assert code == 0, err
    page = (tmp_path / "page.html").read_text()
    assert "has no plot" in page and "not recorded" in page and 'id="retired"' in page


def test_each_daemon_a_run_started_is_shown_with_its_settings_beside_their_defaults(tmp_path):
    from controller.config import ControllerConfig
    from host_agent.options import AgentOptions
    from inaproto.config import reference
    from softswitch.config import FaultSettings, SwitchConfig
    from topologies.daemons import DaemonRecord

    run_dir = write_run(tmp_path, "loss", "tiny")
    record = DaemonRecord()
    record.add_switch("s1", SwitchConfig(device_id=1, faults=FaultSettings(drop=("0.05",), seed=1)))
    for start in (1, 2):
        record.add_controller(start, ControllerConfig(policy="priority"))
    record.add_agents("loss-1", range(4), AgentOptions())
    doc = json.loads((run_dir / "results.json").read_text())
    doc["daemons"] = {"runs": {"01-loss5-ina": record.as_dict()}}
    (run_dir / "results.json").write_text(json.dumps(doc))
    code, _, err = ina_exp("report", str(run_dir), "-o", str(tmp_path / "page.html"))
    assert code == 0, err
    page = html.unescape((tmp_path / "page.html").read_text())
    assert "runs/01-loss5-ina</code>: 1 switch, the controller (2 starts), the agents of 1 job" in page
    assert 'faults.drop = ["0.05"]\nfaults.seed = 1</pre>' in page and "device_id = 1" in page
    assert "controller, starts 1-2" in page and 'policy = "priority"' in page
    assert f"agents: loss-1 (workers 0-3)</td><td><span class=\"note\">all {len(reference(AgentOptions))} settings at " \
           "their defaults" in page


def test_runs_of_different_configurations_are_flagged(tmp_path):
    write_run(tmp_path, "loss", "tiny")
    write_run(tmp_path, "loss", "small")
    code, _, err = ina_exp("report", str(tmp_path / "loss"), "--last", "2", "--figures", str(tmp_path / "f.json"))
    assert code == 0, err
    assert "differ in their options or configuration" in (tmp_path / "report.html").read_text()
    code, table, _ = ina_exp("report", "--markdown", str(tmp_path / "f.json"))
    assert "`loss` (small, tiny; " in table and "; configurations differ)" in table


def test_find_runs_takes_the_newest_finished_runs_of_each_experiment(tmp_path):
    a = [write_run(tmp_path, "loss", "tiny") for _ in range(3)]
    b = write_run(tmp_path, "tree", "tiny")
    doc = json.loads((a[-1] / "results.json").read_text())
    (a[-1] / "results.json").write_text(json.dumps({**doc, "status": "running"}))
    assert [r.path for r in find_runs([tmp_path])] == [a[1], b]  # newest finished; `latest` links not followed
    assert [r.path for r in find_runs([tmp_path / "loss"], last=5)] == a[:2]
    assert [r.path for r in find_runs([a[-1], a[-1] / "results.json", tmp_path / "tree"])] == [a[-1], b]


@pytest.mark.parametrize("argv, message", [
    (["report", "{tmp}/none"], "no such results folder"),
    (["report", "{tmp}"], "no results in"),
    (["report", "--last", "0"], "--last must be >= 1"),
    (["report", "--into", "x.md"], "--into DOC needs --markdown"),
    (["report", "--markdown", "{tmp}/figures.json"], "no readable figures summary"),
    (["report", "--markdown", "f.json", "{tmp}"], "--markdown reads a figures summary only"),
])
def test_report_usage_errors_are_one_line_and_exit_2(tmp_path, argv, message):
    code, out, err = ina_exp(*(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out


# --- the docs' figures table -------------------------------------------------------------------------------------
def test_figures_summary_and_the_docs_table_made_from_it(tmp_path):
    for _ in range(3):
        write_run(tmp_path / "results", "loss", "tiny")
    figures = tmp_path / "figures.json"
    code, out, err = ina_exp("report", str(tmp_path / "results"), "--last", "3", "--figures", str(figures))
    assert code == 0 and f"figures: {figures}" in out, err
    (loss,) = json.loads(figures.read_text())["experiments"]
    assert loss["repetitions"] == 3 and len(loss["targets"]) == 3 and loss["machines"] and loss["anchors"] == ["SwitchML"]
    assert loss["targets"][1]["median"] == pytest.approx(1 / 1.2) and loss["targets"][1]["met"] is True
    assert loss["targets"][0]["met"] is None  # the tiny preset has no 1 % point
    code, table, err = ina_exp("report", "--markdown", str(figures))
    assert code == 0, err
    lines = table.splitlines()
    assert "median over the repetitions [min-max]" in lines[0] and "Machine: " in lines[0]
    assert "| >= 70% | 83% [83%-83%] | 3 | **met** (3/3 repetitions) |" in next(x for x in lines if "at 5 % loss" in x)
    assert "| held in 3 of 3 | 3 | **met** (3/3 repetitions) |" in next(x for x in lines if "every result exact" in x)
    assert "| not measured | 0 | not measured |" in next(x for x in lines if "at 1 % loss" in x)
    doc = tmp_path / "experiments.md"
    doc.write_text(f"# Experiments\n\n{BEGIN}\nold table\n{END}\n\nmore\n")
    code, out, err = ina_exp("report", "--markdown", str(figures), "--into", str(doc))
    assert code == 0 and out == f"figures table: {doc}\n", err
    assert doc.read_text() == f"# Experiments\n\n{BEGIN}\n{table}{END}\n\nmore\n"
    with pytest.raises(ExperimentError, match="no figures markers"):
        insert_table("no markers here", table)


def test_a_run_records_its_machine_commit_and_load(tmp_path):
    env = json.loads((write_run(tmp_path, "loss", "tiny") / "results.json").read_text())["environment"]
    assert env["cpus"] >= 1 and env["python"] and env["kernel"] and env["cpu_model"] and env["os"]
    assert len(env["loadavg_start"]) == 3 and len(env["loadavg_end"]) == 3
    assert "git_commit" not in env or isinstance(env["git_modified"], bool)
