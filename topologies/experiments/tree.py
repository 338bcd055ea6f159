"""Aggregation trees: a two-level INA tree (ToRs + spine) vs Rina on chains vs the ring vs single-switch INA.

For each layout (racks x workers per rack) a leaf-spine whose spine runs the program (every link ``bw_mbps``)
runs a tree job (``ina-controller --trees``: each ToR sums its rack, the spine sums the ToRs' partials and
its final sum comes back down), a Rina job (on chains, no trees), a ring job; a star of all workers
runs single-switch INA as the reference. Every worker checks its result (``--check``). Every run is
repeated ``repetitions`` times (fresh testbed each). No timed run writes pcaps (writing them costs every
switch CPU per packet, and a tree has three switches on its path against the star's one); ``uplink_runs``
extra lossless tree and Rina runs per layout do (``tree-uplink``, ``rina-uplink``): the INA bytes on the
spine's ports are the uplink bytes, per all-reduce and rack, compared with one framed partial sum
(``ceil(elements / 32)`` frames of 184 bytes). ``loss`` adds tree runs with that drop probability on every
switch (ina-switch only). No link adds propagation delay (``--rtt-ms`` is not applied here): a leaf-spine
gives every link ``rtt_ms / 2`` each way, so a tree's worker would see twice the star's round trip.

Windows: a job asks for ``slots`` slots on every switch of its tree, which must cover the tree path's
bandwidth-delay product (worker -> ToR -> spine -> ToR -> worker: four link crossings of ``bw_mbps`` per round trip);
:func:`tree_bdp_frames` is written beside every result. The agents' path round-trip floor comes from the grant
(the controller sizes it from the links' rates in the plan's ``topology.json``, controller/path_floor.py); each
row records the floor the agents used (``path_rtt_floor_ms``) beside :func:`path_floor_ms` of its path.
"""
from __future__ import annotations

import math
import os
import statistics
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto import wire
from topologies.experiments import register
from topologies.experiments.aggregate import allreduce_row, median
from topologies.experiments.base import Anchor, Comparison, Experiment, Target
from topologies.experiments.rina import checked_layouts, parse_layouts
from topologies.experiments.testbed import INA_UDP_BASE, AgentJob

__all__ = ["TreeConfig", "TreeExperiment", "framed_partial_bytes", "granted_floor_ms", "ina_bytes", "path_floor_ms",
           "tree_bdp_frames"]

TREE_PATH_LINKS = 4  # link crossings of a chunk's round trip through a two-level tree (a star's: 2)
LINK_LATENCY_S = 50e-6  # a veth hop and a switch's packet path, one way, besides serialization (estimate)


def framed_partial_bytes(elements: int) -> int:
    """One partial sum of ``elements`` float32 as INA frames on the wire."""
    return math.ceil(elements / wire.LANES) * wire.INA_FRAME_LEN


def tree_bdp_frames(bw_mbps: float) -> float:
    """Frames in flight needed to fill the tree path: its round trip (4 link crossings: worker -> ToR -> spine
    -> ToR -> worker, each one frame's serialization, on the sender's htb only, plus LINK_LATENCY_S) times the
    host link rate, in frames."""
    frame_s = wire.INA_FRAME_LEN * 8 / (bw_mbps * 1e6)
    rtt = TREE_PATH_LINKS * (frame_s + LINK_LATENCY_S)
    return rtt / frame_s


def path_floor_ms(links: int, bw_mbps: float) -> float:
    """The shortest round trip of an INA chunk over ``links`` link crossings of ``bw_mbps``: one frame's
    serialization each (2 to a single switch, TREE_PATH_LINKS through a tree): what the grant should carry (the
    agents take their path's floor from it; each row records the floor they used beside this)."""
    return links * wire.INA_FRAME_LEN * 8 / (bw_mbps * 1e6) * 1e3


def granted_floor_ms(workers: list[dict]) -> float | None:
    """The largest path round-trip floor the agents used (their ``stats``, taken from the grant), ms."""
    floors = [float((w.get("stats") or {}).get("path_rtt_floor_s", 0.0)) for w in workers]
    return round(max(floors) * 1e3, 4) if floors else None


