"""The committed P4Info, the P4 source and the switch model agree by name, id and width."""
from __future__ import annotations

from p4.config.v1 import p4info_pb2

from p4src import ina_model, tables
from p4src.p4info import load_p4info
from p4src.p4source import assign_ids, derive_p4info, jenkins_one_at_a_time


def _committed() -> p4info_pb2.P4Info:
    return load_p4info()


def test_id_hash_matches_p4c_on_known_tutorial_ids():
    # ids p4c gives these names in p4lang/tutorials' basic.p4info.txt
    assert assign_ids(["NoAction"], 1)["NoAction"] == 21257015
    assert assign_ids(["MyIngress.drop"], 1)["MyIngress.drop"] == 25652968
    assert assign_ids(["MyIngress.ipv4_forward"], 1)["MyIngress.ipv4_forward"] == 28792405
    assert assign_ids(["MyIngress.ipv4_lpm"], 2)["MyIngress.ipv4_lpm"] == 37375156
    assert jenkins_one_at_a_time("") == 0


def test_committed_p4info_is_what_the_source_declares():
    assert _committed() == derive_p4info()


def test_model_tables_actions_counters_registers_match_p4info():
    info = _committed()
    actions = {a.preamble.id: a for a in info.actions}
    assert {a.preamble.name for a in info.actions} == set(tables.ACTIONS)
    for a in info.actions:
        assert tuple((p.name, p.bitwidth) for p in a.params) == tables.ACTIONS[a.preamble.name].params
    assert {t.preamble.name for t in info.tables} == set(tables.TABLES)
    kinds = {p4info_pb2.MatchField.EXACT: "exact", p4info_pb2.MatchField.LPM: "lpm"}
    for t in info.tables:
        spec = tables.TABLES[t.preamble.name]
        assert tuple((m.name, m.bitwidth, kinds[m.match_type]) for m in t.match_fields) == spec.keys
        assert tuple(actions[r.id].preamble.name for r in t.action_refs) == spec.actions
        assert t.size == spec.size
    assert {c.preamble.name: c.size for c in info.counters} == tables.COUNTERS
    assert {r.preamble.name: (r.type_spec.bitstring.bit.bitwidth, r.size) for r in info.registers} == tables.REGISTERS


def test_model_default_actions_match_p4():
    import re

    from p4src.p4source import read_p4

    src = read_p4()
    for name, spec in tables.TABLES.items():
        control, table = name.split(".")
        body = re.search(rf"table\s+{table}\s*\{{(.*?)\n    \}}", src.controls[control], re.DOTALL).group(1)
        default = re.search(r"default_action\s*=\s*(\w+)\(\)", body).group(1)
        assert spec.default_action == ("NoAction" if default == "NoAction" else f"{control}.{default}")


def test_model_refuses_what_the_p4_forbids():
    import pytest

    p = ina_model.InaPipeline()
    with pytest.raises(tables.PipelineError, match="defaultonly"):
        p.insert_entry("MyEgress.ina_worker", (1, 0), "MyEgress.drop")
    with pytest.raises(tables.PipelineError, match="defaultonly"):
        p.insert_entry("MyIngress.ina_job", (1,), "NoAction")
    with pytest.raises(tables.PipelineError, match="const"):
        p.set_default_action("MyEgress.ina_worker", "MyEgress.set_worker_addr", (1, 2, 3))
    with pytest.raises(tables.PipelineError, match="drop port"):
        p.set_multicast_group(3, [(1, 0), (511, 1)])
