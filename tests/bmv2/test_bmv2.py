"""The real thing: p4c compiles p4src/ina.p4 to what the committed P4Info says. (The packet-level suite runs on
BMv2 as on every other target: tests/packet/conftest.py.) Runs only where p4c is installed."""
from __future__ import annotations

from p4src.p4info import load_p4info


def test_p4c_p4info_has_the_committed_names_ids_and_widths(p4c_build):
    ours, theirs = load_p4info(), load_p4info(p4c_build / "ina.p4info.txt")
    for kind in ("tables", "actions", "counters", "registers", "controller_packet_metadata"):
        a = {x.preamble.name: x for x in getattr(ours, kind)}
        b = {x.preamble.name: x for x in getattr(theirs, kind)}
        assert set(a) == set(b), kind
        for name, entity in a.items():
            assert entity == b[name], f"{kind} {name} differs from p4c's"
