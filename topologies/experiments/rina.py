"""Rina as designed: the flat ring, Rina on chains across the racks' switches, and single-switch INA.

For each layout (racks x workers per rack) a leaf-spine (every host link ``bw_mbps``, uplinks ``bw_mbps *
uplink_ratio``; the spine runs the program and routes the chains' packets, ``ina_transit``) runs a ring job
and a Rina job for each fraction of INA-capable racks; a star of all workers runs single-switch INA as the
reference. The controller lays Rina jobs out on chains (its default; the grant says so and the agents follow
it) and sizes each rack's grant to the chains' round trip: where every ring member is an INA
rack the racks' switches carry the ring (docs/switch.md, "Chains"), and the workers of racks without INA
join it as host members, each keeping its copy of the chain in its agent (docs/agent.md, "Rina as
designed"); with no INA rack it is the ring. Every worker checks its result (``--check``). Each point runs
``repetitions`` times, the runs of one repetition side by side; the summary gives the median of the runs'
medians with their spread, and the framed ideal ratios (docs/experiments.md, "Rina as designed") beside.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto import wire
from inaproto.rina_partitions import continuous_shares, hop_loads, partition_sizes
from topologies.experiments import register
from topologies.experiments.aggregate import RING_WIRE_PER_SEGMENT, TCP_PAYLOAD, allreduce_row, group_by, median, spread
from topologies.experiments.base import Anchor, Comparison, Experiment, Target
from topologies.experiments.testbed import INA_UDP_BASE, AgentJob

INA_SHARE = wire.INA_DATA_LEN / wire.INA_FRAME_LEN  # 128 / 184
TCP_SHARE = TCP_PAYLOAD / RING_WIRE_PER_SEGMENT  # full segments and half an ACK each (aggregate.py)


def framed_ideal_ratio(racks: int, per_rack: int, ina_racks: int, uplink_ratio: float = 1.0,
                       slots: int | None = None) -> float:
    """Rina's ideal time over the flat ring's: each one's busiest link in framed bytes per tensor, per direction.

    Ring: 2(n-1)/n on every host link and uplink (a rack's workers are adjacent in the ring). Rina: a worker of
    an INA rack carries the tensor once (INA frames); every ring hop i -> i+1 carries 2T - s_i - s_{i+1} for the
    partition sizes the ring takes from ``slots`` per rack (``inaproto.rina_partitions``; None: continuous
    shares, the limit the controller's larger grants approach), in INA frames into or out of a switch member
    and in runs between host members; a hop between racks crosses their uplinks, ``uplink_ratio`` times the
    host links' bandwidth."""
    n = racks * per_rack
    ring = 2 * (n - 1) / n / TCP_SHARE * max(1.0, 1 / uplink_ratio)
    if ina_racks == 0:
        return 1.0
    kinds, rack_of = [], []
    for r in range(racks):  # the first racks are the INA-capable ones; ring order is rack order
        members = 1 if r < ina_racks else per_rack
        kinds += [r < ina_racks] * members
        rack_of += [r] * members
    sizes = continuous_shares(tuple(kinds)) if slots is None else partition_sizes(kinds, slots)
    if sizes is None:
        return 1.0  # too few slots for the members: the plain ring
    loads = hop_loads(kinds, sizes)
    busiest = max(load / (uplink_ratio if rack_of[i] != rack_of[(i + 1) % len(kinds)] else 1.0)
                  for i, load in enumerate(loads))
    return max(1 / INA_SHARE, busiest) / ring


def cpu_per_call(workers: list[dict], calls: int) -> dict[str, float]:
    """The agents' CPU seconds per all-reduce (every worker's process, start-up included, over the calls it
    made) and their host-member copies' part of it (Rina with racks without INA)."""
    out = {"agents_cpu_s_per_call": sum(float(w.get("cpu_seconds", 0.0)) for w in workers) / calls}
    copies = [float(w["host_copy_cpu_seconds"]) for w in workers if "host_copy_cpu_seconds" in w]
    if copies:
        out["host_copies_cpu_s_per_call"] = sum(copies) / calls
    return out


def _median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return median(values) if values else None


def framed_ideal_ina_ratio(n: int) -> float:
    """Single-switch INA over the flat ring of n workers (every link equal)."""
    return (1 / INA_SHARE) / (2 * (n - 1) / n / TCP_SHARE)


@dataclass(frozen=True)
class RinaConfig:
    """The Rina experiment's configuration.

    Args:
        layouts: (racks, workers per rack) pairs.
        ina_fractions: fractions of racks that are INA-capable (the first ones).
        elements: float32 elements per all-reduce; iterations timed calls after warmup untimed ones.
        bw_mbps: host links, Mbit/s (htb); uplink_ratio: uplinks' share of that (0.5: 2:1 oversubscribed).
        slots: slots each job asks for per rack (every member a switch: the ring uses the largest R * 2^k of
            them; with host members all of them, sized by hop costs: inaproto.rina_partitions).
        reference: also run single-switch INA on a star of all workers.
        repetitions: runs of every point (each a fresh testbed; one repetition runs every point once).
        loss: drop probabilities of extra Rina runs (every fraction with an INA rack), injected on every
            ina-switch (``Faults``); every result still checked exact, resends counted.
    """

    layouts: tuple[tuple[int, int], ...] = ((2, 4), (4, 2))
    ina_fractions: tuple[float, ...] = (1.0, 0.5, 0.0)
    elements: int = 16384
    iterations: int = 3
    warmup: int = 1
    bw_mbps: float = 2.0
    uplink_ratio: float = 1.0
    slots: int = 8
    reference: bool = True
    repetitions: int = 3
    loss: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layouts", checked_layouts(self.layouts))
        object.__setattr__(self, "ina_fractions", tuple(float(f) for f in self.ina_fractions))
        object.__setattr__(self, "loss", tuple(float(p) for p in self.loss))
        if any(not 0 < p < 1 for p in self.loss):
            raise ValueError("loss probabilities must be in (0, 1)")
        if any(not 0 <= f <= 1 for f in self.ina_fractions):
            raise ValueError("ina_fractions must be between 0 and 1")
        if self.elements < 1 or self.iterations < 1 or self.warmup < 0 or self.slots < 1 or self.repetitions < 1:
            raise ValueError("elements, iterations, slots and repetitions must be positive, warmup >= 0")
        if not self.bw_mbps > 0 or not 0 < self.uplink_ratio <= 1:
            raise ValueError("bw_mbps must be positive and uplink_ratio in (0, 1]")


def checked_layouts(layouts) -> tuple[tuple[int, int], ...]:
    """(racks, workers per rack) pairs of a leaf-spine as ints: at least 2 racks, at most 16 workers each."""
    out = tuple((int(a), int(b)) for a, b in layouts)
    if not out or any(r < 2 or w < 1 or r * w > 16 for r, w in out):
        raise ValueError(f"layouts need at least 2 racks and at most 16 workers, got {list(out)}")
    return out


def parse_layouts(text: str) -> tuple[tuple[int, int], ...]:
    """``--layouts 2x4,4x2``: (racks, workers per rack) pairs of a leaf-spine (also the tree experiment's)."""
    return tuple(tuple(int(x) for x in part.split("x")) for part in text.split(","))  # type: ignore[misc]


@register
class RinaExperiment(Experiment):
    name = "rina"
    aliases = ("exp-rina",)
    title = "Rina as designed: ring vs Rina on chains vs single-switch INA"
    Config = RinaConfig
    anchors = (
        Anchor("Rina", '"Rina: Enhancing Ring-AllReduce with In-network Aggregation in Distributed Model Training", '
               "ICNP 2024 (arXiv 2407.19721)",
               "a rack behind an INA switch acts as one ring member; up to ~50 % more throughput than the compared INA "
               "system under partial deployment; never worse than the ring",
               "Rina/ring against its framed ideal with every rack INA-capable (at 2 x 4 the ideal equals single-switch "
               "INA's), about 1 with half of the racks, the ring itself with none"),
    )
    targets = (
        Target("every rack INA-capable: Rina/ring within 10 % of its framed ideal (every layout)",
               "points.*.rina[ina_fraction=1,loss=0].ratio_to_ring", Comparison.WITHIN, 0.10,
               reference="points.*.rina[ina_fraction=1,loss=0].framed_ideal_ratio"),
        Target("2 x 4, every rack INA-capable: Rina within 10 % of single-switch INA",
               "points[layout=2x4].rina[ina_fraction=1,loss=0].ratio_to_ina", Comparison.AT_MOST, 1.10),
        Target("2 x 4, half of the racks INA-capable: Rina at most 5 % slower than the ring",
               "points[layout=2x4].rina[ina_fraction=0.5,loss=0].ratio_to_ring", Comparison.AT_MOST, 1.05),
        Target("no more than 0.05 retransmissions per chunk without injected loss",
               "points.*.rina[loss=0].retransmits_per_chunk", Comparison.AT_MOST, 0.05, fmt=".3f"),
        Target("every result exact, also under injected loss", "points.*.rina.*.exact", Comparison.HOLDS),
    )
    repetition_key = "repetition"
    options = (
        ("--layouts", "layouts", parse_layouts, "leaf-spines, racks x workers per rack"),
        ("--fractions", "ina_fractions", "floats", "fractions of the racks that run INA"),
        ("--elements", "elements", int, "float32 elements per all-reduce"),
        ("--iterations", "iterations", int, "timed all-reduces per point"),
        ("--bw", "bw_mbps", float, "host link bandwidth, Mbit/s"),
        ("--uplink-ratio", "uplink_ratio", float, "uplink bandwidth over host link bandwidth (0.5: 2:1)"),
        ("--slots", "slots", int, "slots per rack each job asks for"),
        ("--no-reference", "reference", "false", "skip single-switch INA"),
        ("--repetitions", "repetitions", int, "runs of every point (medians with spread)"),
        ("--loss", "loss", "floats", "drop probabilities of extra Rina runs (ina-switch)"),
    )

    @classmethod
    def presets(cls) -> dict[str, RinaConfig]:
        return {
            "tiny": RinaConfig(layouts=((2, 2),), ina_fractions=(1.0,), elements=4096, iterations=2, repetitions=1),
            "small": RinaConfig(layouts=((2, 4),), ina_fractions=(1.0, 0.5), elements=8192, iterations=3),
            "full": RinaConfig(),
        }

    def run(self) -> None:
        from topologies.topos import LeafSpineTopo, StarTopo

        cfg, ctx = self.config, self.ctx
        port = INA_UDP_BASE + 200
        common = ("--elements", str(cfg.elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup),
                  "--check")
        for racks, per in cfg.layouts:
            n = racks * per
            layout = f"{racks}x{per}"
            hosts = tuple(f"h{i}" for i in range(1, n + 1))
            # (label, topology, backend, INA fraction, injected loss)
            runs: list[tuple[str, Any, str, float | None, float]] = []

            def leaf_spine(k: int, racks: int = racks, per: int = per) -> LeafSpineTopo:
                return LeafSpineTopo(racks, per, ina_racks=list(range(1, k + 1)), bw=cfg.bw_mbps,
                                     uplink_bw=cfg.bw_mbps * cfg.uplink_ratio, spine_ina=True)

            for frac in cfg.ina_fractions:
                k = round(frac * racks)
                runs.append((f"leafspine-{k}ina", leaf_spine(k), "rina", k / racks, 0.0))
            runs.append(("leafspine-ring", LeafSpineTopo(racks, per, bw=cfg.bw_mbps,
                                                         uplink_bw=cfg.bw_mbps * cfg.uplink_ratio), "ring", None, 0.0))
            if cfg.reference:
                runs.append(("star", StarTopo(n, bw=cfg.bw_mbps), "ina", None, 0.0))
            if ctx.options.switch == "ina-switch":  # BMv2 cannot drop on purpose
                runs += [(f"leafspine-{round(f * racks)}ina-loss{p:g}", leaf_spine(round(f * racks)), "rina",
                          round(f * racks) / racks, p) for p in cfg.loss for f in cfg.ina_fractions
                         if round(f * racks) > 0]
            for rep in range(cfg.repetitions):
                for label, topo, backend, frac, loss in runs:
                    port += 1
                    ctx.progress(f"{layout} {label} (repetition {rep + 1}/{cfg.repetitions}): {backend}, "
                                 f"{cfg.warmup}+{cfg.iterations} all-reduces")
                    name = f"{layout}-{label}" + (f"-rep{rep + 1}" if cfg.repetitions > 1 else "")
                    opts: dict[str, Any] = {"faults": {"drop": loss, "seed": 23 + rep}} if loss else {}
                    with ctx.testbed(topo, name, switch_opts=opts) as bed:
                        job = AgentJob(f"rina-{layout}-{label}", hosts, "allreduce", backend=backend, args=common,
                                       requested_slots=cfg.slots if backend != "ring" else None, udp_port=port)
                        workers = ctx.run_job(bed, job, {"kind": "rina", "layout": layout, "run": label,
                                                         "repetition": rep})
                        if workers is None:
                            continue
                    row = allreduce_row(workers, kind="rina", layout=layout, racks=racks, per_rack=per, run=label,
                                        repetition=rep, backend=backend, ina_fraction=frac, bw_mbps=cfg.bw_mbps,
                                        uplink_ratio=cfg.uplink_ratio, loss=loss, load1=os.getloadavg()[0], **cpu_per_call(workers, cfg.warmup + cfg.iterations))
                    ctx.record(row)
                    ctx.progress(f"{layout} {label}: median {row['seconds_median'] * 1e3:.0f} ms, "
                                 f"retransmits {row['retransmits']}, exact {row.get('exact')}")

    @staticmethod
    def summarize(rows: list[dict], config: RinaConfig) -> dict:
        """Per layout: the median over repetitions of each run's median call time, its spread (min, max), and
        Rina's ratios to the ring and single-switch INA from those medians (spread: each repetition's ratio
        to the ring of the same repetition)."""
        ok = [r for r in rows if r.get("kind") == "rina" and r.get("seconds_median")]
        by = group_by(ok, "layout", "run")
        points = []

        def times(layout: str, run: str) -> list[float]:
            return [r["seconds_median"] for r in by.get((layout, run), [])]

        for layout in dict.fromkeys(r["layout"] for r in ok):
            racks, per = (int(x) for x in layout.split("x"))
            ring_s, ina_s = median(times(layout, "leafspine-ring")), median(times(layout, "star"))
            ring_by_rep = {r.get("repetition", 0): r["seconds_median"] for r in by.get((layout, "leafspine-ring"), [])}
            point: dict[str, Any] = {"layout": layout, "ring_s": ring_s, "ring_spread_s": spread(times(layout, "leafspine-ring")),
                                     "ina_s": ina_s, "ina_spread_s": spread(times(layout, "star")),
                                     "framed_ideal_ina_ratio": framed_ideal_ina_ratio(racks * per), "rina": [],
                                     "ring_agents_cpu_s_per_call": _median_of(by.get((layout, "leafspine-ring"), []),
                                                                             "agents_cpu_s_per_call")}
            for run in sorted({r["run"] for r in ok if r["layout"] == layout and r["backend"] == "rina"},
                              key=lambda run: (-by[(layout, run)][0]["ina_fraction"], by[(layout, run)][0].get("loss") or 0.0)):
                reps = by[(layout, run)]
                frac = reps[0]["ina_fraction"]
                k = round(frac * racks)
                seconds = median(times(layout, run))
                chunks = max(1, reps[0]["elements"] // wire.LANES) * racks * per * (config.iterations + config.warmup)
                granted = sorted({str(g) for r in reps for g in
                                  ([r["granted_backend"]] if isinstance(r["granted_backend"], str) else r["granted_backend"])})
                ratios = [r["seconds_median"] / ring_by_rep[r.get("repetition", 0)] for r in reps
                          if ring_by_rep.get(r.get("repetition", 0))]
                point["rina"].append({
                    "run": run, "loss": reps[0].get("loss") or 0.0,
                    "ina_fraction": frac, "seconds": seconds, "spread_s": spread(times(layout, run)),
                    "repetitions": len(reps),
                    "granted_backend": granted[0] if len(granted) == 1 else granted,
                    "exact": all(r.get("exact") is True for r in reps) if reps else None,
                    "retransmits_per_chunk": sum(r["retransmits"] for r in reps) / (chunks * len(reps)),
                    "ratio_to_ring": seconds / ring_s if ring_s else None,
                    "ratio_to_ring_spread": spread(ratios),
                    "ratio_to_ina": seconds / ina_s if ina_s else None,
                    "framed_ideal_ratio": framed_ideal_ratio(racks, per, k, config.uplink_ratio),
                    "agents_cpu_s_per_call": _median_of(reps, "agents_cpu_s_per_call"),
                    "host_copies_cpu_s_per_call": _median_of(reps, "host_copies_cpu_s_per_call"),
                })
            points.append(point)
        return {"points": points, "errors": sum(1 for r in rows if r.get("error"))}

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = []
        for p in summary.get("points", []):
            head = f"{p['layout']}: ring {p['ring_s'] * 1e3:.0f} ms" if p.get("ring_s") else f"{p['layout']}:"
            if p.get("ring_agents_cpu_s_per_call"):
                head += f" (agents' CPU {p['ring_agents_cpu_s_per_call']:.1f} s/call)"
            if p.get("ina_s"):
                head += f", single-switch INA {p['ina_s'] * 1e3:.0f} ms"
            lines.append(head)
            for r in p["rina"]:
                ratio = f"{r['ratio_to_ring']:.2f}" if r.get("ratio_to_ring") else "-"
                granted = r["granted_backend"]
                granted = granted if isinstance(granted, str) else "/".join(granted)
                lo, hi = r.get("ratio_to_ring_spread") or (None, None)
                if lo is not None and r.get("repetitions", 1) > 1:
                    ratio += f" ({lo:.2f}-{hi:.2f})"
                what = f", {r['loss']:.0%} loss" if r.get("loss") else ""
                lines.append(f"  Rina {r['ina_fraction']:.0%} INA racks{what} ({granted}): "
                             f"{r['seconds'] * 1e3:.0f} ms, /ring {ratio} (framed ideal {r['framed_ideal_ratio']:.2f}), "
                             f"retransmits/chunk {r['retransmits_per_chunk']:.3f}, exact {r['exact']}"
                             + (f", agents' CPU {r['agents_cpu_s_per_call']:.1f} s/call" if r.get("agents_cpu_s_per_call")
                                else "")
                             + (f" (copies {r['host_copies_cpu_s_per_call']:.1f})" if r.get("host_copies_cpu_s_per_call")
                                else ""))
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: RinaConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        fig, axes = figure(1)
        ax = axes[0][0]
        x, labels = 0, []
        for p in summary.get("points", []):
            for r in p["rina"]:
                if r.get("ratio_to_ring"):
                    ax.bar(x, r["ratio_to_ring"], color=COLORS["rina"], width=0.6)
                    lo, hi = r.get("ratio_to_ring_spread") or (None, None)
                    if lo is not None:  # each repetition's ratio to its own ring run
                        ax.plot([x, x], [lo, hi], color="k", lw=1)
                ax.plot([x - 0.3, x + 0.3], [r["framed_ideal_ratio"]] * 2, "k--")
                labels.append(f"{p['layout']}\n{r['ina_fraction']:.0%} INA" + (f"\n{r['loss']:.0%} loss" if r.get("loss")
                                                                                else ""))
                x += 1
            if p.get("ina_s") and p.get("ring_s"):
                ax.bar(x, p["ina_s"] / p["ring_s"], color=COLORS["ina"], width=0.6)
                ax.plot([x - 0.3, x + 0.3], [p["framed_ideal_ina_ratio"]] * 2, "k--")
                labels.append(f"{p['layout']}\n1 switch")
                x += 1
        ax.axhline(1.0, color="#999999", lw=0.8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("time / ring (dashed: framed ideal)")
        ax.grid(alpha=0.3, axis="y")
        legend(ax, fontsize=8)
        note(fig, f"{config.elements * 4 // 1024} KiB float32, {config.bw_mbps:g} Mbit/s host links, uplinks x"
                  f"{config.uplink_ratio:g}; {config.iterations} timed calls after {config.warmup} warm-up")
        save(fig, path, RinaExperiment.title)
