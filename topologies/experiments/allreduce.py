"""Experiment 1: all-reduce time vs worker count, INA vs ring vs Rina on equal shaped links.

For each worker count n, a star of n hosts (every link ``bw_mbps``) runs an INA job and a ring job, and
a leaf-spine of two racks of n/2 (host links and uplinks ``bw_mbps``) runs a Rina job (aggregation in each
rack's switch, ring between the racks). Each job all-reduces a float32 tensor ``iterations`` times after
``warmup`` untimed calls. A call's time is the slowest worker's. The plot shows the times and the ratio
INA/ring against its ideal n/(2(n-1)) (payload only) and against the same with each protocol's framing
(INA: 128 B of payload in a 184 B frame; TCP: 1448 in 1514). With ``calibrate`` it also runs the
calibration probes and writes ``calibration.toml`` for ``ina-sim`` (its [calibration] table).

The links carry ``rtt_ms`` of propagation round trip between each worker and its switch (ina-switch
``--link-delay``), so a job's bandwidth-delay product is ``bdp_slots`` (16 slots at 2 Mbit/s and 10 ms)
and switch memory matters. ``slot_sweep`` adds SwitchML's pool-size curve: one INA job of
``sweep_workers`` at a fixed RTT, time vs granted slots, against ``max(framed wire time, chunks x RTT /
slots)`` (RTT: the added round trip plus one frame's serialization each way).

**Grant sizing** (``slots`` 0, the default): the jobs' grants follow the round trip the path really has,
not the nominal one. The agents and the software switch add milliseconds to ``rtt_ms`` (14-16 ms where
10 ms is nominal at 2 Mbit/s), so a grant of the nominal BDP leaves the window short of the link, and by
how much swings from run to run. Before the timed jobs of each worker count, a probe INA job (one call of
the same tensor, granted twice the nominal BDP) runs on the same star; every agent reports its path round
trip (``StreamStats.path_rtt_s``: the shortest round trip it saw), and every backend's job of that count
asks for ``SLOT_HEADROOM`` times the bandwidth-delay product of the longest of them (``measured_slots``),
as the controller sizes Rina's chains. ``--slots N`` grants N instead (no probe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto import wire
from inaproto.backends import Backend
from topologies.experiments import register
from topologies.experiments.aggregate import (
    allreduce_row,
    bdp_slots,
    framed_ina_ring_ratio,
    group_by,
    ideal_ina_ring_ratio,
    ina_wire_seconds,
    median,
    ring_wire_seconds,
    slot_model_seconds,
    window_rtt_seconds,
)
from topologies.experiments.base import Anchor, Comparison, Experiment, Target
from topologies.experiments.testbed import INA_UDP_BASE, AgentFailure, AgentJob

BACKENDS = (Backend.INA.value, Backend.RING.value, Backend.RINA.value)  # on a star, and Rina on two racks (trees: tree.py)
SLOT_HEADROOM = 2.0  # grants: twice the measured bandwidth-delay product (as controller/chains.py sizes Rina's chains)


def measured_slots(path_rtt_s: float, bw_mbps: float, headroom: float = SLOT_HEADROOM) -> int:
    """Slots for a job on ``bw_mbps`` links whose measured path round trip is ``path_rtt_s``: ``headroom`` times the
    chunks that round trip holds at line rate (one INA frame per chunk), within 1..wire.NUM_SLOTS."""
    if not (path_rtt_s > 0 and bw_mbps > 0):
        raise ValueError(f"need a positive round trip and rate, got {path_rtt_s!r} s, {bw_mbps!r} Mbit/s")
    frames_per_s = bw_mbps * 1e6 / (wire.INA_FRAME_LEN * 8)
    return max(1, min(wire.NUM_SLOTS, math.ceil(headroom * path_rtt_s * frames_per_s)))


@dataclass(frozen=True)
class AllreduceConfig:
    """Experiment 1's configuration.

    Args:
        workers: worker counts (2..8; Rina needs an even count: two racks of n/2).
        backends: any of ina, ring, rina.
        elements: float32 elements per all-reduce.
        iterations: timed all-reduces per (n, backend); warmup: untimed ones before.
        bw_mbps: every host link and uplink, Mbit/s (htb).
        slots: INA slots each job asks for (its window); 0 (the default): ``SLOT_HEADROOM`` x the bandwidth-delay
            product of the round trip a probe job measures on the same star first (module docstring, "Grant sizing").
        rtt_ms: round trip added between each worker and its switch (``ina-exp --rtt-ms``; 0 on bmv2).
        slot_sweep: granted slot counts of the pool-size curve (empty: no curve).
        sweep_workers, sweep_elements: the curve's job (workers, float32 elements per all-reduce).
        calibrate: also run the calibration probes and write calibration.toml.
    """

    workers: tuple[int, ...] = (2, 4, 6, 8)
    backends: tuple[str, ...] = BACKENDS
    elements: int = 65536
    iterations: int = 5
    warmup: int = 1
    bw_mbps: float = 2.0
    slots: int = 0
    rtt_ms: float = 10.0
    slot_sweep: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 64, 128)
    sweep_workers: int = 4
    sweep_elements: int = 16384
    calibrate: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(int(n) for n in self.workers))
        object.__setattr__(self, "backends", tuple(self.backends))
        object.__setattr__(self, "slot_sweep", tuple(int(s) for s in self.slot_sweep or ()))
        if any(not 1 <= s <= 1024 for s in self.slot_sweep) or not 2 <= self.sweep_workers <= 16 or self.sweep_elements < 1:
            raise ValueError("slot_sweep values must be 1..1024, sweep_workers 2..16, sweep_elements >= 1")
        if not self.rtt_ms >= 0:
            raise ValueError("rtt_ms must be >= 0")
        if not self.workers or any(not 2 <= n <= 16 for n in self.workers):
            raise ValueError(f"workers must be between 2 and 16, got {list(self.workers)}")
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad or not self.backends:
            raise ValueError(f"backends must be some of {', '.join(BACKENDS)}, got {list(self.backends)}")
        if self.elements < 1 or self.iterations < 1 or self.warmup < 0 or not self.bw_mbps > 0:
            raise ValueError("elements, iterations and bw_mbps must be positive, warmup >= 0")
        if not 0 <= self.slots <= wire.NUM_SLOTS:
            raise ValueError(f"slots must be 0 (measured) or 1..{wire.NUM_SLOTS}, got {self.slots}")


@register
class AllreduceExperiment(Experiment):
    name = "allreduce"
    aliases = ("exp1",)
    title = "All-reduce time vs worker count: INA vs ring vs Rina on equal shaped links"
    Config = AllreduceConfig
    anchors = (
        Anchor("SwitchML", 'Sapio et al., "Scaling Distributed Machine Learning with In-Network Aggregation", NSDI 2021 '
               "(arXiv 1903.06701)",
               "a job's aggregator pool sized to the bandwidth-delay product: throughput grows with the pool until the "
               "pool covers the BDP, then stays flat; INA time independent of the number of workers; training "
               "throughput up to 5.5x over the host-based baseline on real models",
               "the pool-size curve (right: time proportional to 1/slots below the BDP, at the framed wire time "
               "above, the dashed model) and INA's time against the worker count (left)"),
        Anchor("In-network vs ring, bytes", "arithmetic",
               "ring all-reduce moves 2(n-1)/n of the data per worker link, INA 1x: INA/ring = n/(2(n-1)) before "
               "framing",
               "the ratio plot (middle): INA/ring measured against the ideal and the framed ideal (184-byte INA "
               "frames with 128 bytes of payload, TCP's 1448 in 1514 and its ACKs)"),
    )
    targets = (
        Target("every point of the pool-size curve within its bound: 15 % of the model below the BDP of the "
               "measured round trip, 10 % of the framed wire time at or above it", "slot_curve.*.within_target",
               Comparison.HOLDS),
        Target("INA/ring at the largest worker count within 10 % of the framed ideal", "points[-1].ina_ring_ratio",
               Comparison.WITHIN, 0.10, reference="points[-1].framed_ideal_ratio"),
        Target("INA at the largest worker count within 15 % of its framed wire time (the same at every n: flat in n)",
               "points[-1].ina_wire_ratio", Comparison.AT_MOST, 1.15),
    )
    options = (
        ("--workers", "workers", "ints", "worker counts (2..16)"),
        ("--backends", "backends", "strs", "backends: ina, ring, rina"),
        ("--elements", "elements", int, "float32 elements per all-reduce"),
        ("--iterations", "iterations", int, "timed all-reduces per point"),
        ("--bw", "bw_mbps", float, "link bandwidth, Mbit/s"),
        ("--slots", "slots", int, "INA slots per job (its window; 0: sized to a probe's measured round trip)"),
        ("--slot-sweep", "slot_sweep", "ints", "granted slots of the pool-size curve"),
        ("--sweep-workers", "sweep_workers", int, "workers of the pool-size curve's job"),
        ("--no-slot-sweep", "slot_sweep", "false", "skip the pool-size curve"),
        ("--no-calibrate", "calibrate", "false", "skip the calibration probes"),
    )

    @classmethod
    def presets(cls) -> dict[str, AllreduceConfig]:
        return {
            "tiny": AllreduceConfig(workers=(2, 4), elements=8192, iterations=2, rtt_ms=4.0, slots=8, slot_sweep=(1, 8),
                                    sweep_workers=2, sweep_elements=2048, calibrate=True),
            "small": AllreduceConfig(workers=(2, 8), elements=16384, iterations=3, slot_sweep=(1, 2, 4, 8, 16, 32, 64),
                                     sweep_elements=8192),
            "full": AllreduceConfig(),
        }

    def run(self) -> None:
        from topologies.topos import LeafSpineTopo, StarTopo

        cfg, ctx = self.config, self.ctx
        port = INA_UDP_BASE
        common = ("--elements", str(cfg.elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup),
                  "--check")  # every worker compares its result with the exact sum of all inputs
        for n in cfg.workers:
            slots = cfg.slots or None  # None: measured by the probe on the star (Rina's racks take the same)
            star_backends = [b for b in cfg.backends if b in ("ina", "ring")]
            plans: list[tuple[str, Any, list[str]]] = []
            if star_backends:
                plans.append(("star", StarTopo(n, bw=cfg.bw_mbps, rtt_ms=cfg.rtt_ms), star_backends))
            if "rina" in cfg.backends:
                if n % 2:
                    ctx.progress(f"n={n}: rina skipped (two racks need an even worker count)")
                else:
                    plans.append(("leafspine", LeafSpineTopo(2, n // 2, bw=cfg.bw_mbps, uplink_bw=cfg.bw_mbps,
                                                             rtt_ms=cfg.rtt_ms), ["rina"]))
            for topo_name, topo, backends in plans:
                ctx.progress(f"n={n}: starting {topo_name} ({cfg.bw_mbps:g} Mbit/s links, {cfg.rtt_ms:g} ms round trip, "
                             f"switch {ctx.options.switch})")
                with ctx.testbed(topo, f"n{n}-{topo_name}") as bed:
                    hosts = tuple(f"h{i}" for i in range(1, n + 1))
                    if slots is None and topo_name == "star":
                        port += 1
                        slots = self._probe_slots(bed, n, hosts, port)
                    for backend in backends:
                        port += 1
                        ctx.progress(f"n={n} backend={backend}: {cfg.warmup}+{cfg.iterations} all-reduces of "
                                     f"{cfg.elements} float32")
                        granted = (slots or self._nominal_slots()) if backend != "ring" else None
                        job = AgentJob(f"ar-n{n}-{backend}", hosts, "allreduce", backend=backend, args=common,
                                       requested_slots=granted, udp_port=port)
                        workers = ctx.run_job(bed, job, {"kind": "allreduce", "workers": n, "backend": backend,
                                                         "topology": topo_name})
                        if workers is None:
                            continue
                        row = allreduce_row(workers, kind="allreduce", workers=n, backend=backend, topology=topo_name,
                                            bw_mbps=cfg.bw_mbps, slots=granted)
                        ctx.record(row)
                        ctx.progress(f"n={n} backend={backend}: median {row['seconds_median'] * 1e3:.0f} ms, "
                                     f"{row['goodput_mbps']:.2f} Mbit/s, retransmits {row['retransmits']}")
        if cfg.slot_sweep:
            self._slot_sweep(port + 1)
        if cfg.calibrate:
            self._calibrate(port + 100)

    def _nominal_slots(self) -> int:
        """Twice the nominal bandwidth-delay product: the probe's grant (and the jobs' where no probe could run)."""
        cfg = self.config
        return max(1, min(wire.NUM_SLOTS, math.ceil(SLOT_HEADROOM * bdp_slots(cfg.rtt_ms, cfg.bw_mbps))))

    def _probe_slots(self, bed: Any, n: int, hosts: tuple[str, ...], port: int) -> int | None:
        """Run the probe job (one call of the experiment's tensor) and size the grants to the longest path round trip
        its agents measured (``measured_slots``); None if the probe failed (the jobs then ask for the nominal grant)."""
        cfg, ctx = self.config, self.ctx
        probe = self._nominal_slots()
        job = AgentJob(f"probe-n{n}", hosts, "allreduce", backend="ina", requested_slots=probe, udp_port=port,
                       args=("--elements", str(cfg.elements), "--iterations", "1", "--warmup", "0"))
        try:
            workers = bed.run_jobs([job])[job.name]
        except AgentFailure as exc:
            ctx.error(f"n={n}: round-trip probe: {exc}")
            return None
        rtts = [float((w.get("stats") or {}).get("path_rtt_s") or 0) for w in workers]
        if not rtts or min(rtts) <= 0:
            ctx.error(f"n={n}: round-trip probe: no round trip measured ({rtts}); nominal grant of {probe} slots")
            return None
        slots = measured_slots(max(rtts), cfg.bw_mbps)
        ctx.record({"kind": "rtt_probe", "workers": n, "bw_mbps": cfg.bw_mbps, "rtt_ms": cfg.rtt_ms,
                    "probe_slots": probe, "path_rtt_s": rtts, "nominal_rtt_s": window_rtt_seconds(cfg.rtt_ms, cfg.bw_mbps),
                    "nominal_bdp_slots": bdp_slots(cfg.rtt_ms, cfg.bw_mbps), "slots": slots})
        ctx.progress(f"n={n}: path round trip {max(rtts) * 1e3:.1f} ms measured (nominal "
                     f"{window_rtt_seconds(cfg.rtt_ms, cfg.bw_mbps) * 1e3:.1f} ms): grants of {slots} slots")
        return slots

    def _slot_sweep(self, port: int) -> None:
        """SwitchML's pool-size curve: one job, time vs granted slots at a fixed round trip."""
        from topologies.topos import StarTopo

        cfg, ctx = self.config, self.ctx
        n = cfg.sweep_workers
        hosts = tuple(f"h{i}" for i in range(1, n + 1))
        args = ("--elements", str(cfg.sweep_elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup),
                "--check")
        ctx.progress(f"pool-size curve: {n} workers, {cfg.rtt_ms:g} ms round trip, BDP "
                     f"{bdp_slots(cfg.rtt_ms, cfg.bw_mbps):.1f} slots, slots {', '.join(map(str, cfg.slot_sweep))}")
        with ctx.testbed(StarTopo(n, bw=cfg.bw_mbps, rtt_ms=cfg.rtt_ms), f"sweep-n{n}") as bed:
            for k, slots in enumerate(cfg.slot_sweep):
                job = AgentJob(f"sweep-s{slots}", hosts, "allreduce", backend="ina", args=args, requested_slots=slots,
                               udp_port=port + k)
                workers = ctx.run_job(bed, job, {"kind": "slots", "workers": n, "slots": slots})
                if workers is None:
                    continue
                row = allreduce_row(workers, kind="slots", workers=n, backend="ina", topology="star", bw_mbps=cfg.bw_mbps,
                                    slots=slots, rtt_ms=cfg.rtt_ms)
                row["model_nominal_s"] = slot_model_seconds(row["bytes"], slots, cfg.rtt_ms, cfg.bw_mbps)
                ctx.record(row)
                srtt = f", smoothed round trip {row['srtt_s'] * 1e3:.1f} ms" if row.get("srtt_s") else ""
                ctx.progress(f"slots={slots}: median {row['seconds_median'] * 1e3:.0f} ms (nominal model "
                             f"{row['model_nominal_s'] * 1e3:.0f} ms{srtt}), retransmits {row['retransmits']}")

    def _calibrate(self, port: int) -> None:
        from topologies.experiments.calibrate import calibration_from, ring_fraction, run_probes, write_calibration
        from topologies.topos import StarTopo

        ctx, cfg = self.ctx, self.config
        with ctx.testbed(StarTopo(2), "calibration-unshaped") as bed:
            try:
                probes = run_probes(bed, elements=cfg.elements, iterations=max(2, cfg.iterations), udp_port=port,
                                    record=ctx.record, progress=ctx.progress)
            except AgentFailure as exc:
                ctx.error(f"calibration: {exc}")
                return
        cal = calibration_from(
            probes, ring_goodput=ring_fraction(ctx.rows, cfg.bw_mbps, cfg.rtt_ms), rtt_ms=cfg.rtt_ms,
            source=f"ina-exp allreduce ({ctx.options.switch}, unshaped 2-worker probes; ring goodput on "
                   f"{cfg.bw_mbps:g} Mbit/s htb links), {ctx.out_dir.name}")
        path = write_calibration(cal, ctx.out_dir / "calibration.toml")
        ctx.store.doc["files"]["calibration"] = path.name
        ctx.store.save()
        ctx.progress(f"calibration written: {path}")

    @staticmethod
    def summarize(rows: list[dict], config: AllreduceConfig) -> dict:
        points = []
        by = group_by([r for r in rows if r.get("kind") == "allreduce" and r.get("seconds_median")], "workers", "backend")
        for n in sorted({k[0] for k in by}):
            point: dict[str, Any] = {"workers": n, "ideal_ratio": ideal_ina_ring_ratio(n),
                                     "framed_ideal_ratio": framed_ina_ring_ratio(n)}
            nbytes = None
            for b in BACKENDS:
                rs = by.get((n, b))
                if rs:
                    point[f"{b}_s"] = median(r["seconds_median"] for r in rs)
                    point[f"{b}_granted"] = rs[0].get("granted_backend")
                    nbytes = rs[0]["bytes"]
            granted = [r.get("slots") for b in ("ina", "rina") for r in by.get((n, b), []) if r.get("slots")]
            if granted:
                point["slots"] = granted[0]
            probes = [max(r["path_rtt_s"]) for r in rows if r.get("kind") == "rtt_probe" and r.get("workers") == n]
            if probes:
                point["path_rtt_ms"] = probes[-1] * 1e3
            if nbytes:
                point["ina_wire_s"] = ina_wire_seconds(nbytes, config.bw_mbps)
                point["ring_wire_s"] = ring_wire_seconds(nbytes, n, config.bw_mbps)
            if point.get("ina_s") and point.get("ina_wire_s"):
                point["ina_wire_ratio"] = point["ina_s"] / point["ina_wire_s"]
            if point.get("ina_s") and point.get("ring_s"):
                point["ina_ring_ratio"] = point["ina_s"] / point["ring_s"]
                point["ina_faster_than_ring"] = 1 - point["ina_ring_ratio"]
            if point.get("rina_s") and point.get("ring_s"):
                point["rina_ring_ratio"] = point["rina_s"] / point["ring_s"]
            points.append(point)
        return {"points": points, "rtt_ms": config.rtt_ms, "bdp_slots": bdp_slots(config.rtt_ms, config.bw_mbps),
                "window_rtt_ms": window_rtt_seconds(config.rtt_ms, config.bw_mbps) * 1e3,
                "slot_curve": slot_curve(rows, config), **_curve_round_trip_keys(rows, config),
                "errors": sum(1 for r in rows if r.get("error"))}

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = []
        for p in summary.get("points", []):
            parts = [f"n={p['workers']}"]
            for b in BACKENDS:
                if p.get(f"{b}_s"):
                    parts.append(f"{b} {p[f'{b}_s'] * 1e3:.0f} ms")
            if p.get("ina_ring_ratio"):
                parts.append(f"INA/ring {p['ina_ring_ratio']:.2f} (ideal {p['ideal_ratio']:.2f}, "
                             f"with framing {p['framed_ideal_ratio']:.2f})")
            if p.get("rina_ring_ratio"):
                parts.append(f"Rina/ring {p['rina_ring_ratio']:.2f}")
            if p.get("ina_wire_ratio"):
                parts.append(f"INA {p['ina_wire_ratio']:.2f}x its framed wire time")
            if p.get("slots"):
                rtt = f" (path round trip {p['path_rtt_ms']:.1f} ms measured)" if p.get("path_rtt_ms") else ""
                parts.append(f"{p['slots']} slots{rtt}")
            lines.append(", ".join(parts))
        curve = summary.get("slot_curve") or []
        if curve:
            rtt = summary.get("slot_curve_rtt_ms", summary["window_rtt_ms"])
            lines.append(f"pool-size curve at {summary['rtt_ms']:g} ms: round trip {rtt:.1f} ms "
                         f"({summary.get('slot_curve_rtt_source', 'nominal')}; nominal {summary['window_rtt_ms']:.1f}), "
                         f"BDP {summary.get('slot_curve_bdp_slots', summary['bdp_slots']):.1f} slots "
                         f"(nominal {summary['bdp_slots']:.1f}):")
            for c in curve:
                target = {"window": "model", "wire": "wire time"}[c["regime"]]
                lines.append(f"  {c['slots']} slots: {c['seconds_median'] * 1e3:.0f} ms [{c['seconds_min'] * 1e3:.0f}-"
                             f"{c['seconds_max'] * 1e3:.0f}], model {c['model_s'] * 1e3:.0f} ms, {c['error_vs_target']:+.1%} vs "
                             f"{target} ({'within' if c['within_target'] else 'OUTSIDE'} {c['target']:.0%})")
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: AllreduceConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        curve = summary.get("slot_curve") or []
        fig, axes = figure(3 if curve else 2)
        ax, ax2 = axes[0][0], axes[0][1]
        if curve:
            _plot_slot_curve(axes[0][2], curve, summary, config)
        data = [r for r in rows if r.get("kind") == "allreduce" and r.get("seconds_median")]
        for b in BACKENDS:
            rs = sorted((r for r in data if r["backend"] == b), key=lambda r: r["workers"])
            if not rs:
                continue
            xs = [r["workers"] for r in rs]
            ys = [r["seconds_median"] * 1e3 for r in rs]
            lo = [y - r["seconds_min"] * 1e3 for y, r in zip(ys, rs)]
            hi = [r["seconds_max"] * 1e3 - y for y, r in zip(ys, rs)]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=COLORS[b], label={"ina": "INA", "ring": "ring", "rina": "Rina"}[b])
        pts = summary.get("points", [])
        if pts and any(p.get("ina_wire_s") for p in pts):
            xs = [p["workers"] for p in pts if p.get("ina_wire_s")]
            ax.plot(xs, [p["ina_wire_s"] * 1e3 for p in pts if p.get("ina_wire_s")], ":", color=COLORS["ina"], label="INA wire time")
            ax.plot(xs, [p["ring_wire_s"] * 1e3 for p in pts if p.get("ring_wire_s")], ":", color=COLORS["ring"], label="ring wire time")
        from matplotlib.ticker import MaxNLocator

        for a in (ax, ax2):
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("workers")
        ax.set_ylabel("all-reduce time (ms), median, min-max")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        legend(ax, fontsize=8)
        ax.set_title(f"{config.elements * 4 // 1024} KiB float32, {config.bw_mbps:g} Mbit/s links", fontsize=9)

        ns = [p["workers"] for p in pts]
        if ns:
            import numpy as np

            grid = np.linspace(min(ns), max(ns), 50)
            ax2.plot(grid, grid / (2 * (grid - 1)), "--", color="#444444", label="ideal n/(2(n-1))")
            ax2.plot(grid, [framed_ina_ring_ratio(x) for x in grid], ":", color="#444444", label="ideal with framing")
            meas = [(p["workers"], p["ina_ring_ratio"]) for p in pts if p.get("ina_ring_ratio")]
            if meas:
                ax2.plot(*zip(*meas), "o-", color=COLORS["ina"], label="INA / ring (measured)")
            rina = [(p["workers"], p["rina_ring_ratio"]) for p in pts if p.get("rina_ring_ratio")]
            if rina:
                ax2.plot(*zip(*rina), "s-", color=COLORS["rina"], label="Rina / ring (measured)")
            ax2.axhline(1.0, color="#999999", lw=0.8)
        ax2.set_xlabel("workers")
        ax2.set_ylabel("time ratio to ring (lower is faster)")
        ax2.set_yscale("log", base=2)
        from matplotlib.ticker import FuncFormatter

        ax2.set_yticks([0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8])
        ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax2.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax2.grid(alpha=0.3)
        legend(ax2, fontsize=8)
        ax2.set_title("speed-up over ring", fontsize=9)
        note(fig, f"{config.iterations} timed calls per point after {config.warmup} warm-up; INA slots per job "
                  f"{config.slots or 'sized to the measured round trip'}; "
                  "Rina: 2 racks of n/2 under a spine")
        save(fig, path, AllreduceExperiment.title)


