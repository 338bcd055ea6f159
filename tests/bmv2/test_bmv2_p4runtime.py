"""Malformed P4Runtime requests against the real BMv2: simple_switch_grpc answers each case of
tests/p4rt_malformed.py with the status codes recorded there (which ina-switch is held to in
tests/local/test_p4runtime_server.py), and keeps serving. Runs only where BMv2 and p4c are installed,
under /tmp/ina-integration.lock."""
from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from p4src.p4info import load_p4info
from tests.p4rt_malformed import BMV2, CASES, answer, check_unharmed
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bmv2(tmp_path_factory, p4c_build):
    out = tmp_path_factory.mktemp("bmv2-p4rt")
    address = f"127.0.0.1:{free_port()}"
    log = (out / "bmv2.log").open("w")
    proc = subprocess.Popen(["simple_switch_grpc", "--device-id", "1", "--no-p4", "--", "--grpc-server-addr", address],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(channel).result(timeout=30)
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=1, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        req.config.p4info.CopyFrom(load_p4info())
        req.config.p4_device_config = (p4c_build / "ina.json").read_bytes()
        p4runtime_pb2_grpc.P4RuntimeStub(channel).SetForwardingPipelineConfig(req, timeout=30)
        channel.close()
        yield address, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.parametrize("name", list(CASES))
def test_bmv2_answers_as_recorded(bmv2, name):
    address, proc = bmv2
    assert answer(address, name) == BMV2[name]
    assert proc.poll() is None, "simple_switch_grpc died"


def test_bmv2_serves_after_every_case(bmv2):
    address, proc = bmv2
    for name in CASES:
        answer(address, name)
    check_unharmed(address)
    assert proc.poll() is None
