"""BMv2's ``simple_switch_grpc`` started with the same TLS flags as ina-switch
(tests/integration/test_switch_tls.py): ina-controller connects over mutual TLS and installs a job;
plaintext is refused. Runs only where BMv2 and p4c are installed, under /tmp/ina-integration.lock."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.switch_tls import run_tls_scenario

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.bmv2


def test_bmv2_over_mutual_tls_installs_a_job_and_refuses_plaintext(tmp_path):
    if shutil.which("simple_switch_grpc") is None or shutil.which("p4c-bm2-ss") is None:
        pytest.skip("simple_switch_grpc / p4c-bm2-ss are not on PATH (source ../shared/bmv2/env.sh)")
    program = tmp_path / "ina.json"
    subprocess.run(["p4c-bm2-ss", "--p4v", "16", "-o", str(program), str(ROOT / "p4src" / "ina.p4")], check=True)
    run_tls_scenario("bmv2", tmp_path, device_config=program)