def ina_bytes(pcap: Path) -> tuple[int, int]:
    """(frames, bytes) of INA frames (IPv4, UDP to port 47000) in a pcap file (Ethernet link type)."""
    frames = total = 0
    data = pcap.read_bytes() if pcap.exists() else b""
    if len(data) < 24:
        return 0, 0
    endian = "<" if data[:4] == b"\xd4\xc3\xb2\xa1" else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, orig = struct.unpack_from(endian + "IIII", data, off)
        pkt = data[off + 16: off + 16 + incl]
        off += 16 + incl
        if len(pkt) >= 38 and pkt[12:14] == b"\x08\x00" and pkt[23] == 17:
            ihl = (pkt[14] & 0x0F) * 4
            if int.from_bytes(pkt[14 + ihl + 2: 14 + ihl + 4], "big") == wire.INA_UDP_PORT:
                frames += 1
                total += orig
    return frames, total


@dataclass(frozen=True)
class TreeConfig:
    """The tree experiment's configuration.

    Args:
        layouts: (racks, workers per rack) pairs.
        elements: float32 elements per all-reduce; iterations timed calls after warmup untimed ones.
        repetitions: fresh testbeds per point (medians over them, with min and max).
        bw_mbps: every link, Mbit/s (htb).
        slots: slots each job asks for (on every switch of a tree).
        loss: drop probabilities for extra tree runs on ina-switch (empty: none).
        baselines: also run Rina, the ring and single-switch INA.
        uplink_runs: pcap runs per layout of the tree (and Rina, with baselines) for the uplink bytes.
    """

    layouts: tuple[tuple[int, int], ...] = ((2, 4), (4, 2))
    elements: int = 16384
    iterations: int = 3
    warmup: int = 1
    repetitions: int = 3
    bw_mbps: float = 2.0
    slots: int = 16
    loss: tuple[float, ...] = (0.01,)
    baselines: bool = True
    uplink_runs: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "layouts", checked_layouts(self.layouts))
        object.__setattr__(self, "loss", tuple(float(p) for p in self.loss))
        if self.elements < 1 or self.iterations < 1 or self.warmup < 0 or self.slots < 1 or self.repetitions < 1:
            raise ValueError("elements, iterations, repetitions and slots must be positive, warmup >= 0")
        if self.uplink_runs < 0:
            raise ValueError("uplink_runs must be >= 0")
        if not self.bw_mbps > 0 or any(not 0 <= p < 1 for p in self.loss):
            raise ValueError("bw_mbps must be positive and loss probabilities in [0, 1)")


