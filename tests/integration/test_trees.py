"""Aggregation trees end to end (root): `ina-exp run tree --tiny` builds a leaf-spine of ina-switch processes
in namespaces, `ina-controller --trees` installs a 2 x 2 job's tree on both ToRs and the spine, the agents
all-reduce through it, every result is exact, and the spine's pcaps show one framed partial sum per rack and
all-reduce going up in the run that writes them, and the agents, started without ``--path-rtt-floor-ms``, take
the tree path's round-trip floor from the grant (docs/experiments.md, "Aggregation trees")."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from inaproto import wire
from inaproto.commands import Command, command_argv
from topologies.experiments.tree import path_floor_ms

INA_EXP = command_argv(Command.EXP)


def test_tiny_tree_is_exact_and_an_uplink_carries_one_partial_per_rack(tmp_path):
    proc = subprocess.run([*INA_EXP, "run", "tree", "--tiny", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(((tmp_path / "tree" / "latest").resolve() / "results.json").read_text())
    assert doc["status"] == "complete" and not doc["errors"], doc["errors"]
    rows = {r["run"]: r for r in doc["rows"] if r.get("kind") == "tree"}
    assert sorted(rows) == ["tree", "tree-uplink"]  # timed without pcaps; the uplink bytes from a pcap run
    for row in rows.values():
        assert row["controller_backend"] == "tree" and row["granted_backend"] == "ina" and row["exact"] is True
        # no --path-rtt-floor-ms: the agents took the tree path's floor (4 link crossings) from the grant
        assert row["path_rtt_floor_ms"] == row["expected_path_rtt_floor_ms"] == round(
            path_floor_ms(4, row["bw_mbps"]), 4) > 0
    assert not rows["tree"]["pcap"] and "uplink_up_bytes" not in rows["tree"]
    row = rows["tree-uplink"]
    calls, racks = row["calls"], row["racks"]
    expected = calls * racks * row["framed_partial_bytes"]
    if row["retransmits"] == 0:  # nothing resent: one framed partial up and one final down per rack and call
        # (plus at most one chunk per rack and run: the pcaps show one more chunk than the calls' own)
        assert row["uplink_up_bytes"] == row["uplink_down_bytes"]
        assert expected <= row["uplink_up_bytes"] <= expected + racks * wire.INA_FRAME_LEN
    assert row["uplink_up_bytes"] >= expected


def test_controller_killed_with_a_half_written_tree_repairs_it_on_restart(tmp_path):
    """A leaf-spine of ina-switch processes, `ina-controller --trees` (a process) installs a 2 x 2 job's tree;
    the controller is killed with SIGKILL and one ToR is left fenced (its ina_job at the next generation, the
    others not: what a controller dying in the middle of the install protocol leaves); on restart reconcile
    repairs it, the job gets a new generation on every switch, and its agents all-reduce through the tree
    exactly."""
    import dataclasses
    import os
    import signal

    from controller.p4entity import Schema
    from controller.switch import Switch, SwitchOptions
    from inaproto.job_entries import JobEntry
    from topologies.experiments.testbed import AgentJob, Testbed
    from topologies.topos import LeafSpineTopo

    job = AgentJob("tree-restart", ("h1", "h2", "h3", "h4"), "allreduce", backend="auto",
                   args=("--elements", "2048", "--iterations", "2", "--warmup", "0", "--check"), requested_slots=8)
    seen: dict = {}
    with Testbed(LeafSpineTopo(2, 2, spine_ina=True), run_dir=tmp_path, controller_settings={"trees": True}) as bed:

        def half_written_restart() -> None:
            (before,) = bed.controller_state()["jobs"]
            seen["before"] = before["grant"]
            os.killpg(bed.controller.pid, signal.SIGKILL)
            bed.stop_controller()
            doc = json.loads((bed.run_dir / "controller-topology.json").read_text())
            info = doc["switches"]["s1"]
            schema = Schema.from_file(Path(__file__).resolve().parents[2] / "p4src" / "ina.p4info.txt")
            sw = Switch(SwitchOptions("s1", info["grpc"], int(info.get("device_id", 1)), (0, 20), 10.0), schema)
            try:
                assert sw.connect()
                (entry,) = [e for e in sw.read_state([JobEntry.table], groups=False).entries.values()
                            if e.match[0] == int(before["job_id"])]
                params = list(entry.params)
                params[5] = (params[5] % 0xFFFF) + 1  # the next wire generation: the fence, on s1 only
                sw.modify(dataclasses.replace(entry, params=tuple(params)))
            finally:
                sw.close()
            bed.start_controller(pool=bed.pool)
            (after,) = bed.controller_state()["jobs"]
            seen["after"] = after["grant"]

        workers = bed.run_jobs([job], register_first=True, on_admitted=half_written_restart)[job.name]
    assert seen["before"]["backend"] == seen["after"]["backend"] == "tree"
    assert seen["after"]["generation"] != seen["before"]["generation"]
    assert all(w["check"] is not None for w in workers)
    from topologies.experiments.aggregate import allreduce_row

    row = allreduce_row(workers)
    assert row["exact"] is True and row["granted_backend"] == "ina"  # each agent: plain INA to its ToR