BELOW_BDP_TOLERANCE = 0.15  # below the BDP: measured within 15 % of max(wire, chunks x RTT / slots)
ABOVE_BDP_TOLERANCE = 0.10  # at or above it: within 10 % of the framed wire time


def curve_round_trip(rows: list[dict], config: AllreduceConfig) -> tuple[float, str]:
    """The round trip the pool-size curve is drawn against, in seconds, and where it came from.

    ``measured``: the median, over the curve's points below the nominal BDP, of the workers' median smoothed
    round trip (``srtt_s``: a chunk's turnaround, from its send to its result, which waits for every worker).
    Below the BDP no queue stands, so this is the slot's real turnaround: the nominal propagation and
    serialization plus what the software path and the workers' skew add, which on a loaded 2-core machine is
    several milliseconds and decides on which side of the knee the nominal BDP's grant falls. Points at or
    above the nominal BDP are left out (their round trips include their own queue). ``nominal`` (no point
    measured): ``window_rtt_seconds`` of the configured delay."""
    nominal_bdp = bdp_slots(config.rtt_ms, config.bw_mbps)
    measured = sorted(float(r["srtt_s"]) for r in rows
                      if r.get("kind") == "slots" and r.get("srtt_s") and r["slots"] < nominal_bdp)
    if not measured:
        return window_rtt_seconds(config.rtt_ms, config.bw_mbps), "nominal"
    mid = len(measured) // 2
    return (measured[mid] if len(measured) % 2 else (measured[mid - 1] + measured[mid]) / 2), "measured"


