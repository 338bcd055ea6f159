"""Experiment 1: all-reduce time vs worker count, INA vs ring vs Rina on equal shaped links.

For each worker count n, a star of n hosts (every link ``bw_mbps``) runs an INA job and a ring job, and
a leaf-spine of two racks of n/2 (host links and uplinks ``bw_mbps``) runs a Rina job (aggregation in each
rack's switch, ring between the racks). Each job all-reduces a float32 tensor ``iterations`` times after
``warmup`` untimed calls. A call's time is the slowest worker's. The plot shows the times and the ratio
INA/ring against its ideal n/(2(n-1)) (payload only) and against the same with each protocol's framing
(INA: 128 B of payload in a 184 B frame; TCP: 1448 in 1514). With ``calibrate`` it also runs the
calibration probes and writes ``calibration.json`` for ``ina-sim``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto.backends import Backend
from topologies.experiments import register
from topologies.experiments.aggregate import (
    allreduce_row,
    framed_ina_ring_ratio,
    group_by,
    ideal_ina_ring_ratio,
    ina_wire_seconds,
    median,
    ring_wire_seconds,
)
from topologies.experiments.base import Experiment
from topologies.experiments.testbed import INA_UDP_BASE, AgentFailure, AgentJob

BACKENDS = tuple(b.value for b in Backend)  # the experiment compares every backend a grant can hold


@dataclass(frozen=True)
class AllreduceConfig:
    """Experiment 1's configuration.

    Args:
        workers: worker counts (2..8; Rina needs an even count: two racks of n/2).
        backends: any of ina, ring, rina.
        elements: float32 elements per all-reduce.
        iterations: timed all-reduces per (n, backend); warmup: untimed ones before.
        bw_mbps: every host link and uplink, Mbit/s (htb).
        slots: INA slots each job asks for (its window). A few saturate a link of a few Mbit/s; many more
            than the link's bandwidth-delay product only queue in htb and make the agents retransmit.
        calibrate: also run the calibration probes and write calibration.json.
    """

    workers: tuple[int, ...] = (2, 4, 6, 8)
    backends: tuple[str, ...] = BACKENDS
    elements: int = 65536
    iterations: int = 5
    warmup: int = 1
    bw_mbps: float = 2.0
    slots: int = 8
    calibrate: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(int(n) for n in self.workers))
        object.__setattr__(self, "backends", tuple(self.backends))
        if not self.workers or any(not 2 <= n <= 16 for n in self.workers):
            raise ValueError(f"workers must be between 2 and 16, got {list(self.workers)}")
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad or not self.backends:
            raise ValueError(f"backends must be some of {', '.join(BACKENDS)}, got {list(self.backends)}")
        if self.elements < 1 or self.iterations < 1 or self.warmup < 0 or self.slots < 1 or not self.bw_mbps > 0:
            raise ValueError("elements, iterations, slots and bw_mbps must be positive, warmup >= 0")


@register
class AllreduceExperiment(Experiment):
    name = "allreduce"
    aliases = ("exp1",)
    title = "All-reduce time vs worker count: INA vs ring vs Rina on equal shaped links"
    Config = AllreduceConfig
    options = (
        ("--workers", "workers", "ints", "worker counts, e.g. 2,4,6,8"),
        ("--backends", "backends", "strs", "backends, e.g. ina,ring,rina"),
        ("--elements", "elements", int, "float32 elements per all-reduce"),
        ("--iterations", "iterations", int, "timed all-reduces per point"),
        ("--bw", "bw_mbps", float, "link bandwidth, Mbit/s"),
        ("--slots", "slots", int, "INA slots per job (its window)"),
        ("--no-calibrate", "calibrate", "false", "skip the calibration probes"),
    )

    @classmethod
    def presets(cls) -> dict[str, AllreduceConfig]:
        return {
            "tiny": AllreduceConfig(workers=(2, 4), elements=8192, iterations=2, calibrate=True),
            "small": AllreduceConfig(workers=(2, 4), elements=16384, iterations=3),
            "full": AllreduceConfig(),
        }

    def run(self) -> None:
        from topologies.topos import LeafSpineTopo, StarTopo

        cfg, ctx = self.config, self.ctx
        port = INA_UDP_BASE
        common = ("--elements", str(cfg.elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup),
                  "--check")  # every worker compares its result with the exact sum of all inputs
        for n in cfg.workers:
            star_backends = [b for b in cfg.backends if b in ("ina", "ring")]
            plans: list[tuple[str, Any, list[str]]] = []
            if star_backends:
                plans.append(("star", StarTopo(n, bw=cfg.bw_mbps), star_backends))
            if "rina" in cfg.backends:
                if n % 2:
                    ctx.progress(f"n={n}: rina skipped (two racks need an even worker count)")
                else:
                    plans.append(("leafspine", LeafSpineTopo(2, n // 2, bw=cfg.bw_mbps, uplink_bw=cfg.bw_mbps), ["rina"]))
            for topo_name, topo, backends in plans:
                ctx.progress(f"n={n}: starting {topo_name} ({cfg.bw_mbps:g} Mbit/s links, switch {ctx.options.switch})")
                with ctx.testbed(topo, f"n{n}-{topo_name}") as bed:
                    hosts = tuple(f"h{i}" for i in range(1, n + 1))
                    for backend in backends:
                        port += 1
                        ctx.progress(f"n={n} backend={backend}: {cfg.warmup}+{cfg.iterations} all-reduces of "
                                     f"{cfg.elements} float32")
                        job = AgentJob(f"ar-n{n}-{backend}", hosts, "allreduce", backend=backend, args=common,
                                       requested_slots=cfg.slots if backend != "ring" else None, udp_port=port)
                        try:
                            workers = bed.run_jobs([job])[job.name]
                        except AgentFailure as exc:
                            ctx.error(str(exc))
                            ctx.record({"kind": "allreduce", "workers": n, "backend": backend, "topology": topo_name,
                                        "error": str(exc)})
                            continue
                        row = allreduce_row(workers, kind="allreduce", workers=n, backend=backend, topology=topo_name,
                                            bw_mbps=cfg.bw_mbps, slots=cfg.slots if backend != "ring" else None)
                        ctx.record(row)
                        ctx.progress(f"n={n} backend={backend}: median {row['seconds_median'] * 1e3:.0f} ms, "
                                     f"{row['goodput_mbps']:.2f} Mbit/s, retransmits {row['retransmits']}")
        if cfg.calibrate:
            self._calibrate(port + 10)

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
            probes, ring_goodput=ring_fraction(ctx.rows, cfg.bw_mbps),
            source=f"ina-exp allreduce ({ctx.options.switch}, unshaped 2-worker probes; ring goodput on "
                   f"{cfg.bw_mbps:g} Mbit/s htb links), {ctx.out_dir.name}")
        path = write_calibration(cal, ctx.out_dir / "calibration.json")
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
            if nbytes:
                point["ina_wire_s"] = ina_wire_seconds(nbytes, config.bw_mbps)
                point["ring_wire_s"] = ring_wire_seconds(nbytes, n, config.bw_mbps)
            if point.get("ina_s") and point.get("ring_s"):
                point["ina_ring_ratio"] = point["ina_s"] / point["ring_s"]
            if point.get("rina_s") and point.get("ring_s"):
                point["rina_ring_ratio"] = point["rina_s"] / point["ring_s"]
            points.append(point)
        return {"points": points, "errors": sum(1 for r in rows if r.get("error"))}

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
            lines.append(", ".join(parts))
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: AllreduceConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        fig, axes = figure(2)
        ax, ax2 = axes[0]
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
        note(fig, f"{config.iterations} timed calls per point after {config.warmup} warm-up; INA slots per job {config.slots}; "
                  "Rina: 2 racks of n/2 under a spine")
        save(fig, path, AllreduceExperiment.title)
