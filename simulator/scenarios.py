"""Fixed ina-sim scenarios whose summaries the docs report: two-level trees vs Rina vs ring (issue 15).

``tree_comparison`` runs one synthetic trace per seed through four fabrics on the same cluster and placement:

- ``tree``: every ToR and the spine aggregate (``spine_slots`` > 0): a job spanning racks runs as a two-level
  tree where every switch of it grants slots, else Rina, else ring;
- ``rina``: ToRs aggregate, the spine does not (``spine_slots`` = 0);
- ``ring``: no switch aggregates (``ina_fraction`` = 0);

each under two placements: ``ina-aware`` (packs a job under one ToR whenever one rack has room: such a job
needs no spine memory and no uplink) and ``spread`` (one worker per rack: every job of >= 2 workers spans
racks, the most spine memory). Per (fabric, placement): mean and p99 JCT, the time share of each backend,
the spine's slot utilisation and the uplink bytes, as medians over the seeds with min-max.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.policies import make_policy
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.engine import Simulation
from simulator.placement import make_placement
from simulator.report import summarize
from simulator.trace import SyntheticConfig, generate_trace, interarrival_for_load

__all__ = ["FABRICS", "TREE_PLACEMENTS", "TreeScenario", "tree_comparison"]

FABRICS = ("tree", "rina", "ring")
TREE_PLACEMENTS = ("ina-aware", "spread")
METRICS = ("mean_jct_s", "p99_jct_s", "spine_slot_utilisation", "slot_utilisation", "uplink_bytes_total")


@dataclass(frozen=True)
class TreeScenario:
    """The scenario's fixed configuration (docs/simulation.md states it; change it there too)."""

    racks: int = 16
    workers_per_rack: int = 8
    slots: int = 1024  # per ToR
    spine_slots: int = 1024  # the spine is one switch like a ToR
    host_gbps: float = 100.0
    uplink_gbps: float = 400.0
    jobs: int = 300
    load: float = 0.8
    policy: str = "first-fit"
    seeds: tuple[int, ...] = (1, 2, 3)

    def cluster(self, fabric: str) -> ClusterSpec:
        return ClusterSpec(racks=self.racks, workers_per_rack=self.workers_per_rack, slots_per_switch=self.slots,
                           host_gbps=self.host_gbps, uplink_gbps=self.uplink_gbps,
                           spine_slots=self.spine_slots if fabric == "tree" else 0,
                           ina_fraction=0.0 if fabric == "ring" else 1.0)


def tree_comparison(scenario: TreeScenario = TreeScenario(), calibration: Calibration = Calibration(),  # noqa: B008 (frozen)
                    *, fabrics: Sequence[str] = FABRICS, placements: Sequence[str] = TREE_PLACEMENTS) -> dict[str, Any]:
    """Summaries per (fabric, placement): medians over the seeds with min-max, and the per-seed values."""
    base = SyntheticConfig(num_jobs=scenario.jobs)
    cfg = dataclasses.replace(base, mean_interarrival_s=interarrival_for_load(
        base, scenario.racks * scenario.workers_per_rack, scenario.load))
    traces = {seed: generate_trace(cfg, seed) for seed in scenario.seeds}
    out: list[dict[str, Any]] = []
    for fabric in fabrics:
        for placement in placements:
            per_seed = []
            for seed, jobs in traces.items():
                sim = Simulation(scenario.cluster(fabric), calibration, make_policy(scenario.policy),
                                 make_placement(placement))
                s = summarize(sim.run(jobs))
                per_seed.append({"seed": seed, **{k: s[k] for k in METRICS},
                                 "backend_time_share": s["backend_time_share"]})
            entry: dict[str, Any] = {"fabric": fabric, "placement": placement, "seeds": len(per_seed)}
            for key in METRICS:
                values = [p[key] for p in per_seed]
                entry[key] = statistics.median(values)
                entry[f"{key}_min"], entry[f"{key}_max"] = min(values), max(values)
            backends = sorted({b for p in per_seed for b in p["backend_time_share"]})
            entry["backend_time_share"] = {b: statistics.median(p["backend_time_share"].get(b, 0.0) for p in per_seed)
                                           for b in backends}
            entry["per_seed"] = per_seed
            out.append(entry)
    return {"scenario": dataclasses.asdict(scenario), "calibration": dataclasses.asdict(calibration), "runs": out}
