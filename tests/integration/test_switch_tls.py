"""``ina-switch`` serving P4Runtime over mutual TLS from its command line (BMv2's flags); run under
/tmp/ina-integration.lock. The same scenario on BMv2 is tests/bmv2/test_bmv2_tls.py."""
from __future__ import annotations

from tests.integration.switch_tls import run_tls_scenario


def test_ina_switch_process_over_mutual_tls_installs_a_job_and_refuses_plaintext(tmp_path):
    run_tls_scenario("ina-switch", tmp_path)
