"""Experiment 4: exactness and goodput of INA all-reduce under injected packet loss (0-5 %).

The kernel here has no netem, so loss comes from ina-switch's fault injection: for each rate P the switch
is started with ``--fault-drop P`` (every port, both directions, INA packets only; seeded, so a run is
repeatable). A star of ``workers`` hosts on ``bw_mbps`` links runs an INA job (``--check``: every worker
verifies its result) at each rate; the ring, which the switch's faults do not touch (TCP), is measured
once as a reference. Per rate: goodput (tensor bytes per second of the median call), retransmissions per
chunk sent, and whether every result was exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from topologies.experiments import register
from topologies.experiments.aggregate import allreduce_row, bdp_slots, ina_wire_seconds
from topologies.experiments.base import Anchor, Comparison, Experiment, Target
from topologies.experiments.testbed import INA_UDP_BASE, AgentJob

GOODPUT_TARGETS = ((0.01, 0.90), (0.05, 0.70))  # (loss, share of lossless goodput), every result exact
WAIT_KEYS = ("slot_wait_s", "cwnd_wait_s", "tail_wait_s")  # host_agent.stream.StreamStats
SUMMED_KEYS = ("window_cuts", "loss_cuts", "gap_reports", "signal_resends")  # StreamStats counts summed over workers


@dataclass(frozen=True)
class LossConfig:
    """Experiment 4's configuration.

    Args:
        loss: drop probabilities injected by the switch (0..0.05 is the range of interest).
        workers: workers of the job.
        elements, iterations, warmup: the all-reduces at each rate.
        bw_mbps: host links (Mbit/s).
        slots: INA slots of the job: twice the bandwidth-delay product (2 x 16 at 2 Mbit/s and 10 ms), the
            sender's congestion window uses what it needs.
        rtt_ms: round trip added between each worker and the switch (``ina-exp --rtt-ms``).
        seed: the switch's fault seed.
        ring_reference: also measure the ring once (unaffected by the switch's faults).
    """

    loss: tuple[float, ...] = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05)
    workers: int = 4
    elements: int = 16384
    iterations: int = 5
    warmup: int = 1
    bw_mbps: float = 2.0
    slots: int = 32
    rtt_ms: float = 10.0
    seed: int = 1
    ring_reference: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss", tuple(float(p) for p in self.loss))
        if not self.loss or any(not 0 <= p < 1 for p in self.loss):
            raise ValueError(f"loss rates must be in [0, 1), got {list(self.loss)}")
        if self.workers < 2 or self.elements < 1 or self.iterations < 1 or self.slots < 1 or not self.bw_mbps > 0:
            raise ValueError("workers >= 2; elements, iterations, slots, bw_mbps > 0")
        if not self.rtt_ms >= 0:
            raise ValueError("rtt_ms must be >= 0")


@register
class LossExperiment(Experiment):
    name = "loss"
    aliases = ("exp4",)
    title = "Exactness and goodput of INA all-reduce vs injected loss rate"
    Config = LossConfig
    anchors = (
        Anchor("SwitchML", 'Sapio et al., "Scaling Distributed Machine Learning with In-Network Aggregation", NSDI 2021 '
               "(arXiv 1903.06701)",
               "loss recovery by the workers' retransmission, with two shadow copies of each aggregator slot in the "
               "switch so that no update is counted twice (no published loss figure is set beside this experiment: "
               "its targets are this project's own)",
               "goodput and retransmissions against injected loss 0-5 %, every result checked against the exact sum"),
    )
    targets = (
        *(Target(f"goodput at {loss * 100:g} % loss at least {share * 100:g} % of lossless", f"goodput_targets[loss={loss}]"
                 ".relative_goodput", Comparison.AT_LEAST, share, fmt=".0%") for loss, share in GOODPUT_TARGETS),
        Target("every result exact, at every loss rate", "all_exact", Comparison.HOLDS),
    )
    needs_faults = True
    options = (
        ("--loss", "loss", "floats", "drop probabilities injected by the switch"),
        ("--workers", "workers", int, "workers"),
        ("--elements", "elements", int, "float32 elements per all-reduce"),
        ("--iterations", "iterations", int, "timed all-reduces per rate"),
        ("--bw", "bw_mbps", float, "link bandwidth, Mbit/s"),
        ("--slots", "slots", int, "INA slots of the job"),
        ("--seed", "seed", int, "fault seed"),
    )

    @classmethod
    def presets(cls) -> dict[str, LossConfig]:
        return {
            "tiny": LossConfig(loss=(0.0, 0.05), workers=2, elements=4096, iterations=2, ring_reference=False, rtt_ms=4.0,
                               slots=16),
            "small": LossConfig(loss=(0.0, 0.01, 0.02, 0.05), elements=8192, iterations=3),
            "full": LossConfig(),
        }

    def run(self) -> None:
        from topologies.topos import StarTopo

        cfg, ctx = self.config, self.ctx
        hosts = tuple(f"h{i}" for i in range(1, cfg.workers + 1))
        args = ("--elements", str(cfg.elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup), "--check")
        plans = [("ina", p) for p in cfg.loss]
        if cfg.ring_reference:
            plans.append(("ring", 0.0))
        for k, (backend, p) in enumerate(plans, start=1):
            faults = {"drop": p, "seed": cfg.seed} if p > 0 else None
            ctx.progress(f"loss {p:.1%} backend={backend} ({k}/{len(plans)}): {cfg.workers} workers, {cfg.bw_mbps:g} Mbit/s, "
                         f"{cfg.rtt_ms:g} ms round trip, {cfg.slots} slots, "
                         f"{cfg.warmup}+{cfg.iterations} all-reduces of {cfg.elements} float32")
            opts = {"faults": faults} if faults else {}
            with ctx.testbed(StarTopo(cfg.workers, bw=cfg.bw_mbps, rtt_ms=cfg.rtt_ms), f"loss{p * 100:g}-{backend}", switch_opts=opts) as bed:
                job = AgentJob(f"loss-{k}", hosts, "allreduce", backend=backend, args=args,
                               requested_slots=cfg.slots if backend == "ina" else None, udp_port=INA_UDP_BASE + k)
                workers = ctx.run_job(bed, job, {"kind": "loss", "loss": p, "backend": backend},
                                      label=f"loss {p:.1%} {backend}")
                if workers is None:
                    continue
            row = allreduce_row(workers, kind="loss", loss=p, backend=backend, workers=cfg.workers, bw_mbps=cfg.bw_mbps,
                                slots=cfg.slots if backend == "ina" else None)
            chunks = sum(int((w.get("stats") or {}).get("chunks", 0)) for w in workers)
            row["retransmits_per_chunk"] = row["retransmits"] / chunks if chunks else None
            row["checks"] = [w.get("check") for w in workers]
            stats = [w.get("stats") or {} for w in workers]
            for key in WAIT_KEYS:  # where the time went, per worker, warm-up included (docs/agent.md)
                row[key] = [round(float(s.get(key, 0.0)), 4) for s in stats]
            for key in SUMMED_KEYS:
                row[key] = sum(int(s.get(key, 0)) for s in stats)
            row["lane_lag_max"] = max((int(s.get("lane_lag_max", 0)) for s in stats), default=0)
            ctx.record(row)
            exact = {True: "exact", False: "NOT EXACT", None: "unchecked"}[row["exact"]]
            ctx.progress(f"  median {row['seconds_median'] * 1e3:.0f} ms, goodput {row['goodput_mbps']:.2f} Mbit/s, "
                         f"{row['retransmits']} retransmits ({row['early_resends']} early, {row['timeouts']} timeouts, "
                         f"{row['spurious_resends']} spurious), waits slot/window/tail "
                         f"{'/'.join(f'{max(row[k]) * 1e3:.0f}' for k in WAIT_KEYS)} ms, "
                         f"{row['window_cuts']} cuts ({row['loss_cuts']} on loss), {row['gap_reports']} gap reports, "
                         f"{row['signal_resends']} resends on a signal, lanes up to {row['lane_lag_max']} behind, {exact}")

    @staticmethod
    def summarize(rows: list[dict], config: LossConfig) -> dict:
        ina = sorted((r for r in rows if r.get("kind") == "loss" and r.get("backend") == "ina" and r.get("seconds_median")),
                     key=lambda r: r["loss"])
        ring = [r for r in rows if r.get("kind") == "loss" and r.get("backend") == "ring" and r.get("seconds_median")]
        points = [{"loss": r["loss"], "goodput_mbps": r["goodput_mbps"], "seconds_median": r["seconds_median"],
                   "seconds_min": r.get("seconds_min"), "seconds_max": r.get("seconds_max"),
                   "retransmits_per_chunk": r.get("retransmits_per_chunk"), "exact": r["exact"],
                   **{k: r.get(k) for k in ("early_resends", "timeouts", "spurious_resends", *SUMMED_KEYS, "lane_lag_max")},
                   **{k: max(r[k]) if r.get(k) else None for k in WAIT_KEYS}} for r in ina]
        for p, r in zip(points, ina):
            # the uplink model (docs/experiments.md, experiment 4): a call takes at least the framed wire time of its
            # chunks and their resends; the rest of the median call the uplink idled
            rpc = r.get("retransmits_per_chunk") or 0.0
            p["wire_with_resends_s"] = ina_wire_seconds(int(r.get("bytes") or 0), config.bw_mbps) * (1 + rpc)
            p["uplink_idle_share"] = max(0.0, 1 - p["wire_with_resends_s"] / r["seconds_median"])
        base = points[0]["goodput_mbps"] if points and points[0]["loss"] == 0 else None
        for p in points:
            p["relative_goodput"] = p["goodput_mbps"] / base if base else None
        targets = []
        for loss, share in GOODPUT_TARGETS:
            p = next((p for p in points if abs(p["loss"] - loss) < 1e-9), None)
            if p is not None and p["relative_goodput"] is not None:
                targets.append({"loss": loss, "target": share, "relative_goodput": p["relative_goodput"],
                                "met": p["relative_goodput"] >= share and p["exact"] is True})
        return {
            "points": points,
            "rtt_ms": config.rtt_ms, "slots": config.slots, "bdp_slots": bdp_slots(config.rtt_ms, config.bw_mbps),
            "goodput_targets": targets,
            "ring_goodput_mbps": ring[0]["goodput_mbps"] if ring else None,
            "all_exact": all(p["exact"] is True for p in points) if points else None,
            "unchecked": sum(1 for p in points if p["exact"] is None),
            "errors": sum(1 for r in rows if r.get("error")),
        }

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = []
        for p in summary.get("points", []):
            rel = f" ({p['relative_goodput']:.0%} of lossless)" if p.get("relative_goodput") else ""
            exact = {True: "exact", False: "NOT EXACT", None: "unchecked"}[p["exact"]]
            lines.append(f"loss {p['loss']:.1%}: INA goodput {p['goodput_mbps']:.2f} Mbit/s{rel}, "
                         f"{p['retransmits_per_chunk'] or 0:.3f} retransmits per chunk, {exact}")
        if summary.get("ring_goodput_mbps"):
            lines.append(f"ring (TCP, no injected loss): {summary['ring_goodput_mbps']:.2f} Mbit/s")
        for t in summary.get("goodput_targets", []):
            lines.append(f"target at {t['loss']:.0%} loss: >= {t['target']:.0%} of lossless, exact: "
                         f"{t['relative_goodput']:.0%} ({'met' if t['met'] else 'MISSED'})")
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: LossConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        fig, axes = figure(2)
        ax, ax2 = axes[0]
        pts = summary.get("points", [])
        xs = [p["loss"] * 100 for p in pts]
        ax.plot(xs, [p["goodput_mbps"] for p in pts], "o-", color=COLORS["ina"], label="INA")
        for p in pts:
            if p["exact"] is False:
                ax.plot(p["loss"] * 100, p["goodput_mbps"], "x", color="red", ms=12, mew=2)
        if summary.get("ring_goodput_mbps"):
            ax.axhline(summary["ring_goodput_mbps"], ls="--", color=COLORS["ring"], label="ring (TCP; faults hit INA only)")
        ax.set_xlabel("injected loss rate (%)")
        ax.set_ylabel("goodput (Mbit/s of tensor per worker)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        legend(ax, fontsize=8)
        ax.set_title(f"{config.workers} workers, {config.bw_mbps:g} Mbit/s links, {config.rtt_ms:g} ms RTT, {config.slots} slots",
                     fontsize=9)
        ax2.bar(xs, [p.get("retransmits_per_chunk") or 0 for p in pts], width=0.3 if len(xs) > 1 else 0.5, color=COLORS["ina"])
        for x, p in zip(xs, pts):
            label = {True: "exact", False: "WRONG", None: "unchecked"}[p["exact"]]
            ax2.annotate(label, (x, p.get("retransmits_per_chunk") or 0), ha="center", va="bottom", fontsize=8,
                         color="green" if p["exact"] else "red")
        ax2.set_xlabel("injected loss rate (%)")
        ax2.set_ylabel("retransmissions per chunk sent")
        ax2.grid(alpha=0.3, axis="y")
        ax2.set_title("loss recovery and exactness of every result", fontsize=9)
        note(fig, f"ina-switch --fault-drop P (every port, both directions, seed {config.seed}); {config.iterations} timed "
                  f"all-reduces of {config.elements} float32 per rate; exact = every worker's result equals the exact sum")
        save(fig, path, LossExperiment.title)