def curve_bdp_slots(round_trip_s: float, bw_mbps: float) -> float:
    """The bandwidth-delay product in slots of a measured round trip (one INA frame per chunk)."""
    return round_trip_s * bw_mbps * 1e6 / (wire.INA_FRAME_LEN * 8)


def slot_curve(rows: list[dict], config: AllreduceConfig) -> list[dict]:
    """The pool-size curve's points: measured (median, min, max over the timed calls) against the model drawn
    with the curve's measured round trip (``curve_round_trip``); the target is the model below that round
    trip's BDP and the framed wire time at or above it. ``model_nominal_s`` keeps the nominal round trip's model."""
    rtt, _ = curve_round_trip(rows, config)
    bdp = curve_bdp_slots(rtt, config.bw_mbps)
    out = []
    for r in sorted((r for r in rows if r.get("kind") == "slots" and r.get("seconds_median")), key=lambda r: r["slots"]):
        wire_s = ina_wire_seconds(r["bytes"], config.bw_mbps)
        model = slot_model_seconds(r["bytes"], r["slots"], config.rtt_ms, config.bw_mbps, round_trip_s=rtt)
        regime = "window" if r["slots"] < bdp else "wire"
        ref, tol = (model, BELOW_BDP_TOLERANCE) if regime == "window" else (wire_s, ABOVE_BDP_TOLERANCE)
        err = r["seconds_median"] / ref - 1
        out.append({"slots": r["slots"], "seconds_median": r["seconds_median"], "seconds_min": r["seconds_min"],
                    "seconds_max": r["seconds_max"], "model_s": model,
                    "model_nominal_s": slot_model_seconds(r["bytes"], r["slots"], config.rtt_ms, config.bw_mbps),
                    "srtt_s": r.get("srtt_s"), "wire_s": wire_s, "regime": regime,
                    "error_vs_target": err, "target": tol, "within_target": abs(err) <= tol,
                    "retransmits": r.get("retransmits"), "exact": r.get("exact")})
    return out