@register
class TreeExperiment(Experiment):
    name = "tree"
    aliases = ("exp-tree",)
    title = "Aggregation trees: ToR + spine tree vs Rina vs ring vs single-switch INA"
    Config = TreeConfig
    anchors = (
        Anchor("AggTree / two-level INA", "ATP's two-level design (Lao et al., NSDI 2021); AggTree",
               "a job spanning racks aggregates at the ToRs, then at the spine; the uplink carries one partial sum per "
               "rack", "the tree's time against single-switch INA; the INA bytes on each uplink (pcaps of the "
               "spine's ports) in framed partial sums per all-reduce and rack"),
    )
    targets = (
        Target("the tree within 10 % of single-switch INA's time (every layout)", "points.*.tree_over_ina",
               Comparison.AT_MOST, 1.10),
        Target("each uplink carries one framed partial sum per all-reduce and rack up (within 2 %)",
               "points.*.runs.tree-uplink.uplink_up_over_framed_partial", Comparison.WITHIN, 0.02, reference=1.0,
               fmt=".3f"),
        Target("each uplink carries one framed sum per all-reduce and rack down (within 2 %)",
               "points.*.runs.tree-uplink.uplink_down_over_framed_partial", Comparison.WITHIN, 0.02, reference=1.0,
               fmt=".3f"),
        Target("every result exact, also under injected loss", "points.*.runs.*.exact", Comparison.HOLDS),
    )
    repetition_key = "rep"
    options = (
        ("--layouts", "layouts", parse_layouts, "leaf-spines, racks x workers per rack"),
        ("--elements", "elements", int, "float32 elements per all-reduce"),
        ("--iterations", "iterations", int, "timed all-reduces per run"),
        ("--repetitions", "repetitions", int, "fresh testbeds per point"),
        ("--bw", "bw_mbps", float, "link bandwidth, Mbit/s"),
        ("--slots", "slots", int, "slots per switch each job asks for"),
        ("--loss", "loss", "floats", "drop probabilities of extra tree runs (ina-switch)"),
        ("--no-baselines", "baselines", "false", "only the tree"),
        ("--uplink-runs", "uplink_runs", int, "pcap runs per layout (tree, Rina) for the uplink bytes"),
    )

    @classmethod
    def presets(cls) -> dict[str, TreeConfig]:
        return {
            "tiny": TreeConfig(layouts=((2, 2),), elements=2048, iterations=2, repetitions=1, loss=(),
                               baselines=False),
            "small": TreeConfig(layouts=((2, 2),), elements=4096, iterations=3, repetitions=3, loss=()),
            "full": TreeConfig(),
        }

    def run(self) -> None:
        from topologies.topos import LeafSpineTopo, StarTopo

        cfg, ctx = self.config, self.ctx
        port = INA_UDP_BASE + 300
        bmv2 = ctx.options.switch == "bmv2"
        common = ("--elements", str(cfg.elements), "--iterations", str(cfg.iterations), "--warmup", str(cfg.warmup),
                  "--check")
        # the path round trip's floor the grant should carry (Rina on chains: at least its racks' 2 crossings; the
        # grant's chain round trip, controller.chains, lies above it)
        tree_floor, star_floor = path_floor_ms(TREE_PATH_LINKS, cfg.bw_mbps), path_floor_ms(2, cfg.bw_mbps)
        for racks, per in cfg.layouts:
            n = racks * per
            layout = f"{racks}x{per}"
            hosts = tuple(f"h{i}" for i in range(1, n + 1))
            # (label, topology, backend, whether the controller builds trees, expected path floor in ms, injected
            # loss); uplink runs (pcaps) after them
            runs: list[tuple[str, Any, str, bool, float, float]] = [
                ("tree", LeafSpineTopo(racks, per, bw=cfg.bw_mbps, uplink_bw=cfg.bw_mbps, spine_ina=True), "auto",
                 True, tree_floor, 0.0)]
            if cfg.baselines:
                runs += [
                    ("rina", LeafSpineTopo(racks, per, bw=cfg.bw_mbps, uplink_bw=cfg.bw_mbps, spine_ina=True), "rina",
                     False, star_floor, 0.0),
                    ("ring", LeafSpineTopo(racks, per, bw=cfg.bw_mbps, uplink_bw=cfg.bw_mbps), "ring", False, 0.0, 0.0),
                    ("star", StarTopo(n, bw=cfg.bw_mbps), "ina", False, star_floor, 0.0),
                ]
            if not bmv2:
                runs += [(f"tree-loss{p:g}", LeafSpineTopo(racks, per, bw=cfg.bw_mbps, uplink_bw=cfg.bw_mbps,
                                                           spine_ina=True), "auto", True, tree_floor, p)
                         for p in cfg.loss if p > 0]
            uplink = [(f"{label}-uplink", *rest) for label, *rest in runs if label in ("tree", "rina")]
            schedule = [(rep, run) for rep in range(cfg.repetitions) for run in runs]
            schedule += [(rep, run) for rep in range(cfg.uplink_runs) for run in uplink]
            for rep, (label, topo, backend, trees, floor_ms, loss) in schedule:
                port += 1
                ctx.progress(f"{layout} {label} #{rep + 1}: {backend}, {cfg.warmup}+{cfg.iterations} all-reduces")
                opts: dict[str, Any] = {"pcap": True} if label.endswith("-uplink") else {}  # lossless, untimed
                if loss:
                    opts["faults"] = {"drop": loss, "seed": 17 + rep}
                with ctx.testbed(topo, f"{layout}-{label}-{rep + 1}", controller_settings={"trees": trees},
                                 switch_opts=opts) as bed:
                    job = AgentJob(f"tree-{layout}-{label}", hosts, "allreduce", backend=backend, args=common,
                                   requested_slots=cfg.slots if backend != "ring" else None, udp_port=port)
                    granted: list[str] = []  # the controller's grant (agents report their plan: ina for a tree)
                    workers = ctx.run_job(bed, job, {"kind": "tree", "layout": layout, "run": label, "rep": rep},
                                          register_first=True, on_admitted=lambda granted=granted: granted.extend(
                                              j["grant"]["backend"] for j in bed.controller_state().get("jobs", [])))
                    if workers is None:
                        continue
                    run_dir = bed.run_dir
                row = allreduce_row(workers, kind="tree", layout=layout, racks=racks, per_rack=per, run=label,
                                    rep=rep, backend=backend, loss=loss, bw_mbps=cfg.bw_mbps, slots=cfg.slots,
                                    tree_bdp_frames=tree_bdp_frames(cfg.bw_mbps),
                                    controller_backend=granted[0] if granted else None, pcap=bool(opts.get("pcap")),
                                    load1=os.getloadavg()[0],  # the shared machine's load as the run ends
                                    path_rtt_floor_ms=granted_floor_ms(workers),
                                    expected_path_rtt_floor_ms=round(floor_ms, 4))
                if opts.get("pcap"):
                    up = [ina_bytes(run_dir / "pcaps" / f"ina-spine1-p{r}_in.pcap") for r in range(1, racks + 1)]
                    down = [ina_bytes(run_dir / "pcaps" / f"ina-spine1-p{r}_out.pcap") for r in range(1, racks + 1)]
                    calls = cfg.iterations + cfg.warmup
                    row.update(uplink_up_bytes=sum(b for _, b in up), uplink_down_bytes=sum(b for _, b in down),
                               uplink_up_frames=sum(f for f, _ in up), calls=calls,
                               uplink_up_bytes_per_allreduce_rack=sum(b for _, b in up) / calls / racks,
                               uplink_down_bytes_per_allreduce_rack=sum(b for _, b in down) / calls / racks,
                               framed_partial_bytes=framed_partial_bytes(cfg.elements))
                ctx.record(row)
                ctx.progress(f"{layout} {label} #{rep + 1}: median {row['seconds_median'] * 1e3:.0f} ms, "
                             f"retransmits {row['retransmits']}, exact {row.get('exact')}, granted "
                             f"{row['controller_backend']} (agents: {row['granted_backend']})"
                             + (f", uplink up {row['uplink_up_bytes_per_allreduce_rack']:.0f} B per all-reduce "
                                f"and rack (framed partial {row['framed_partial_bytes']})"
                                if "uplink_up_bytes" in row else ""))

    @staticmethod
    def summarize(rows: list[dict], config: TreeConfig) -> dict:
        ok = [r for r in rows if r.get("kind") == "tree" and r.get("seconds_median")]
        points = []
        for layout in dict.fromkeys(r["layout"] for r in ok):
            runs: dict[str, Any] = {}
            for label in dict.fromkeys(r["run"] for r in ok if r["layout"] == layout):
                rs = [r for r in ok if r["layout"] == layout and r["run"] == label]
                secs = [r["seconds_median"] for r in rs]
                entry: dict[str, Any] = {
                    "seconds_median": median(secs), "seconds_min": min(secs), "seconds_max": max(secs),
                    "repetitions": len(rs), "exact": all(r.get("exact") for r in rs),
                    "granted_backend": sorted({str(r.get("controller_backend")) for r in rs}),
                    "agent_plan": sorted({str(b) for r in rs for b in
                                          ([r["granted_backend"]] if isinstance(r["granted_backend"], str)
                                           else r["granted_backend"])}),
                    "retransmits_median": statistics.median(r["retransmits"] for r in rs),
                    "path_rtt_floor_ms": sorted({r["path_rtt_floor_ms"] for r in rs
                                                 if r.get("path_rtt_floor_ms") is not None}),
                }
                loads = [r["load1"] for r in rs if "load1" in r]
                if loads:
                    entry.update(load1_min=min(loads), load1_max=max(loads))
                ups = [r["uplink_up_bytes_per_allreduce_rack"] for r in rs if "uplink_up_bytes_per_allreduce_rack" in r]
                if ups:
                    downs = [r["uplink_down_bytes_per_allreduce_rack"] for r in rs]
                    framed = rs[0]["framed_partial_bytes"]
                    entry.update(uplink_up_bytes_per_allreduce_rack=median(ups),
                                 uplink_down_bytes_per_allreduce_rack=median(downs),
                                 uplink_up_over_framed_partial=median(ups) / framed,
                                 uplink_down_over_framed_partial=median(downs) / framed,
                                 framed_partial_bytes=framed)
                runs[label] = entry
            point: dict[str, Any] = {"layout": layout, "runs": runs,
                                     "tree_bdp_frames": tree_bdp_frames(config.bw_mbps), "slots": config.slots}
            if "tree" in runs and "star" in runs:
                point["tree_over_ina"] = runs["tree"]["seconds_median"] / runs["star"]["seconds_median"]
            for other in ("rina", "ring"):
                if "tree" in runs and other in runs:
                    point[f"tree_over_{other}"] = runs["tree"]["seconds_median"] / runs[other]["seconds_median"]
            points.append(point)
        return {"points": points, "errors": sum(1 for r in rows if r.get("error"))}

    @staticmethod
    def report(summary: dict) -> list[str]:
        lines = []
        for p in summary.get("points", []):
            lines.append(f"{p['layout']} (slots {p['slots']}, tree path BDP {p['tree_bdp_frames']:.1f} frames):")
            for label, r in p["runs"].items():
                line = (f"  {label:14s} {r['seconds_median'] * 1e3:6.0f} ms [{r['seconds_min'] * 1e3:.0f}, "
                        f"{r['seconds_max'] * 1e3:.0f}] over {r['repetitions']} runs, exact {r['exact']}, "
                        f"granted {'/'.join(r['granted_backend'])}, retransmits {r['retransmits_median']:g}, "
                        f"path floor {'/'.join(f'{f:g}' for f in r.get('path_rtt_floor_ms', [])) or '-'} ms"
                        + (f", load {r['load1_min']:.1f}-{r['load1_max']:.1f}" if "load1_min" in r else ""))
                if "uplink_up_over_framed_partial" in r:
                    line += (f", uplink per all-reduce and rack: up {r['uplink_up_over_framed_partial']:.3f}, "
                             f"down {r['uplink_down_over_framed_partial']:.3f} framed partial sums")
                lines.append(line)
            ratios = ", ".join(f"{k} {p[k]:.2f}" for k in ("tree_over_ina", "tree_over_rina", "tree_over_ring") if k in p)
            if ratios:
                lines.append(f"  {ratios}")
        return lines

    @staticmethod
    def plot(rows: list[dict], summary: dict, config: TreeConfig, path: Path) -> None:
        from topologies.experiments.plotting import COLORS, figure, legend, note, save

        fig, axes = figure(2)
        ax, bx = axes[0]
        colors = {"tree": "#ff7f0e", "rina": COLORS["rina"], "ring": COLORS["ring"], "star": COLORS["ina"]}
        x, labels, shown = 0, [], set()
        for p in summary.get("points", []):
            for label, r in p["runs"].items():
                base = label.split("-")[0]
                err = [[r["seconds_median"] - r["seconds_min"]], [r["seconds_max"] - r["seconds_median"]]]
                ax.bar(x, r["seconds_median"] * 1e3, yerr=[[e[0] * 1e3] for e in err], width=0.6,
                       color=colors.get(base, "#999999"), label=None if base in shown else base)
                shown.add(base)
                labels.append(f"{p['layout']}\n{label}")
                if "uplink_up_over_framed_partial" in r:
                    bx.bar(len(bx.patches), r["uplink_up_over_framed_partial"], width=0.6,
                           color=colors.get(base, "#999999"))
                    bx.text(len(bx.patches) - 1, 0.02, f"{p['layout']}\n{label}", rotation=90, fontsize=6, ha="center")
                x += 1
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=6, rotation=90)
        ax.set_ylabel("all-reduce time, ms (median, min-max over runs)")
        ax.grid(alpha=0.3, axis="y")
        bx.axhline(1.0, color="k", ls="--", lw=0.8)
        bx.set_ylabel("uplink bytes up / (all-reduce x rack x framed partial)", fontsize=8)
        bx.set_xticks([])
        legend(ax, fontsize=7)
        note(fig, f"{config.elements * 4 // 1024} KiB float32, {config.bw_mbps:g} Mbit/s links, {config.slots} slots; "
                  f"{config.iterations} timed calls after {config.warmup} warm-up, {config.repetitions} runs")
        save(fig, path, TreeExperiment.title)
