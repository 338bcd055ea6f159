"""``ina-sim``'s configuration: one frozen dataclass, read from TOML (``--config FILE``), single settings over it
with ``--set KEY=VALUE``, the per-run flags last (inaproto/config.py). ``ina-sim run --print-config`` prints every
setting; docs/simulation.md lists them."""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from controller.policies import POLICIES
from inaproto.config import setting
from simulator.calibration import Calibration
from simulator.cluster import ClusterSpec
from simulator.placement import PLACEMENTS
from simulator.trace import SyntheticConfig, TraceFormat

__all__ = ["DataSplit", "QueueDiscipline", "SimConfig", "TraceFormat"]


class QueueDiscipline(StrEnum):
    BACKFILL = "backfill"  # start any waiting job that fits, in arrival order
    FIFO = "fifo"  # strictly in arrival order: stop at the first job that has to wait


class DataSplit(StrEnum):
    EQUAL = "equal"  # every worker 1/n of the batch: the slowest sets the pace
    PROPORTIONAL = "proportional"  # data in proportion to speed: all finish together


@dataclass(frozen=True)
class SimConfig:
    """One ina-sim run: which jobs, on which cluster, under which policies, with which time model."""

    policies: tuple[str, ...] = setting(tuple(POLICIES), "allocation policies to compare (controller/policies.py), "
                                                         "each in a process of its own")
    placement: str = setting("ina-aware", "placement policy: ina-aware, pack or spread")
    queue: QueueDiscipline = setting(QueueDiscipline.BACKFILL, "which waiting jobs may start")
    data_split: DataSplit = setting(DataSplit.EQUAL, "how a job with unequal workers splits its batch")
    follow_grant: bool = setting(False, "a job holding slots aggregates in-network even where ring would be faster "
                                        "(as ina-agent --backend auto does)")
    check: bool = setting(False, "validate every switch's allocation after every event (slower)")
    trace: Path | None = setting(None, "trace file (none: a synthetic trace of workload.num_jobs jobs)")
    trace_format: TraceFormat = setting(TraceFormat.CSV, "format of the trace file")
    max_jobs: int | None = setting(None, "use only the first N jobs of the trace")
    seed: int = setting(1, "seed of the synthetic trace and of the models drawn for a job log's jobs")
    load: float = setting(0.8, "offered load (compute only) as a share of the cluster's workers: sets the synthetic "
                               "workload's mean inter-arrival time (0: workload.mean_interarrival_s as given)")
    out: Path = setting(Path("results/sim"), "output directory")
    plot: bool = setting(True, "draw comparison.png")
    processes: int = setting(0, "policies simulated at once, one process each (0: one per core)")
    cluster: ClusterSpec = setting(factory=ClusterSpec, doc="the cluster")
    workload: SyntheticConfig = setting(factory=SyntheticConfig, doc="the synthetic workload")
    calibration: Calibration = setting(factory=Calibration, doc="the time model's constants")

    def __post_init__(self) -> None:
        if not self.policies or len(set(self.policies)) != len(self.policies):
            raise ValueError("policies: give distinct policy names")
        for name in self.policies:
            if name not in POLICIES:
                raise ValueError(f"unknown allocation policy {name!r}; valid: {', '.join(POLICIES)}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; valid: {', '.join(sorted(PLACEMENTS))}")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {self.max_jobs}")
        if not self.load >= 0:
            raise ValueError(f"load must be >= 0, got {self.load}")
        if self.processes < 0:
            raise ValueError(f"processes must be >= 0, got {self.processes}")
