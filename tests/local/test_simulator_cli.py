"""ina-sim command line: a tiny end-to-end run, trace generation, and one-line usage errors."""
from __future__ import annotations

import csv
import json
import subprocess

import pytest

from controller.policies import POLICIES
from inaproto.commands import Command, command_argv
from simulator.cli import main
from simulator.trace import read_trace

TINY = ["--racks", "4", "--slots", "512", "--set", "workload.iterations_median=200", "--quiet"]


def test_run_compares_policies_and_writes_its_files(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", "--synthetic", "40", "--policy", "equal,first-fit,weighted,priority", "--seed", "3",
               "--out", str(out), "--set", "check=true", *TINY])
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    for policy in ("equal", "first-fit", "weighted", "priority"):
        assert {f"{policy}_jobs.csv", f"{policy}_timeline.csv"} <= names
        rows = list(csv.DictReader((out / f"{policy}_jobs.csv").read_text().splitlines()))
        assert len(rows) == 40 and all(float(r["jct_s"]) > 0 for r in rows)
    assert {"summary.json", "summary.csv", "comparison.png", "trace.csv"} <= names
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert [r["policy"] for r in summary["results"]] == ["equal", "first-fit", "weighted", "priority"]
    for r in summary["results"]:
        assert r["jobs_finished"] == 40 and 0 <= r["slot_utilisation"] <= 1
        assert r["p50_jct_s"] <= r["p99_jct_s"]
    assert summary["config"]["cluster"]["racks"] == 4 and summary["config"]["check"] is True
    assert "mean JCT" in capsys.readouterr().out
    # The trace the run used is saved, and replaying it gives the same numbers.
    again = tmp_path / "again"
    assert main(["run", "--trace", str(out / "trace.csv"), "--policy", "weighted", "--no-plot", "--out", str(again), *TINY]) == 0
    first = next(r for r in summary["results"] if r["policy"] == "weighted")
    second = json.loads((again / "summary.json").read_text())["results"][0]
    assert second["mean_jct_s"] == first["mean_jct_s"] and second["events"] == first["events"]


def test_gen_trace_writes_a_readable_trace(tmp_path, capsys):
    path = tmp_path / "t.csv"
    assert main(["gen-trace", "25", "--seed", "2", "--out", str(path), "--set", "workload.hetero=0.5"]) == 0
    jobs = read_trace(path)
    assert len(jobs) == 25 and any(len(j.compute_s) > 1 for j in jobs)
    assert "wrote 25 jobs" in capsys.readouterr().out


def test_print_config_is_a_file_run_reads_back(capsys, tmp_path):
    """--print-config prints every setting as TOML (flags and --set applied); --config reads it back."""
    assert main(["run", "--print-config", "--racks", "4", "--set", "calibration.ina_rtt_us=40"]) == 0
    text = capsys.readouterr().out
    assert "[calibration]" in text and "ina_rtt_us = 40" in text and "racks = 4" in text
    (tmp_path / "sim.toml").write_text(text)
    out = tmp_path / "o"
    assert main(["run", "--synthetic", "5", "--config", str(tmp_path / "sim.toml"), "--no-plot", "--policy", "equal",
                 "--out", str(out), "--quiet"]) == 0
    config = json.loads((out / "summary.json").read_text())["config"]
    assert config["calibration"]["ina_rtt_us"] == 40 and config["cluster"]["racks"] == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--policy", "equal"], "one of the arguments --trace --synthetic is required"),
        (["run", "--synthetic", "5", "--policy", "best"], "unknown allocation policy 'best'"),
        (["run", "--synthetic", "5", "--racks", "0"], "must be >= 1"),
        (["run", "--synthetic", "5", "--placement", "random"], "invalid choice"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_usage_errors_exit_nonzero_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


def test_bad_input_files_exit_nonzero_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,arrival_s\n")
    assert main(["run", "--trace", str(bad), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert main(["run", "--trace", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    config = tmp_path / "sim.toml"
    config.write_text("[calibration]\nbogus = 1\n")
    assert main(["run", "--synthetic", "3", "--config", str(config), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("ina-sim: error:") for line in lines)
    assert "missing column" in lines[0] and "cannot read trace" in lines[1] and "bogus" in lines[2]


def test_job_bigger_than_the_cluster_is_an_error(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,arrival_s,num_workers,grad_bytes,iterations,compute_s\n1,0,99,1,1,0.1\n")
    assert main(["run", "--trace", str(trace), "--racks", "2", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need more than the cluster's 16 workers" in err[0]


def test_empty_trace_runs(tmp_path):
    assert main(["run", "--synthetic", "0", "--out", str(tmp_path), "--quiet"]) == 0
    assert (tmp_path / "comparison.png").exists()


def test_policy_all_means_every_registered_policy(tmp_path):
    assert main(["run", "--synthetic", "5", "--policy", "all", "--no-plot", "--out", str(tmp_path), *TINY]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["policy"] for r in summary["results"]] == list(POLICIES)


@pytest.mark.local
def test_console_script_usage_error_exits_nonzero():
    proc = subprocess.run([*command_argv(Command.SIM), "run"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("ina-sim run: error:")


def test_the_docs_list_every_setting_as_the_configuration_documents_it():
    """docs/simulation.md's settings table is generated from SimConfig's documented fields (tests/unit/
    test_settings_docs.py keeps every marked table current)."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "simulation.md").read_text()
    assert "<!-- settings: simulator.config:SimConfig -->" in docs
