"""Experiment 2: heterogeneous workers, equal vs static vs adaptive data allocation (the seed paper's scenarios).

Every run trains the same model on scikit-learn's digits with the same global batch B through
``ina-agent train``; workers differ only in speed. Compute is an emulated accelerator by default (a step
takes ``batch x per_sample_ms / speed``; the agent sleeps to that deadline, so speeds are exact on a busy
machine); ``torch_ratio`` adds runs of real PyTorch compute (a CNN, one thread per worker) scaled to the
speeds. Scenarios, each with every allocation mode and seed, side by side:

- ``ratio r:1``: three workers, worker 0 r times slower (speeds 1/r, 1, 1);
- ``mixed``: four workers of speeds 1, 1, 2, 4 (relative), on every backend of ``backends`` (ring and INA
  on a star, Rina on two racks of two): the allocation is a plug-in for any all-reduce;
- ``straggler``: three equal workers; worker 0 drops to a third of its speed at a third of the run and
  recovers at two thirds (a fixed schedule, ``--speed 1,T/3:0.333,2T/3:1``);
- membership: ``2 fast`` (the fast workers alone); ``ratio r:1`` (a slow one added) and ``ratio 1:1``
  (the slow one replaced by a fast one) are the same runs as above.

Rows, summary and plot: ``hetero_summary.py`` and ``hetero_plot.py``; docs/experiments.md lists the keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.experiments import register
from topologies.experiments.base import Anchor, Comparison, Experiment, Target
from topologies.experiments.hetero_summary import MODES, report, summarize, train_row
from topologies.experiments.testbed import AgentJob

__all__ = ["HeteroConfig", "HeteroExperiment", "Scenario", "scenarios", "straggler_schedule", "train_row"]

BACKENDS = ("ina", "ring", "rina")
# Each run's workers bind UDP and TCP port PORT_BASE + k, below Linux's ephemeral range (32768-60999): inside it, an
# earlier run's ring connection in TIME_WAIT on the same port could make a later agent's bind fail.
PORT_BASE = 20000


@dataclass(frozen=True)
class HeteroConfig:
    """Experiment 2's configuration (the scenario is fixed here; options replace single fields).

    Args:
        ratios: slow : fast compute time of worker 0 in the three-worker runs.
        mixed: relative speeds of the mixed cluster (empty: no mixed run).
        straggler, membership: run those scenarios.
        modes: allocation modes.
        backends: backends of the mixed cluster (the plug-in comparison); every other scenario uses ``backend``.
        backend: backend of every other scenario.
        seeds: one run per seed (initialisation and sample order) of every scenario and mode.
        steps, global_batch, lr: training.
        per_sample_ms: emulated: ms per sample of the fastest worker (speed 1).
        jitter: emulated: relative spread of each step's compute time.
        update_every, eval_every: adaptive window; held-out evaluation period (steps).
        target_accuracy: held-out accuracy that defines time to target.
        torch_ratio: a ratio also run with real PyTorch compute (0: none), on ``torch_seeds``.
        torch_steps: steps of those runs.
        torch_device_slowdown: how many times slower than one host core a speed-1 device of those runs is
            (``ina-agent train --device-slowdown``). 10, for two reasons: the CNN's
            ~0.05 ms of CPU per sample becomes the emulated runs' 0.5 ms per sample (the same regime, compute
            several times the all-reduce, as in real training), and every device is slower than the host by
            more than 3 workers and a switch on 2 cores slow the host (1-3x), so each worker sleeps to its
            device time and the split balanced on CPU times also balances wall times.
        torch_only: only the PyTorch runs (no emulated scenario).
    """

    ratios: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
    mixed: tuple[float, ...] = (1.0, 1.0, 2.0, 4.0)
    straggler: bool = True
    membership: bool = True
    modes: tuple[str, ...] = MODES
    backends: tuple[str, ...] = BACKENDS
    backend: str = "ina"
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 30
    global_batch: int = 240
    lr: float = 0.5
    per_sample_ms: float = 0.5
    jitter: float = 0.0
    update_every: int = 2
    eval_every: int = 1
    target_accuracy: float = 0.9
    torch_ratio: float = 3.0
    torch_seeds: tuple[int, ...] = (0, 1, 2)
    torch_steps: int = 60
    torch_device_slowdown: float = 10.0
    torch_only: bool = False

    def __post_init__(self) -> None:
        for name in ("ratios", "mixed", "modes", "backends", "seeds", "torch_seeds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "ratios", tuple(float(r) for r in self.ratios))
        object.__setattr__(self, "mixed", tuple(float(v) for v in self.mixed))
        if any(r < 1 for r in self.ratios) or any(v <= 0 for v in self.mixed) or len(self.mixed) == 1:
            raise ValueError("ratios must be >= 1, mixed speeds > 0 (at least two workers)")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes must be some of {', '.join(MODES)}, got {list(self.modes)}")
        bad = [b for b in (*self.backends, self.backend) if b not in BACKENDS]
        if bad:
            raise ValueError(f"backends must be some of {', '.join(BACKENDS)}, got {bad}")
        if not self.seeds or self.steps < 3 or self.global_batch < 4 or self.global_batch > 1437:
            raise ValueError("at least one seed, steps >= 3, 4 <= global_batch <= 1437 (the digits' training set)")
        if not 0 < self.target_accuracy <= 1 or self.per_sample_ms <= 0 or self.torch_ratio < 0:
            raise ValueError("target_accuracy in (0, 1], per_sample_ms > 0, torch_ratio >= 0")
        if not self.torch_device_slowdown >= 1:
            raise ValueError("torch_device_slowdown must be >= 1")


@dataclass(frozen=True)
class Scenario:
    """One cluster: its name, kind, each worker's speed schedule (``ina-agent train --speed``), backend, compute."""

    name: str
    kind: str  # ratio | mixed | straggler | membership
    speeds: tuple[str, ...]
    backend: str
    compute: str = "emulated"
    ratio: float | None = None
    steps: int = 0
    seeds: tuple[int, ...] = ()

    @property
    def workers(self) -> int:
        return len(self.speeds)


