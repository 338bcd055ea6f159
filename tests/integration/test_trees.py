"""Aggregation trees end to end (root): `ina-exp run tree --tiny` builds a leaf-spine of ina-switch processes
in namespaces, `ina-controller --trees` installs a 2 x 2 job's tree on both ToRs and the spine, the agents
all-reduce through it, every result is exact, and the spine's pcaps show one framed partial sum per rack and
all-reduce going up (docs/experiments.md, "Aggregation trees")."""
from __future__ import annotations

import json
import subprocess

from inaproto.commands import Command, command_argv

INA_EXP = command_argv(Command.EXP)


def test_tiny_tree_is_exact_and_an_uplink_carries_one_partial_per_rack(tmp_path):
    proc = subprocess.run([*INA_EXP, "run", "tree", "--tiny", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(((tmp_path / "tree" / "latest").resolve() / "results.json").read_text())
    assert doc["status"] == "complete" and not doc["errors"], doc["errors"]
    (row,) = [r for r in doc["rows"] if r.get("kind") == "tree"]
    assert row["granted_backend"] == "tree" and row["exact"] is True
    calls, racks = row["calls"], row["racks"]
    if row["retransmits"] == 0:  # nothing resent: exactly one framed partial up and one final down per rack
        assert row["uplink_up_bytes"] == row["uplink_down_bytes"] == calls * racks * row["framed_partial_bytes"]
    assert row["uplink_up_bytes"] >= calls * racks * row["framed_partial_bytes"]
