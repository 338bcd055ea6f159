"""What ``ina-switch``'s data plane (softswitch/dataplane.py) counts."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PortStats:
    rx: int = 0
    tx: int = 0
    tx_errors: int = 0


@dataclass
class DataPlaneStats:
    ports: dict[int, PortStats] = field(default_factory=dict)
    no_port: int = 0  # frames the pipeline sent to a port without an interface
    not_live: int = 0  # frames received before a pipeline was configured (--no-p4)
    packet_in: int = 0
    packet_out: int = 0
