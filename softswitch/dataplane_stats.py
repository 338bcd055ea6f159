"""What ``ina-switch``'s data plane (softswitch/dataplane.py) moves frames with, and what it counts."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class IoMode(enum.Enum):
    """How frames move between the sockets and the pipeline."""

    RINGS = "rings"  # PACKET_MMAP rings, a batch per port per wake-up, one send() per port per wake-up
    FRAMES = "frames"  # one recv() and one send() per frame


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
    batches: int = 0  # receive batches (rings: one per port per wake-up)
