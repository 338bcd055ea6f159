"""``ina-agent``: usage errors, the all-reduce benchmark and training with each allocation mode, against the fake controller."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from host_agent import cli
from inaproto.credentials import JOB_SECRET_ENV
from topologies.loopback import LoopbackCluster, run_workers


@pytest.mark.parametrize("argv, message", [
    ([], "choose a command"),
    (["frobnicate"], "invalid choice"),
    (["allreduce", "--worker-id", "0"], "one of the arguments --workers --job-file is required"),
    (["allreduce", "--workers", "10.0.0.1", "--worker-id", "0"], "is not IP:PORT"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "4"], "has no worker 4"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--elements", "0"], "must be >= 1"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--backend", "ina"], "needs --controller"),
    (["allreduce", "--job-file", "/nonexistent.json", "--worker-id", "0"], "cannot read job file"),
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--allocation", "greedy"], "invalid choice"),
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--slowdown", "0.5"], "slowdown must be >= 1"),
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--compute", "torch", "--device-slowdown", "0.5"],
     "device slowdown must be finite and >= 1"),
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--lr", "-1"], "must be > 0"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--path-rtt-floor-ms", "-1"], "must be >= 0"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--ring-block-seconds", "inf"], "must be >= 0 and finite"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ina-agent: error: ") and message in err


def test_runtime_failure_exits_1_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "host_agent.cli", "allreduce", "--workers", "127.0.0.1:0", "--worker-id", "0",
         "--controller", "127.0.0.1:1", "--controller-retry", "1", "--timeout", "2", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "UNAVAILABLE" in proc.stderr


def test_bad_job_file_is_a_usage_error(tmp_path, capsys) -> None:
    path = tmp_path / "job.json"
    path.write_text('{"name": "x"}')
    assert cli.main(["train", "--job-file", str(path), "--worker-id", "0"]) == 2
    assert "bad job file" in capsys.readouterr().err


def _worker_list(cl: LoopbackCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """The cluster's workers for ``--workers``, their job's secret in $INA_JOB_SECRET."""
    monkeypatch.setenv(JOB_SECRET_ENV, cl.spec.secret)
    addresses = []
    for w, (udp, tcp) in zip(cl.spec.workers, cl.sockets):  # the CLI binds its own sockets on these addresses
        addresses.append(f"{w.ip}:{w.udp_port}@{w.host}")
        udp.close()
        tcp.close()
    return ",".join(addresses)


def test_allreduce_benchmark_prints_time_goodput_and_json(tmp_path, capsys, monkeypatch) -> None:
    n = 3
    with LoopbackCluster(["s1"] * n, slots=16) as cl:
        workers = _worker_list(cl, monkeypatch)
        codes = run_workers(n, lambda i: cli.main([
            "allreduce", "--controller", cl.address, "--workers", workers, "--worker-id", str(i),
            "--job-name", "bench", "--elements", "5000", "--iterations", "3", "--quiet",
            "--json", str(tmp_path / f"w{i}.json")]))
    assert codes == [0] * n
    out = capsys.readouterr().out
    assert out.count("ina all-reduce of 5000 float32") == n and "goodput" in out
    for i in range(n):
        res = json.loads((tmp_path / f"w{i}.json").read_text())
        assert res["backend"] == "ina" and res["workers"] == n and len(res["seconds"]) == 3
        assert res["goodput_gbps"] > 0 and res["stats"]["calls"] == 4  # warm-up and 3 timed
        marks = res["timeline"]  # the worker's life in order (experiment 3's phases)
        order = [marks[k] for k in ("process", "main", "opened", "first_call", "first_call_end", "last_call", "closed")]
        assert all(isinstance(v, float) for v in order) and order == sorted(order)


def _run_entry_point(argv: list[str], stdin: str) -> subprocess.CompletedProcess:
    code = "import sys; from host_agent.cli import run; run()"
    return subprocess.run([sys.executable, "-c", code, *argv], input=stdin, capture_output=True, text=True, timeout=60, check=False)


def test_a_warm_started_agent_signals_ready_then_runs_the_arguments_it_reads(tmp_path) -> None:
    ready = tmp_path / "ready"
    proc = _run_entry_point([cli.WARM_START, str(ready)], json.dumps(["allreduce", "--workers", "10.0.0.1",
                                                                       "--worker-id", "0"]) + "\n")
    assert ready.exists()
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not IP:PORT" in proc.stderr


@pytest.mark.parametrize("argv, stdin, code, message", [
    ([], "", 0, ""),  # stdin closed without a job: a quiet exit
    ([], "not json\n", 2, "is not JSON"),
    ([], '{"a": 1}\n', 2, "a JSON list of strings"),
    (["extra"], "", 2, "usage: ina-agent --warm-start READY_FILE"),
])
def test_warm_start_input_errors_are_one_line(tmp_path, argv, stdin, code, message) -> None:
    proc = _run_entry_point([cli.WARM_START, str(tmp_path / "ready"), *argv], stdin)
    assert proc.returncode == code
    assert proc.stderr.count("\n") == (1 if message else 0) and message in proc.stderr


def test_a_warm_start_ready_file_that_cannot_be_created_is_one_line(tmp_path) -> None:
    proc = _run_entry_point([cli.WARM_START, str(tmp_path / "missing" / "ready")], "")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot create" in proc.stderr


def test_the_testbed_and_the_agent_name_warm_start_alike() -> None:
    from topologies.experiments.testbed import WARM_START

    assert WARM_START == cli.WARM_START


@pytest.mark.parametrize("allocation", ["equal", "static", "adaptive"])
def test_train_allocation_modes(allocation, tmp_path, monkeypatch) -> None:
    """Every worker ends with the same model; the loss falls; adaptive gives the slow worker fewer samples."""
    n = 3
    with LoopbackCluster(["s1"] * n, slots=16) as cl:
        workers = _worker_list(cl, monkeypatch)

        def worker(i: int) -> int:
            argv = ["train", "--controller", cl.address, "--workers", workers, "--worker-id", str(i),
                    "--job-name", f"train-{allocation}", "--allocation", allocation, "--steps", "40",
                    "--global-batch", "60", "--update-every", "8", "--quiet", "--json", str(tmp_path / f"w{i}.json")]
            if i == 2 and allocation != "equal":
                argv += ["--slowdown", "4"]
            return cli.main(argv)

        assert run_workers(n, worker) == [0] * n
    res = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(n)]
    assert len({r["final_params_digest"] for r in res}) == 1
    assert res[0]["losses"] == res[1]["losses"] == res[2]["losses"]
    assert res[0]["losses"][-1] < 0.5 * res[0]["losses"][0]
    final = res[0]["batch_sizes"][-1]
    assert sum(final) == 60
    if allocation == "equal":
        assert final == [20, 20, 20]
    else:
        assert final[2] < min(final[0], final[1]), f"{allocation}: the slow worker should get fewer samples: {final}"
