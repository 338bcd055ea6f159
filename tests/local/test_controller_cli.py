"""inactl against an in-process controller: every command, --json, and one-line errors with non-zero exits."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys

import pytest

from controller import cli
from inaproto import admission_pb2 as pb
from topologies.loopback import LocalControlPlane, worker


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    with LocalControlPlane(tmp_path_factory.mktemp("cli") / "ctl.db", pool=16) as harness:
        for name, hosts, slots in (("alpha", ["h11", "h12"], 8), ("beta", ["h13", "h14"], 16)):
            harness.stub.RegisterJob(pb.RegisterJobRequest(
                name=name, workers=[worker(i, x) for i, x in enumerate(hosts)], tensor_elements=4096,
                requested_slots=slots, priority=len(name)))
        yield harness


def run(h, *argv):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--controller", h.address, "--credential-file", str(h.controller.authority.path), *argv]
                    if h else list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_jobs_table_and_json(h):
    code, out, err = run(h, "jobs")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["ID", "NAME", "STATE", "BACKEND", "GEN"]
    assert "alpha" in lines[1] and "s1[0:8)" in lines[1] and "beta" in lines[2] and "s1[8:16)" in lines[2]
    code, out, _ = run(h, "jobs", "--json")
    doc = json.loads(out)
    assert [(j["job_id"], j["name"], j["state"]) for j in doc["jobs"]] == [(1, "alpha", "running"), (2, "beta", "running")]
    assert doc["jobs"][0]["grant"]["switches"][0]["num_slots"] == 8


def test_json_flag_goes_before_or_after_the_command(h):
    assert json.loads(run(h, "--json", "memory")[1]) == json.loads(run(h, "memory", "--json")[1])


def test_job_show(h):
    code, out, _ = run(h, "job", "show", "2")
    assert code == 0
    assert out.startswith("job 2 'beta': running, backend ina, generation")
    assert "switch s1 (rack r1): slots [8, 16), multicast group 3, workers [0, 1] via 10.0.1.254" in out
    assert "worker 1: h14 10.0.1.4:40001 02:00:00:00:01:04" in out
    doc = json.loads(run(h, "job", "show", "2", "--json")[1])
    assert doc["job_id"] == 2 and doc["request"]["priority"] == 4 and doc["grant"]["scale"] == 65536.0


def test_memory(h):
    code, out, _ = run(h, "memory")
    assert code == 0
    assert out.splitlines()[0] == "s1: 16/16 slots used, 0 free, largest free 0, fragmentation 0.00"
    assert "[   0,    8)      8  job 1" in out and "|" + "1" * 32 + "2" * 32 + "|" in out
    doc = json.loads(run(h, "memory", "--json")[1])
    (s1,) = doc["switches"]
    assert [(r["base"], r["size"], r["job_id"], r["free"]) for r in s1["ranges"]] == [(0, 8, 1, False), (8, 8, 2, False)]


def test_stats(h):
    code, out, _ = run(h, "stats")
    assert code == 0 and out.splitlines()[0].split() == ["JOB", "SWITCH", "AGGREGATED", "DUPLICATES", "RESULTS", "DROPS"]
    assert "switch drops:" in out
    doc = json.loads(run(h, "stats", "1", "--json")[1])
    assert [s["job_id"] for s in doc["stats"]] == [1] and set(doc["stats"][0]["drops"]) >= {"stale_generation"}


def test_watch_refreshes(h):
    code, out, _ = run(h, "watch", "--interval", "0.01", "--count", "2", "--json")
    frames = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(frames) == 2 and [j["name"] for j in frames[0]["jobs"]] == ["alpha", "beta"]
    code, out, _ = run(h, "watch", "--interval", "0.01", "--count", "1")
    assert code == 0 and "inactl watch" in out and "alpha" in out and "s1: 16/16" in out


def test_policy_show_and_set(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as h:
        code, out, _ = run(h, "policy", "show")
        assert code == 0 and out.startswith("policy: first-fit (available: equal, first-fit, priority, weighted)")
        code, out, _ = run(h, "policy", "set", "priority")
        assert code == 0 and out.startswith("policy: priority")
        assert json.loads(run(h, "policy", "show", "--json")[1])["policy"] == "priority"
        code, out, err = run(h, "policy", "set", "lottery")
        assert code == cli.EXIT_REFUSED and out == ""
        assert err.count("\n") == 1 and err.startswith("inactl: invalid argument: unknown allocation policy 'lottery'")


def test_release(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as h:
        h.stub.RegisterJob(pb.RegisterJobRequest(name="x", workers=[worker(0, "h11")], tensor_elements=10))
        assert run(h, "release", "1") == (0, "job 1 released\n", "")
        code, _out, err = run(h, "release", "1")
        assert code == cli.EXIT_REFUSED and err == "inactl: not found: job 1 not found\n"


@pytest.mark.parametrize(
    "argv",
    [("job", "show", "99"), ("stats", "99")],
)
def test_unknown_job_is_one_line_and_exit_1(h, argv):
    code, out, err = run(h, *argv)
    assert code == cli.EXIT_REFUSED and out == "" and err == "inactl: not found: job 99 not found\n"


@pytest.mark.parametrize(
    "argv, words",
    [
        ((), "the following arguments are required"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("job", "show", "abc"), "job id must be an integer"),
        (("job", "show"), "the following arguments are required: ID"),
        (("policy",), "required"),
        (("release",), "required: ID"),
        (("watch", "--interval", "soon"), "invalid float value"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, words):
    code, out, err = run(None, *argv)
    assert code == cli.EXIT_USAGE and out == ""
    assert err.count("\n") == 1 and err.startswith("inactl: ") and words in err


def test_unreachable_controller_is_one_line_and_exit_3():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--controller", f"127.0.0.1:{port}", "--timeout", "2", "jobs"], out=out, err=err)
    assert code == cli.EXIT_UNREACHABLE and out.getvalue() == ""
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith(f"inactl: cannot reach the controller at 127.0.0.1:{port}")


def test_runs_as_a_program(h):
    env = {**os.environ, "INA_ADMIN_CREDENTIAL_FILE": str(h.controller.authority.path)}
    proc = subprocess.run([sys.executable, "-m", "controller.cli", "--controller", h.address, "jobs", "--json"],
                          capture_output=True, text=True, timeout=30, env=env, check=False)
    assert proc.returncode == 0 and [j["name"] for j in json.loads(proc.stdout)["jobs"]] == ["alpha", "beta"]
