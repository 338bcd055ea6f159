"""The real thing: p4c compiles p4src/ina.p4 to what the committed P4Info says, and the packet-level suite
passes on BMv2 simple_switch_grpc exactly as on the embedded switch. Runs only where they are installed."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from p4src.p4info import load_p4info

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    if shutil.which("p4c-bm2-ss") is None:
        pytest.skip("p4c-bm2-ss is not on PATH")
    out = tmp_path_factory.mktemp("p4c")
    subprocess.run(
        ["p4c-bm2-ss", "--p4v", "16", "--p4runtime-files", str(out / "ina.p4info.txt"), "-o", str(out / "ina.json"),
         str(ROOT / "p4src" / "ina.p4")],
        check=True,
    )
    return out


def test_p4c_p4info_has_the_committed_names_ids_and_widths(compiled):
    ours, theirs = load_p4info(), load_p4info(compiled / "ina.p4info.txt")
    for kind in ("tables", "actions", "counters", "registers", "controller_packet_metadata"):
        a = {x.preamble.name: x for x in getattr(ours, kind)}
        b = {x.preamble.name: x for x in getattr(theirs, kind)}
        assert set(a) == set(b), kind
        for name, entity in a.items():
            assert entity == b[name], f"{kind} {name} differs from p4c's"


def test_packet_suite_passes_on_bmv2(compiled):
    build = ROOT / "build"
    build.mkdir(exist_ok=True)
    shutil.copy(compiled / "ina.json", build / "ina.json")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", str(ROOT / "tests" / "packet"), "--target", "bmv2"], cwd=ROOT, check=False)
    assert result.returncode == 0
