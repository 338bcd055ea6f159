"""BMv2's ``simple_switch_grpc`` started with the same TLS flags as ina-switch
(tests/integration/test_switch_tls.py): ina-controller connects over mutual TLS and installs a job;
plaintext is refused. Runs only where BMv2 and p4c are installed, under /tmp/ina-integration.lock."""
from __future__ import annotations

from pathlib import Path

from tests.integration.switch_tls import run_tls_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_bmv2_over_mutual_tls_installs_a_job_and_refuses_plaintext(tmp_path, p4c_build):
    run_tls_scenario("bmv2", tmp_path, device_config=p4c_build / "ina.json")
