"""The simulated cluster: racks of workers under top-of-rack switches, one non-blocking spine."""
from __future__ import annotations

import math
from dataclasses import dataclass

from inaproto.config import setting

__all__ = ["ClusterSpec"]


@dataclass(frozen=True)
class ClusterSpec:
    """Shape and link speeds of the cluster; one worker = one host with one NIC (and one GPU).

    Each rack's ToR switch is either INA-capable, with its own pool of ``slots_per_switch`` aggregator
    slots, or a plain switch. Racks connect to one spine through an uplink of ``uplink_gbps`` per rack;
    the spine itself never limits (two-tier, non-blocking core). With ``spine_slots`` > 0 the spine aggregates
    too (a pool of its own): a job spanning racks can run as a two-level tree (ToRs, then the spine).
    """

    racks: int = setting(64, "racks, one ToR switch each")
    workers_per_rack: int = setting(8, "workers (hosts, one GPU each) per rack")
    slots_per_switch: int = setting(1024, "aggregator slots of each INA-capable ToR")
    ina_fraction: float = setting(1.0, "share of the ToRs that are INA-capable, spread evenly over the racks")
    host_gbps: float = setting(100.0, "worker link and ToR downlink speed (Gbit/s)")
    uplink_gbps: float = setting(400.0, "ToR-to-spine capacity per rack, each direction, shared by the jobs leaving it (Gbit/s)")
    spine_slots: int = setting(0, "aggregator slots of the spine (0: the spine does not aggregate, no trees)")

    def __post_init__(self) -> None:
        for name in ("racks", "workers_per_rack"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"cluster {name} must be an int >= 1, got {value!r}")
        for name in ("slots_per_switch", "spine_slots"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"cluster {name} must be an int >= 0, got {value!r}")
        if not 0.0 <= self.ina_fraction <= 1.0:
            raise ValueError(f"cluster ina_fraction must be in [0, 1], got {self.ina_fraction!r}")
        for name in ("host_gbps", "uplink_gbps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"cluster {name} must be a number > 0, got {value!r}")

    @property
    def total_workers(self) -> int:
        return self.racks * self.workers_per_rack

    @property
    def host_Bps(self) -> float:
        return self.host_gbps * 1e9 / 8

    @property
    def uplink_Bps(self) -> float:
        return self.uplink_gbps * 1e9 / 8

    def ina_racks(self) -> tuple[bool, ...]:
        """Which racks have an INA-capable ToR: rack i does iff floor((i+1)f) > floor(i f), an even spread."""
        f = self.ina_fraction
        return tuple(math.floor((i + 1) * f + 1e-9) > math.floor(i * f + 1e-9) for i in range(self.racks))

    @property
    def ina_switches(self) -> int:
        return sum(self.ina_racks())