def straggler_schedule(steps: int) -> str:
    """Worker 0 of the straggler scenario: full speed, a third from steps/3, full again from 2 steps/3."""
    return f"1,{steps // 3}:0.333333,{2 * steps // 3}:1"


def scenarios(cfg: HeteroConfig) -> list[Scenario]:
    """The runs of a configuration, in run order."""
    out = []
    for r in () if cfg.torch_only else cfg.ratios:
        out.append(Scenario(f"ratio {r:g}:1", "ratio", (f"{1 / r:.6g}", "1", "1"), cfg.backend, ratio=r,
                            steps=cfg.steps, seeds=cfg.seeds))
    if cfg.mixed and not cfg.torch_only:
        top = max(cfg.mixed)
        speeds = tuple(f"{v / top:.6g}" for v in cfg.mixed)
        label = "mixed " + ",".join(f"{v:g}" for v in cfg.mixed)
        for b in cfg.backends:
            out.append(Scenario(label, "mixed", speeds, b, steps=cfg.steps, seeds=cfg.seeds))
    if cfg.straggler and not cfg.torch_only:
        out.append(Scenario("straggler", "straggler", (straggler_schedule(cfg.steps), "1", "1"), cfg.backend,
                            steps=cfg.steps, seeds=cfg.seeds))
    if cfg.membership and not cfg.torch_only:
        out.append(Scenario("2 fast", "membership", ("1", "1"), cfg.backend, steps=cfg.steps, seeds=cfg.seeds))
    if cfg.torch_ratio:
        r = cfg.torch_ratio
        out.append(Scenario(f"ratio {r:g}:1", "ratio", (f"{1 / r:.6g}", "1", "1"), cfg.backend, compute="torch",
                            ratio=r, steps=cfg.torch_steps, seeds=cfg.torch_seeds))
    return out