def _curve_round_trip_keys(rows: list[dict], config: AllreduceConfig) -> dict[str, Any]:
    """The summary's keys for the curve's round trip: ``slot_curve_rtt_ms``, its ``slot_curve_rtt_source`` and
    ``slot_curve_bdp_slots`` (the BDP the curve's regimes are split at)."""
    rtt, source = curve_round_trip(rows, config)
    return {"slot_curve_rtt_ms": rtt * 1e3, "slot_curve_rtt_source": source,
            "slot_curve_bdp_slots": curve_bdp_slots(rtt, config.bw_mbps)}


def _plot_slot_curve(ax, curve: list[dict], summary: dict, config: AllreduceConfig) -> None:
    import numpy as np

    from topologies.experiments.plotting import COLORS, legend

    xs = [c["slots"] for c in curve]
    ys = [c["seconds_median"] * 1e3 for c in curve]
    lo = [y - c["seconds_min"] * 1e3 for y, c in zip(ys, curve)]
    hi = [c["seconds_max"] * 1e3 - y for y, c in zip(ys, curve)]
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=COLORS["ina"], label="INA (measured)")
    grid = np.unique(np.geomspace(min(xs), max(xs), 80).round(2))
    nbytes = config.sweep_elements * 4
    rtt_s = summary.get("slot_curve_rtt_ms", summary["window_rtt_ms"]) / 1e3
    ax.plot(grid, [slot_model_seconds(nbytes, g, config.rtt_ms, config.bw_mbps, round_trip_s=rtt_s) * 1e3 for g in grid], "--",
            color="#444444", label=f"max(wire, chunks x RTT / slots), RTT {rtt_s * 1e3:.1f} ms "
                                   f"({summary.get('slot_curve_rtt_source', 'nominal')})")
    ax.plot(grid, [slot_model_seconds(nbytes, g, config.rtt_ms, config.bw_mbps) * 1e3 for g in grid], ":", color="#999999",
            label=f"the same, nominal RTT {summary['window_rtt_ms']:.1f} ms")
    bdp = summary.get("slot_curve_bdp_slots", summary["bdp_slots"])
    ax.axvline(bdp, color="#999999", lw=0.8, ls=":", label=f"BDP {bdp:.1f} slots (nominal {summary['bdp_slots']:.1f})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("granted slots")
    ax.set_ylabel("all-reduce time (ms), median, min-max")
    ax.set_title(f"pool-size curve: {config.sweep_workers} workers, {config.sweep_elements * 4 // 1024} KiB, "
                 f"{config.rtt_ms:g} ms RTT", fontsize=9)
    ax.grid(alpha=0.3)
    legend(ax, fontsize=7)
