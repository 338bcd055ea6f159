"""``ina-agent``: usage errors, its configuration, the all-reduce benchmark and training with each allocation mode,
against the fake controller."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from host_agent import cli
from host_agent.options import AgentOptions, StreamOptions
from inaproto.config import load
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
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--speed", "1,x"], "--speed"),
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--compute", "torch", "--device-slowdown", "0.5"],
     "device slowdown must be finite and >= 1"),
    (["train", "--workers", "10.0.0.1:5", "--worker-id", "0", "--lr", "-1"], "must be > 0"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--set", "stream.path_rtt_floor=-1"],
     "path_rtt_floor must be >= 0"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--set", "stream.rto_min=inf"], "rto_min <= rto_initial"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--set", "stream.io=1"], "unknown key stream.io"),
    (["allreduce", "--workers", "10.0.0.1:5", "--worker-id", "0", "--config", "/nonexistent.toml"], "cannot read"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ina-agent: error: ") and message in err


def test_runtime_failure_exits_1_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "host_agent.cli", "allreduce", "--workers", "127.0.0.1:0", "--worker-id", "0",
         "--controller", "127.0.0.1:1", "--set", "controller_retry=1", "--timeout", "2", "--quiet"],
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


def test_the_configuration_comes_from_a_file_with_settings_and_flags_on_top(tmp_path, capsys) -> None:
    """``--print-config`` prints the effective configuration as a file ``--config`` reads back; ``--set`` goes over the
    file and ``--timeout`` over both (a run's flags last); it needs no job."""
    assert cli.main(["allreduce", "--print-config"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "agent.toml"
    path.write_text(text)
    assert load(AgentOptions, path) == AgentOptions()
    path.write_text(text.replace("op_timeout = 60.0", "op_timeout = 7.0").replace("rpc_timeout = 10.0", "rpc_timeout = 3.0"))
    assert cli.main(["train", "--config", str(path), "--set", "stream.rto_max=2.0", "--timeout", "9", "--print-config"]) == 0
    printed = tmp_path / "printed.toml"
    printed.write_text(capsys.readouterr().out)
    opts = load(AgentOptions, printed)
    assert opts.rpc_timeout == 3.0 and opts.stream.rto_max == 2.0
    assert opts.stream.op_timeout == opts.rendezvous_timeout == 9.0
    assert opts.stream == StreamOptions(op_timeout=9.0, rto_max=2.0)


def test_the_help_of_each_command_fits_one_screen(capsys) -> None:
    for argv in (["--help"], ["allreduce", "--help"], ["train", "--help"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(argv)
        assert len(capsys.readouterr().out.splitlines()) <= 45, argv


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
                argv += ["--speed", "0.25"]
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
