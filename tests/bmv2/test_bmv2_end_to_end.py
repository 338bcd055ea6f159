"""BMv2 end to end, as a user runs it: ``make p4``, then experiment 1's tiny run on BMv2 with exact results;
and the controller pushes exactly what ``make p4`` built. Runs where p4c and BMv2 are installed, as root."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import grpc
import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from inaproto.commands import REPO, Command, command_argv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


@pytest.fixture(scope="module")
def built() -> None:
    """``make p4``, forced to recompile: p4c writes build/ina.json and its P4Info matches the committed one."""
    if shutil.which("p4c-bm2-ss") is None:
        pytest.skip("p4c-bm2-ss is not on PATH")
    proc = subprocess.run(["make", "-C", str(REPO), "-W", "p4src/ina.p4", "p4", f"PY={sys.executable}", "STAMP="],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "note: review" not in proc.stdout, proc.stdout[-2000:]  # p4c's P4Info is the committed one
    assert (REPO / "build" / "ina.json").stat().st_size > 0


def test_experiment_1_tiny_on_bmv2_is_exact(built, tmp_path) -> None:
    proc = subprocess.run([*command_argv(Command.EXP), "run", "allreduce", "--tiny", "--switch", "bmv2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(((tmp_path / "allreduce" / "latest").resolve() / "results.json").read_text())
    assert doc["status"] == "complete" and not doc["errors"] and doc["options"]["switch"] == "bmv2"
    rows = [r for r in doc["rows"] if r["kind"] == "allreduce"]
    assert {(r["workers"], r["backend"]) for r in rows} == {(n, b) for n in (2, 4) for b in ("ina", "ring", "rina")}
    assert all(r["exact"] is True for r in rows), [(r["workers"], r["backend"], r["exact"]) for r in rows]


def test_controller_pushes_what_make_p4_built(built, tmp_path) -> None:
    from topologies.experiments.testbed import Testbed
    from topologies.topos import StarTopo

    with Testbed(StarTopo(2), run_dir=tmp_path, target="bmv2") as bed:
        switch = json.loads((bed.run_dir / "controller-topology.json").read_text())["switches"]["s1"]
        with grpc.insecure_channel(switch["grpc"]) as channel:
            stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
            resp = stub.GetForwardingPipelineConfig(p4runtime_pb2.GetForwardingPipelineConfigRequest(
                device_id=int(switch["device_id"]),
                response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.ALL), timeout=30)
    committed = text_format.Parse((REPO / "p4src" / "ina.p4info.txt").read_text(), p4info_pb2.P4Info())
    assert resp.config.p4info == committed
    assert resp.config.p4_device_config == (REPO / "build" / "ina.json").read_bytes()
