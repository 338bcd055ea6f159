"""Topologies and switch classes for ``mn --custom`` (Mininet's own command line).

    mn --custom topologies/custom.py --topo star,3 --switch inaswitch --controller none
    mn --custom topologies/custom.py --topo leafspine,2,2,ina_racks=1 --switch inaswitch --controller none
    mn --custom topologies/custom.py --topo json,path/to/topology.json --switch inaswitch --controller none

Switches started this way install their topology's IPv4 routes themselves (there is no controller in a
bare ``mn`` session), so ``pingall`` works at once. Options go after the switch name:
``--switch inaswitch,log_level=debug,pcap=true``. ``--controller none`` is needed: Mininet's default
controller is an OpenFlow one. Logs: ``$INA_RUN_DIR/logs/<switch>.log`` (default
``/tmp/ina-testbed/runs/<time>-<pid>/logs``), each switch's whole configuration beside them in
``$INA_RUN_DIR/config/<switch>.toml``. After a crash: ``python -m topologies.cleanup``.
"""
from __future__ import annotations

from typing import Any

from topologies.nodes import InaLink, P4Host, P4Switch
from topologies.topos import LeafSpineTopo, StarTopo, TopologyJson


class InaSwitch(P4Switch):
    """``--switch inaswitch``: the embedded switch, routes installed at start."""

    def __init__(self, name: str, **params: Any) -> None:
        params.setdefault("target", "ina-switch")
        params.setdefault("install_routes", True)
        super().__init__(name, **params)


class Bmv2Switch(P4Switch):
    """``--switch bmv2``: BMv2 ``simple_switch_grpc`` (on PATH), routes installed at start."""

    def __init__(self, name: str, **params: Any) -> None:
        params.setdefault("target", "bmv2")
        params.setdefault("install_routes", True)
        super().__init__(name, **params)


class AutoP4Switch(P4Switch):
    """``--switch p4``: BMv2 when on PATH, else the embedded switch; routes installed at start."""

    def __init__(self, name: str, **params: Any) -> None:
        params.setdefault("target", "auto")
        params.setdefault("install_routes", True)
        super().__init__(name, **params)


topos = {"star": StarTopo, "leafspine": LeafSpineTopo, "json": TopologyJson}
switches = {"inaswitch": InaSwitch, "bmv2": Bmv2Switch, "p4": AutoP4Switch}
hosts = {"p4host": P4Host}
# Mininet 2.3's mn does not merge a custom `links` dict (a missing comma in its list of names); the
# topologies set InaLink on every link themselves. Kept for Mininet versions that do.
links = {"inalink": InaLink}
