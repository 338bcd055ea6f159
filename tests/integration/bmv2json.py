"""A BMv2 JSON of p4src/ina.p4 shaped like p4c-bm2-ss output, for tests where p4c is not installed.

Only the parts a switch reads to know the program are filled in (header types of the match fields, actions
with their parameters, both pipelines' tables including one of p4c's hidden ``tbl_*`` tables, counters,
registers, ``__meta__``); the derived names and widths come from the pipeline model, so the document is
the program ina-switch implements, and tests mutate it to get one it does not.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from p4src import tables as model

_HEADER_TYPES = {
    "ipv4_t": ("ipv4", [["version", 4, False], ["ihl", 4, False], ["diffserv", 8, False], ["totalLen", 16, False],
                        ["identification", 16, False], ["flags", 3, False], ["fragOffset", 13, False], ["ttl", 8, False],
                        ["protocol", 8, False], ["hdrChecksum", 16, False], ["srcAddr", 32, False], ["dstAddr", 32, False]]),
    "ina_t": ("ina", [["msg_type", 8, False], ["flags", 8, False], ["job_id", 16, False], ["generation", 16, False],
                      ["slot", 16, False], ["seq", 32, False], ["worker_id", 8, False], ["reserved", 7, False], ["shadow", 1, False]]),
    "standard_metadata": ("standard_metadata", [["ingress_port", 9, False], ["egress_spec", 9, False], ["egress_port", 9, False],
                                                ["instance_type", 32, False], ["packet_length", 32, False], ["egress_rid", 16, False],
                                                ["mcast_grp", 16, False], ["_padding", 3, False]]),
}


def _target(key_name: str) -> list[str]:
    parts = key_name.split(".")
    return [parts[1], parts[2]] if parts[0] == "hdr" else [parts[0], parts[1]]


def model_json() -> dict:
    """The BMv2 JSON (as a dict) of the program the model implements."""
    action_ids = {name: i for i, name in enumerate(model.ACTIONS)}
    actions = [
        {"name": name, "id": action_ids[name], "runtime_data": [{"name": p, "bitwidth": w} for p, w in spec.params], "primitives": []}
        for name, spec in model.ACTIONS.items()
    ]
    actions.append({"name": "ina302", "id": len(actions), "runtime_data": [], "primitives": []})  # p4c's hidden action
    pipelines = {"ingress": [], "egress": []}
    for i, (name, spec) in enumerate(model.TABLES.items()):
        table = {
            "name": name, "id": i, "source_info": {}, "key": [
                {"match_type": kind, "name": fname, "target": _target(fname), "mask": None} for fname, _w, kind in spec.keys
            ],
            "match_type": spec.keys[0][2], "type": "simple", "max_size": spec.size, "with_counters": False,
            "support_timeout": False, "direct_meters": None, "action_ids": [action_ids[a] for a in spec.actions],
            "actions": list(spec.actions), "base_default_next": None, "next_tables": {},
            "default_entry": {"action_id": action_ids[spec.default_action], "action_const": False, "action_data": [], "action_entry_const": False},
        }
        pipelines["egress" if name.startswith("MyEgress.") else "ingress"].append(table)
    pipelines["ingress"].append({
        "name": "tbl_ina302", "id": 99, "key": [], "match_type": "exact", "type": "simple", "max_size": 1024,
        "action_ids": [len(actions) - 1], "actions": ["ina302"], "next_tables": {},
    })
    return copy.deepcopy({
        "header_types": [
            {"name": t, "id": i, "fields": fields} for i, (t, (_inst, fields)) in enumerate(_HEADER_TYPES.items())
        ],
        "headers": [
            {"name": inst, "id": i, "header_type": t, "metadata": t == "standard_metadata", "pi_omit": True}
            for i, (t, (inst, _fields)) in enumerate(_HEADER_TYPES.items())
        ],
        "actions": actions,
        "pipelines": [
            {"name": "ingress", "id": 0, "init_table": None, "tables": pipelines["ingress"], "action_profiles": [], "conditionals": []},
            {"name": "egress", "id": 1, "init_table": None, "tables": pipelines["egress"], "action_profiles": [], "conditionals": []},
        ],
        "counter_arrays": [
            {"name": name, "id": i, "source_info": {}, "size": size, "is_direct": False}
            for i, (name, size) in enumerate(model.COUNTERS.items())
        ],
        "register_arrays": [
            {"name": name, "id": i, "source_info": {}, "size": size, "bitwidth": width}
            for i, (name, (width, size)) in enumerate(model.REGISTERS.items())
        ],
        "meter_arrays": [],
        "__meta__": {"version": [2, 23], "compiler": "tests/integration/bmv2json.py (shaped like p4c-bm2-ss)"},
    })  # a fresh document every time: callers mutate it


def with_unknown_table(doc: dict, name: str = "MyIngress.acl") -> dict:
    """A copy of ``doc`` whose ingress has one more table, which the model does not have."""
    doc = copy.deepcopy(doc)
    extra = copy.deepcopy(doc["pipelines"][0]["tables"][0])
    extra["name"], extra["id"] = name, 50
    doc["pipelines"][0]["tables"].append(extra)
    return doc


def write(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc, indent=1))
    return path