@register
class HeteroExperiment(Experiment):
    name = "hetero"
    aliases = ("exp2",)
    title = "Heterogeneous workers: equal vs static vs adaptive data allocation"
    Config = HeteroConfig
    anchors = (
        Anchor("seed paper", 'Chao, Liao, Gao, "Task allocation for decentralized training in heterogeneous '
               'environment" (arXiv 2111.08272)',
               "static proportional and self-adaptive data allocation for ring all-reduce cut training time by about "
               "one third to one half compared with equal allocation, with convergence preserved",
               "time per step, equal vs static vs adaptive, against the ideal reduction 1 - n v_min / sum v; time to "
               "target accuracy under a straggler; the final accuracy of every mode"),
    )
    targets = (
        Target("static allocation reaches at least 90 % of the ideal reduction of the time per step (emulated "
               "compute, every scenario)", "ideal[compute=emulated].static_of_ideal.median", Comparison.AT_LEAST, 0.90,
               fmt=".0%"),
        Target("adaptive allocation reaches at least 90 % of the ideal reduction of the time per step (emulated "
               "compute, every scenario)", "ideal[compute=emulated].adaptive_of_ideal.median", Comparison.AT_LEAST,
               0.90, fmt=".0%"),
        Target("straggler: adaptive reaches the target accuracy at least 15 % sooner than static",
               "straggler.adaptive_vs_static.median", Comparison.AT_LEAST, 0.15, fmt=".0%"),
        Target("convergence preserved: every mode's final accuracy within 1 percentage point of equal allocation's",
               "targets.max_accuracy_diff_pp", Comparison.AT_MOST, 1.0),
    )
    repetition_key = "seed"
    options = (
        ("--ratios", "ratios", "floats", "worker 0's slowness in the three-worker runs"),
        ("--mixed", "mixed", "floats", "relative speeds of the mixed cluster"),
        ("--modes", "modes", "strs", "allocation modes: equal, static, adaptive"),
        ("--backends", "backends", "strs", "backends of the mixed cluster: ina, ring, rina"),
        ("--seeds", "seeds", "ints", "seeds (one run of each scenario and mode each)"),
        ("--steps", "steps", int, "training steps"),
        ("--global-batch", "global_batch", int, "samples per step over all workers"),
        ("--per-sample-ms", "per_sample_ms", float, "emulated compute per sample of the fastest worker (ms)"),
        ("--jitter", "jitter", float, "relative spread of emulated step times"),
        ("--target-accuracy", "target_accuracy", float, "held-out accuracy for time to target"),
        ("--torch-ratio", "torch_ratio", float, "ratio also run with real PyTorch compute (0: none)"),
        ("--torch-seeds", "torch_seeds", "ints", "seeds of the PyTorch runs"),
        ("--torch-device-slowdown", "torch_device_slowdown", float,
         "PyTorch runs: a speed-1 device is this many times slower than a host core"),
        ("--torch-only", "torch_only", "true", "only the PyTorch runs"),
        ("--no-straggler", "straggler", "false", "skip the straggler"),
        ("--no-membership", "membership", "false", "skip the 2-fast run"),
    )

    @classmethod
    def presets(cls) -> dict[str, HeteroConfig]:
        return {
            "tiny": HeteroConfig(ratios=(1.0, 3.0), mixed=(), straggler=True, membership=False, modes=("equal", "static", "adaptive"),
                                 backends=("ina",), seeds=(0,), steps=9, per_sample_ms=0.2, eval_every=3,
                                 target_accuracy=0.2, torch_ratio=0.0),
            "small": HeteroConfig(ratios=(1.0, 3.0), backends=("ina",), seeds=(0,), torch_ratio=0.0),
            "full": HeteroConfig(),
        }

    def run(self) -> None:
        from topologies.topos import LeafSpineTopo, StarTopo

        cfg, ctx = self.config, self.ctx
        plan = scenarios(cfg)
        star = [s for s in plan if s.backend != "rina"]
        racks = [s for s in plan if s.backend == "rina"]
        total = sum(len(s.seeds) for s in plan) * len(cfg.modes)
        done = 0
        for label, topo, group in (("star", lambda n: StarTopo(n), star), ("leafspine", lambda n: LeafSpineTopo(2, n // 2), racks)):
            if not group:
                continue
            n = max(s.workers for s in group)
            if label == "leafspine" and n % 2:
                ctx.progress(f"rina skipped: two racks need an even worker count, got {n}")
                continue
            with ctx.testbed(topo(n), label) as bed:
                for sc in group:
                    for seed in sc.seeds:
                        for mode in cfg.modes:  # side by side: every mode of a seed, one after the other
                            done += 1
                            self._run_one(bed, sc, seed, mode, done, total)

    def _run_one(self, bed: Any, sc: Scenario, seed: int, mode: str, k: int, total: int) -> None:
        cfg, ctx = self.config, self.ctx
        ctx.progress(f"{sc.name} [{sc.backend}, {sc.compute}] seed {seed}, {mode} ({k}/{total}): speeds {'/'.join(sc.speeds)}")
        args = ("--allocation", mode, "--compute", sc.compute, "--steps", str(sc.steps),
                "--global-batch", str(cfg.global_batch), "--lr", str(cfg.lr), "--per-sample-ms", str(cfg.per_sample_ms),
                "--jitter", str(cfg.jitter), "--update-every", str(cfg.update_every), "--eval-every", str(cfg.eval_every),
                "--target-accuracy", str(cfg.target_accuracy), "--seed", str(seed))
        if sc.compute == "torch":
            args += ("--device-slowdown", str(cfg.torch_device_slowdown))
        job = AgentJob(f"tr{k}-{mode}", tuple(f"h{i}" for i in range(1, sc.workers + 1)), "train", backend=sc.backend,
                       args=args, worker_args={w: ("--speed", s) for w, s in enumerate(sc.speeds)},
                       udp_port=PORT_BASE + k)
        ident = {"scenario": sc.name, "scenario_kind": sc.kind, "backend": sc.backend, "compute": sc.compute, "mode": mode,
                 "seed": seed, "ratio": sc.ratio, "speeds": list(sc.speeds)}
        if sc.compute == "torch":
            ident["device_slowdown"] = cfg.torch_device_slowdown
        results = ctx.run_job(bed, job, {"kind": "train", **ident}, label=f"{sc.name} {sc.backend} {mode} seed {seed}")
        if results is None:
            return
        row = train_row(results, global_batch=cfg.global_batch, per_sample_s=cfg.per_sample_ms / 1e3, **ident)
        ctx.record(row)
        ttt = f"{row['time_to_target_s']:.2f} s" if row.get("time_to_target_s") is not None else "not reached"
        ctx.progress(f"  {row['step_ms_median']:.1f} ms/step (all-reduce {row['t_comm_ms']:.1f}), to target {ttt}, "
                     f"accuracy {row['accuracy']:.3f}, final split {row['final_batch']}")

    @staticmethod
    def summarize(rows: list[dict], config: HeteroConfig) -> dict:
        return summarize(rows, config)

    @staticmethod
    def report(summary: dict) -> list[str]:
        return report(summary)

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: HeteroConfig, path: Path) -> None:
        from topologies.experiments.hetero_plot import plot

        plot(rows, summary, config, path)
