"""Mininet topologies whose switches are P4 switches (BMv2 or ina-switch, same flags).

``StarTopo``, ``LeafSpineTopo``, ``TopologyJson`` (topos), ``P4Switch``/``P4Host``/``InaLink`` (nodes),
``InaNetwork`` (one run), ``RouteInstaller`` (routes), ``python -m topologies.cleanup`` (``make stop``).
Names are imported lazily, so ``topologies.cleanup`` and ``topologies.plan`` work without Mininet.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "StarTopo": "topologies.topos",
    "LeafSpineTopo": "topologies.topos",
    "TopologyJson": "topologies.topos",
    "InaTopo": "topologies.topos",
    "P4Switch": "topologies.nodes",
    "P4Host": "topologies.nodes",
    "InaLink": "topologies.nodes",
    "SwitchStartupError": "topologies.nodes",
    "InaNetwork": "topologies.network",
    "NetworkPlan": "topologies.plan",
    "RouteInstaller": "topologies.runtime",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (the names of _EXPORTS, listed once)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'topologies' has no attribute {name!r}")
