"""Results folders of the six experiments from synthetic rows, written through the real run path (``run_experiment``:
results.json, CSV, summary and plot), with no testbed: what ``ina-exp report`` reads, for its tests.

Each experiment's rows have the shape its ``run`` records, sized by a preset (``tiny`` by default); ``slow`` scales
the measured times (1.0: every target that the preset measures is met; larger: INA, Rina and the tree fall behind).
"""
from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from topologies import runner
from topologies.experiments import get_experiment
from topologies.experiments.aggregate import (
    allreduce_row,
    framed_ina_ring_ratio,
    ina_wire_seconds,
    slot_model_seconds,
    window_rtt_seconds,
)
from topologies.experiments.base import RunOptions
from topologies.experiments.hetero import scenarios
from topologies.experiments.hetero_summary import ideal_reduction, train_row
from topologies.experiments.multijob import pool_size
from topologies.experiments.rina import framed_ideal_ratio
from topologies.experiments.tree import framed_partial_bytes

__all__ = ["NAMES", "synthetic_doc", "write_all", "write_run"]

NAMES = ("allreduce", "hetero", "multijob", "loss", "rina", "tree")


def _worker(seconds: list[float], *, backend: str = "ina", elements: int = 2048, exact: bool = True,
            retransmits: int = 0, srtt: float | None = None) -> dict[str, Any]:
    stats: dict[str, Any] = {"retransmits": retransmits, "packets_sent": elements // 32, "chunks": elements // 32}
    if srtt:
        stats["srtt_s"] = srtt
    return {"seconds": seconds, "backend": backend, "elements": elements, "bytes": 4 * elements,
            "check": {"exact": exact}, "stats": stats}


def _row(t: float, n: int, **kw: Any) -> dict[str, Any]:
    """An all-reduce row of n workers whose median call takes t seconds."""
    fields = {k: kw.pop(k) for k in ("backend", "elements", "exact", "retransmits", "srtt") if k in kw}
    return allreduce_row([_worker([t * 0.98, t, t * 1.03], **fields)] * n, backend=fields.get("backend", "ina"), **kw)


def allreduce_rows(cfg: Any, slow: float) -> list[dict]:
    rows = []
    for n in cfg.workers:
        ina = ina_wire_seconds(cfg.elements * 4, cfg.bw_mbps) * 1.05 * slow
        ring = ina_wire_seconds(cfg.elements * 4, cfg.bw_mbps) * 1.05 / framed_ina_ring_ratio(n)
        for backend, t, topo in (("ina", ina, "star"), ("ring", ring, "star"), ("rina", ring * 0.9, "leafspine")):
            rows.append(_row(t, n, backend=backend, elements=cfg.elements, kind="allreduce", workers=n, topology=topo,
                             bw_mbps=cfg.bw_mbps, slots=None if backend == "ring" else cfg.slots or 16))
    rtt = window_rtt_seconds(cfg.rtt_ms, cfg.bw_mbps)
    for slots in cfg.slot_sweep:
        model = slot_model_seconds(cfg.sweep_elements * 4, slots, cfg.rtt_ms, cfg.bw_mbps)
        rows.append(_row(model * 1.04 * slow, cfg.sweep_workers, elements=cfg.sweep_elements, srtt=rtt, kind="slots",
                         workers=cfg.sweep_workers, topology="star", bw_mbps=cfg.bw_mbps, slots=slots, rtt_ms=cfg.rtt_ms)
                    | {"model_nominal_s": model})
    return rows


def _train(worker_id: int, steps: int, wall: float, comm: float, acc: float, ttt: float, batch: list[int]) -> dict:
    return {"worker_id": worker_id, "seconds": wall * steps, "step_wall_s": [wall] * steps,
            "step_comm_s": [comm + 0.002 * worker_id] * steps, "step_compute_s": [wall - comm] * steps,
            "batch_sizes": [batch] * steps, "losses": [1.0] * steps, "accuracy": acc, "test_loss": 0.3,
            "target_accuracy": 0.9, "time_to_target_s": ttt, "final_params_digest": "ab", "backend": "ina",
            "evals": [{"step": i, "samples": sum(batch) * (i + 1), "seconds": wall * (i + 1), "loss": 1.0, "accuracy": acc}
                      for i in range(steps)]}


def hetero_rows(cfg: Any, slow: float) -> list[dict]:
    rows = []
    c, comm = cfg.per_sample_ms / 1e3, 0.005
    for sc in scenarios(cfg):
        speeds = [float(s) if "," not in s else 1.0 for s in sc.speeds]
        n = len(speeds)
        equal = cfg.global_batch / n * c / min(speeds) + comm
        ideal = ideal_reduction(speeds, cfg.global_batch, c, comm)
        for seed in sc.seeds:
            for mode in cfg.modes:
                wall = equal if mode == "equal" else equal * (1 - ideal * 0.95 / slow)
                ttt = {"equal": 2.0, "static": 1.9, "adaptive": 1.5 * slow}[mode]
                res = [_train(i, sc.steps, wall, comm, 0.92, ttt, [cfg.global_batch // n] * n) for i in range(n)]
                rows.append(train_row(res, global_batch=cfg.global_batch, per_sample_s=c, scenario=sc.name,
                                      scenario_kind=sc.kind, backend=sc.backend, compute=sc.compute, mode=mode, seed=seed,
                                      ratio=sc.ratio, speeds=list(sc.speeds)))
    return rows


def multijob_rows(cfg: Any, slow: float) -> list[dict]:
    rows = []
    jct = {"first-fit": (2.2, 2.2), "priority": (1.8 * slow, 2.6), "static": (3.0, 3.0), "equal": (2.4, 2.4),
           "weighted": (2.1, 2.5), "fcfs": (2.3, 2.3)}
    for rep in range(1, cfg.repetitions + 1):
        for supply in cfg.supply:
            pool = pool_size(len(cfg.jobs), cfg.demand_slots, supply)
            for policy in cfg.policies:
                rows.append({"kind": "memory", "supply": supply, "pool": pool, "policy": policy, "rep": rep,
                             "samples": [[0.0, pool // 2], [1.0, pool]]})
                for tj in cfg.jobs:
                    high, low = jct[policy]
                    t = (2.0 + 0.02 * rep) if supply == 1.0 else (high if tj.priority else low)
                    rows.append({"kind": "job", "supply": supply, "pool": pool, "policy": policy, "job": tj.job,
                                 "rep": rep, "priority": tj.priority, "jct_s": t, "busy_s": t * 0.8,
                                 "busy_steady_s": t * 0.7})
    for supply in cfg.supply:
        for policy in cfg.policies:
            for tj in cfg.jobs:
                rows.append({"kind": "sim", "supply": supply, "pool": pool_size(len(cfg.jobs), cfg.demand_slots, supply),
                             "policy": policy, "job": tj.job, "testbed_s": 1.5, "sim_s": 1.4, "rel_diff": 0.1 / 1.4})
    return rows


def loss_rows(cfg: Any, slow: float) -> list[dict]:
    base = ina_wire_seconds(cfg.elements * 4, cfg.bw_mbps) * 1.1
    rows = [_row(base * (1 + p * 4 * slow), cfg.workers, elements=cfg.elements, retransmits=int(p * 100),
                 kind="loss", loss=p, bw_mbps=cfg.bw_mbps) | {"retransmits_per_chunk": p * 2} for p in cfg.loss]
    if cfg.ring_reference:
        rows.append(_row(base * 1.2, cfg.workers, backend="ring", elements=cfg.elements, kind="loss", loss=0.0))
    return rows


def rina_rows(cfg: Any, slow: float) -> list[dict]:
    rows = []
    for racks, per in cfg.layouts:
        layout = f"{racks}x{per}"
        ring = ina_wire_seconds(cfg.elements * 4, cfg.bw_mbps) * 1.3
        for rep in range(cfg.repetitions):
            common = {"layout": layout, "racks": racks, "per_rack": per, "repetition": rep, "bw_mbps": cfg.bw_mbps,
                      "uplink_ratio": cfg.uplink_ratio, "kind": "rina", "elements": cfg.elements}
            runs = [(f"leafspine-{round(f * racks)}ina", "rina", round(f * racks) / racks,
                     ring * framed_ideal_ratio(racks, per, round(f * racks)) * (1.02 + 0.01 * rep) * slow)
                    for f in cfg.ina_fractions]
            runs += [("leafspine-ring", "ring", None, ring * (1 + 0.01 * rep)),
                     ("star", "ina", None, ring * framed_ideal_ratio(racks, per, racks))]
            for label, backend, frac, t in runs:
                rows.append(_row(t, racks * per, backend=backend, run=label, ina_fraction=frac, loss=0.0,
                                 **common))
    return rows


def tree_rows(cfg: Any, slow: float) -> list[dict]:
    rows = []
    for racks, per in cfg.layouts:
        layout = f"{racks}x{per}"
        star = ina_wire_seconds(cfg.elements * 4, cfg.bw_mbps) * 1.1
        labels = [("tree", "auto", star * 1.05 * slow)]
        if cfg.baselines:
            labels += [("rina", "rina", star * 1.3), ("ring", "ring", star * 1.25), ("star", "ina", star)]
        labels += [(f"tree-loss{p:g}", "auto", star * 1.4) for p in cfg.loss if p > 0]
        schedule = [(rep, lab) for rep in range(cfg.repetitions) for lab in labels]
        schedule += [(rep, (f"{lab[0]}-uplink", lab[1], lab[2])) for rep in range(cfg.uplink_runs) for lab in labels
                     if lab[0] in ("tree", "rina")]
        for rep, (label, backend, t) in schedule:
            row = _row(t * (1 + 0.01 * rep), racks * per, backend="ina" if backend == "auto" else backend,
                       elements=cfg.elements, kind="tree", layout=layout, racks=racks, per_rack=per, run=label, rep=rep,
                       loss=0.0, bw_mbps=cfg.bw_mbps, slots=cfg.slots,
                       controller_backend="tree" if backend == "auto" else backend, load1=0.5)
            if label.endswith("-uplink"):
                framed = framed_partial_bytes(cfg.elements)
                row.update(uplink_up_bytes_per_allreduce_rack=framed * 1.004, uplink_down_bytes_per_allreduce_rack=framed,
                           framed_partial_bytes=framed)
            rows.append(row)
    return rows


ROWS = {"allreduce": allreduce_rows, "hetero": hetero_rows, "multijob": multijob_rows, "loss": loss_rows,
        "rina": rina_rows, "tree": tree_rows}


def synthetic_doc(name: str, size: str = "tiny", slow: float = 1.0, **overrides: Any) -> dict[str, Any]:
    """What results.json of such a run holds of its measurements (experiment, config, rows, summary), without
    writing anything or drawing the plot."""
    cls = get_experiment(name)
    config = cls.make_config(size, overrides)
    rows = ROWS[name](config, slow)
    return {"experiment": name, "config": dataclasses.asdict(config), "rows": rows,
            "summary": cls.summarize(rows, config)}


def write_run(out: Path, name: str, size: str = "tiny", slow: float = 1.0, **overrides: Any) -> Path:
    """One results folder of experiment ``name`` under ``out`` (``out/<name>/<time>``) from synthetic rows, written by
    ``runner.run_experiment`` as a measured run is; its path."""
    cls = get_experiment(name)
    config = cls.make_config(size, overrides)
    rows = ROWS[name](config, slow)

    def run(self: Any) -> None:
        for row in rows:
            self.ctx.record(row)

    fake = type(cls.__name__, (cls,), {"run": run})
    code, _ = runner.run_experiment(fake, config, RunOptions(size=size, out=str(out), quiet=True), io.StringIO(),
                                    io.StringIO())
    run_dir = max((p for p in (out / name).iterdir() if not p.is_symlink()), key=lambda p: p.name)
    errors = json.loads((run_dir / "results.json").read_text())["errors"]
    assert code == runner.EXIT_OK and not errors, errors
    return run_dir


def write_all(out: Path, size: str = "tiny", slow: float = 1.0) -> list[Path]:
    """A results root with one synthetic run of each of the six experiments."""
    return [write_run(out, name, size, slow) for name in NAMES]

