"""The lab's warm start of an agent (``topologies.experiments.warm_agent``, ``Testbed.prestart``): imports first, then
the ``ina-agent`` arguments read from stdin; mistakes are one line."""
from __future__ import annotations

import json
import subprocess

import pytest

from topologies.experiments.testbed import WARM_AGENT


def _launch(argv: list[str], stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([*WARM_AGENT, *argv], input=stdin, capture_output=True, text=True, timeout=60, check=False)


def test_a_warm_started_agent_signals_ready_then_runs_the_arguments_it_reads(tmp_path) -> None:
    ready = tmp_path / "ready"
    proc = _launch([str(ready)], json.dumps(["allreduce", "--workers", "10.0.0.1", "--worker-id", "0"]) + "\n")
    assert ready.exists()
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not IP:PORT" in proc.stderr


@pytest.mark.parametrize("argv, stdin, code, message", [
    ([], "", 0, ""),  # stdin closed without a job: a quiet exit
    ([], "not json\n", 2, "is not JSON"),
    ([], '{"a": 1}\n', 2, "a JSON list of strings"),
    (["extra"], "", 2, "usage: python -m topologies.experiments.warm_agent READY_FILE"),
])
def test_warm_start_input_errors_are_one_line(tmp_path, argv, stdin, code, message) -> None:
    proc = _launch([str(tmp_path / "ready"), *argv], stdin)
    assert proc.returncode == code
    assert proc.stderr.count("\n") == (1 if message else 0) and message in proc.stderr


def test_a_warm_start_ready_file_that_cannot_be_created_is_one_line(tmp_path) -> None:
    proc = _launch([str(tmp_path / "missing" / "ready")], "")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot create" in proc.stderr

