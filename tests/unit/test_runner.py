"""ina-exp without a testbed: aggregation, summaries and plots of every experiment from synthetic rows,
results files (written as measured, kept on failure and interrupt), configuration overrides, and the
command line's one-line usage errors. No root needed."""
from __future__ import annotations

import dataclasses
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from topologies import runner
from topologies.experiments import EXPERIMENTS, get_experiment, load_all
from topologies.experiments.aggregate import (
    allreduce_row,
    framed_ina_ring_ratio,
    ideal_ina_ring_ratio,
    ina_wire_seconds,
    per_call_max,
    ring_wire_seconds,
)
from topologies.experiments.base import Experiment, RunOptions, flatten_row, rows_to_csv
from topologies.experiments.calibrate import calibration_from, ring_fraction
from topologies.experiments.hetero import scenarios, straggler_schedule
from topologies.experiments.hetero_summary import ideal_reduction, train_row
from topologies.experiments.multijob import MultijobExperiment, pool_size

PNG = b"\x89PNG\r\n\x1a\n"


def worker(seconds, *, backend="ina", elements=8192, retransmits=0, check=None, chunks=256):
    return {"seconds": list(seconds), "backend": backend, "elements": elements, "bytes": 4 * elements, "check": check,
            "stats": {"retransmits": retransmits, "packets_sent": chunks, "resyncs": 0, "chunks": chunks,
                      "generation_history": [[1, backend, 0]]},
            "runner": {"launched_s": 0.0, "exited_s": 2.0}}


# --- aggregation -------------------------------------------------------------------------------------------
def test_a_call_takes_as_long_as_its_slowest_worker():
    assert per_call_max([{"seconds": [1, 2, 3]}, {"seconds": [2, 1, 4]}]) == [2, 2, 4]
    assert per_call_max([{"seconds": [1, 2]}, {"seconds": [3]}]) == [3]  # a short list bounds the calls
    assert per_call_max([{"seconds": []}, {"seconds": [1]}]) == []


def test_allreduce_row_has_median_goodput_counters_and_exactness():
    row = allreduce_row([worker([0.2, 0.3, 0.25], retransmits=2, check=True), worker([0.1, 0.4, 0.2], retransmits=3, check=True)],
                        backend="ina", workers=2)
    assert row["seconds"] == [0.2, 0.4, 0.25]
    assert row["seconds_median"] == 0.25 and row["seconds_min"] == 0.2 and row["seconds_max"] == 0.4
    assert math.isclose(row["goodput_mbps"], 8192 * 4 * 8 / 0.25 / 1e6)
    assert row["retransmits"] == 5 and row["granted_backend"] == "ina" and row["exact"] is True
    assert allreduce_row([worker([0.1]), worker([0.1])])["exact"] is None  # nobody checked
    assert allreduce_row([worker([0.1], check=True), worker([0.1], check={"exact": False})])["exact"] is False
    assert allreduce_row([worker([0.1], backend="ring"), worker([0.1], backend="ina")])["granted_backend"] == ["ina", "ring"]


def test_ideal_ratios_and_wire_times():
    assert ideal_ina_ring_ratio(2) == 1.0 and math.isclose(ideal_ina_ring_ratio(8), 8 / 14)
    # INA frames carry 128 of 184 bytes, TCP 1448 of 1514 plus half a 66-byte ACK: the framed ratio is higher.
    assert framed_ina_ring_ratio(8) > ideal_ina_ring_ratio(8)
    assert math.isclose(framed_ina_ring_ratio(4), (184 / 128) / (1.5 * (1514 + 33) / 1448))
    assert math.isclose(ina_wire_seconds(128 * 100, 1.0), 100 * 184 * 8 / 1e6)
    assert ring_wire_seconds(1000, 1, 1.0) == 0.0
    assert math.isclose(ring_wire_seconds(1448, 2, 1.0), (1514 + 33) * 8 / 1e6)


def test_rows_to_csv_takes_the_union_of_columns_and_json_for_lists():
    text = rows_to_csv([{"a": 1, "b": [1, 2]}, {"a": 2, "c": None, "d": {"x": 1}}])
    lines = text.splitlines()
    assert lines[0] == "a,b,c,d"
    assert lines[1] == '1,"[1, 2]",,'
    assert flatten_row({"x": None, "y": (1,)}) == {"x": "", "y": "[1]"}


def test_calibration_from_probes_is_a_valid_simulator_calibration():
    probes = [
        {"probe": "ina-1slot", "bytes": 128 * 1000, "seconds_median": 0.2, "workers": 2},
        {"probe": "ina-pps", "bytes": 128 * 1000, "seconds_median": 0.05, "workers": 2},
        {"probe": "ring-latency", "bytes": 1024, "seconds_median": 0.001, "workers": 2},
    ]
    rows = [{"backend": "ring", "workers": 4, "bytes": 65536, "seconds_median": 1.5 * 65536 * 8 / 2e6 / 0.9}]
    frac = ring_fraction(rows, 2.0)
    assert math.isclose(frac, 0.9)
    cal = calibration_from(probes, ring_goodput=frac, source="test").model  # the cluster model ina-sim gets
    assert math.isclose(cal.ina_rtt_us, 200.0)  # 128 B per 200 us
    assert math.isclose(cal.switch_pps, 2 * 1000 / 0.05)
    assert math.isclose(cal.ring_step_latency_us, 500.0)
    assert cal.frame_bytes == 184 and cal.payload_bytes == 128 and cal.source == "test"
    assert calibration_from([], ring_goodput=None, source="x").model.ina_rtt_us == 5.0  # defaults kept


def agent_train(worker_id, *, wall, comm, compute, batch, acc=0.9, ttt=1.0, digest="ab"):
    steps = len(wall)
    return {"worker_id": worker_id, "seconds": sum(wall), "step_wall_s": wall, "step_comm_s": comm,
            "step_compute_s": compute, "batch_sizes": [batch] * steps, "losses": [1.0] * steps, "accuracy": acc,
            "test_loss": 0.3, "target_accuracy": 0.9, "time_to_target_s": ttt, "final_params_digest": digest,
            "evals": [{"step": i, "samples": 30 * (i + 1), "seconds": sum(wall[: i + 1]), "loss": 1.0, "accuracy": acc}
                      for i in range(steps)], "backend": "ina"}


def test_train_row_takes_the_slowest_worker_per_step_and_the_shortest_all_reduce():
    results = [agent_train(1, wall=[0.5, 0.4], comm=[0.3, 0.2], compute=[0.2, 0.2], batch=[10, 20]),
               agent_train(0, wall=[0.4, 0.5], comm=[0.1, 0.1], compute=[0.3, 0.4], batch=[10, 20])]
    row = train_row(results, global_batch=30, per_sample_s=0.001, scenario="s", mode="equal")
    assert row["step_wall_s"] == [0.5, 0.5] and row["step_ms_median"] == 500.0
    assert row["t_comm_ms"] == pytest.approx(100.0)  # the last to arrive does not wait
    assert row["wait_fraction"] == [0.0, pytest.approx(0.3 / 1.0)]
    assert row["samples_per_s"] == pytest.approx(60 / 0.9) and row["us_per_sample"] == pytest.approx(0.9 / 60 * 1e6)
    assert row["same_model"] and row["final_batch"] == [10, 20] and row["time_to_target_s"] == 1.0


def test_ideal_reduction_formula_and_scenarios():
    # speeds (1/3, 1, 1), B c = 1 s, no communication: 1 - (1/(7/3)) / ((1/3)/(1/3)) = 4/7
    assert ideal_reduction([1 / 3, 1, 1], 100, 0.01, 0.0) == pytest.approx(4 / 7)
    assert ideal_reduction([1, 1, 1], 90, 0.01, 0.05) == pytest.approx(0.0)
    assert straggler_schedule(30) == "1,10:0.333333,20:1"
    cfg = get_experiment("hetero").make_config("full")
    plan = scenarios(cfg)
    names = [(s.name, s.backend, s.compute) for s in plan]
    assert ("ratio 4:1", "ina", "emulated") in names and ("mixed 1,1,2,4", "rina", "emulated") in names
    assert ("straggler", "ina", "emulated") in names and ("2 fast", "ina", "emulated") in names
    assert ("ratio 3:1", "ina", "torch") in names
    mixed = next(s for s in plan if s.kind == "mixed")
    assert mixed.speeds == ("0.25", "0.25", "0.5", "1") and mixed.workers == 4
    only = scenarios(get_experiment("hetero").make_config("full", {"torch_only": True, "torch_seeds": (0, 1, 2)}))
    assert [(s.name, s.compute, s.seeds) for s in only] == [("ratio 3:1", "torch", (0, 1, 2))]


def test_multijob_runs_the_fixed_trace_per_pool_policy_and_baseline():
    cfg = MultijobExperiment.make_config("small", {"policies": ("equal", "priority", "static", "fcfs"), "supply": (1.0, 0.5)})
    exp = MultijobExperiment(cfg, ctx=None)
    assert exp.scenarios()[:3] == [(1.0, "equal", 1), (1.0, "priority", 1), (1.0, "static", 1)] and len(exp.scenarios()) == 8
    assert pool_size(4, 16, 0.25) == 16 and pool_size(4, 16, 1.0) == 64
    jobs = exp.jobs_for(0.5, "equal", run=7)
    assert [len(j.hosts) for j in jobs] == [4, 4, 4, 4] and jobs[1].hosts == ("h5", "h6", "h7", "h8")
    assert [j.priority for j in jobs] == [0, 0, 1, 1] and {j.udp_port for j in jobs} == {21007}
    assert {(j.requested_slots, j.min_slots) for j in jobs} == {(16, 1)}
    assert {(j.requested_slots, j.min_slots) for j in exp.jobs_for(0.5, "static", 8)} == {(8, 8)}  # pool 32 / 4 jobs
    assert {(j.requested_slots, j.min_slots) for j in exp.jobs_for(0.5, "fcfs", 9)} == {(16, 16)}


# --- every experiment: summary, report and plot from synthetic rows ------------------------------------------
def synthetic_rows(name: str, cfg) -> list[dict]:
    if name == "allreduce":
        rows = []
        for n in cfg.workers:
            for b, t in (("ina", 0.38), ("ring", 0.2 * n), ("rina", 0.5 * n)):
                rows.append(allreduce_row([worker([t, t * 1.1])] * n, kind="allreduce", workers=n, backend=b))
        rows.append({"kind": "allreduce", "workers": 2, "backend": "ina", "error": "boom"})
        return rows
    if name == "multijob":
        rows = []
        for s in cfg.supply:
            for p in cfg.policies:
                for rep in (1, 2):
                    rows.append({"kind": "memory", "supply": s, "policy": p, "rep": rep, "samples": [(0.0, 16), (1.0, 32)]})
                    for tj in cfg.jobs:
                        r = allreduce_row([worker([0.38] * 3)] * tj.workers, kind="job", supply=s, pool=pool_size(len(cfg.jobs), 16, s),
                                          policy=p, job=tj.job, rep=rep, priority=tj.priority)
                        r.update(busy_s=1.2 + 0.05 * tj.job, jct_s=2.0 + tj.job / s, backends=["ina"])
                        rows.append(r)
                for tj in cfg.jobs:
                    rows.append({"kind": "sim", "supply": s, "pool": pool_size(len(cfg.jobs), 16, s), "policy": p, "job": tj.job,
                                 "testbed_s": 1.2 + 0.05 * tj.job, "sim_s": 1.2, "rel_diff": 0.05 * tj.job / 1.2})
        return rows
    if name == "loss":
        rows = [allreduce_row([worker([0.2 + p * 10], check=True, retransmits=int(p * 1000))] * 2, kind="loss", loss=p,
                              backend="ina") | {"retransmits_per_chunk": p * 2} for p in cfg.loss]
        rows.append(allreduce_row([worker([0.3], backend="ring")] * 2, kind="loss", loss=0.0, backend="ring"))
        return rows
    if name == "hetero":
        rows = []
        for sc in scenarios(cfg):
            for seed in sc.seeds:
                for m in cfg.modes:
                    slow = 2.0 if m == "equal" else 1.0
                    res = [agent_train(i, wall=[0.1 * slow] * sc.steps, comm=[0.01 + 0.05 * i] * sc.steps,
                                       compute=[0.05] * sc.steps, batch=[10] * sc.workers, acc=0.9 + 0.001 * seed,
                                       ttt=1.0 * slow) for i in range(sc.workers)]
                    rows.append(train_row(res, global_batch=cfg.global_batch, per_sample_s=cfg.per_sample_ms / 1e3,
                                          scenario=sc.name, scenario_kind=sc.kind, backend=sc.backend, compute=sc.compute, mode=m,
                                          seed=seed, ratio=sc.ratio, speeds=list(sc.speeds)))
        rows.append({"kind": "train", "scenario": "x", "mode": "equal", "error": "boom"})
        return rows
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["allreduce", "hetero", "multijob", "loss"])
@pytest.mark.parametrize("size", ["tiny", "full"])
def test_every_experiment_summarizes_reports_and_plots(name, size, tmp_path):
    cls = get_experiment(name)
    cfg = cls.make_config(size)
    rows = synthetic_rows(name, cfg)
    summary = cls.summarize(rows, cfg)
    json.dumps(summary)  # JSON-able
    lines = cls.report(summary)
    assert lines and all(isinstance(x, str) for x in lines)
    path = tmp_path / f"{name}.png"
    cls.plot(rows, summary, cfg, path)
    assert path.read_bytes()[:8] == PNG


def test_summaries_state_the_figures():
    cfg = get_experiment("allreduce").make_config("tiny")
    s = get_experiment("allreduce").summarize(synthetic_rows("allreduce", cfg), cfg)
    p4 = next(p for p in s["points"] if p["workers"] == 4)
    assert math.isclose(p4["ina_ring_ratio"], 0.38 / 0.8) and math.isclose(p4["ideal_ratio"], 4 / 6)
    assert s["errors"] == 1
    lcfg = get_experiment("loss").make_config("small")
    ls = get_experiment("loss").summarize(synthetic_rows("loss", lcfg), lcfg)
    assert ls["all_exact"] is True and ls["points"][0]["relative_goodput"] == 1.0 and ls["ring_goodput_mbps"]
    p1 = next(p for p in ls["points"] if p["loss"] == 0.01)  # 0.3 s a call; 256 frames of 184 bytes at 2 Mbit/s, + 2 %
    assert p1["wire_with_resends_s"] == pytest.approx(256 * 184 * 8 / 2e6 * 1.02)
    assert p1["uplink_idle_share"] == pytest.approx(1 - 256 * 184 * 8 / 2e6 * 1.02 / 0.3)
    mcfg = get_experiment("multijob").make_config("small")
    ms = get_experiment("multijob").summarize(synthetic_rows("multijob", mcfg), mcfg)
    assert ms["simulator"]["jobs_compared"] == 2 * 6 * 4 and ms["simulator"]["within_tolerance"] == 2 * 6 * 3
    half = next(r for r in ms["runs"] if r["supply"] == 0.5 and r["policy"] == "priority")
    assert half["high_mean_jct_s"] == (2 + 3 / 0.5 + 2 + 4 / 0.5) / 2 and half["repetitions"] == 2
    assert ms["targets"]["best_vs_unlimited"] == half["all_mean_jct_s"] / ms["runs"][0]["all_mean_jct_s"]
    hcfg = get_experiment("hetero").make_config("small")
    hs = get_experiment("hetero").summarize(synthetic_rows("hetero", hcfg), hcfg)
    assert set(hs["membership"]["equal"]) == {"fast_only", "with_slow", "slow_replaced"}
    assert hs["straggler"]["adaptive_vs_static"]["median"] == 0.0 and hs["errors"] == 1
    ratio3 = next(e for e in hs["ideal"] if e["scenario"] == "ratio 3:1")
    assert ratio3["static_reduction"]["median"] == pytest.approx(0.5) and ratio3["ideal_reduction"]["median"] > 0.5
    assert hs["targets"]["convergence_1pp"] is True and hs["targets"]["max_accuracy_diff_pp"] == pytest.approx(0.0)


def test_experiment_1_sizes_its_grants_to_the_measured_round_trip():
    from topologies.experiments.allreduce import SLOT_HEADROOM, AllreduceConfig, measured_slots

    # 2 Mbit/s carries 2e6 / (184 * 8) = 1358.7 frames/s: 15 ms holds 20.4 of them, twice that is 41 slots
    assert SLOT_HEADROOM == 2.0 and measured_slots(0.015, 2.0) == 41 and measured_slots(0.0102, 2.0) == 28
    assert measured_slots(0.02, 20.0) == 544 and measured_slots(1.0, 40.0) == 1024 and measured_slots(1e-9, 2.0) == 1
    with pytest.raises(ValueError, match="positive round trip"):
        measured_slots(0.0, 2.0)
    assert AllreduceConfig().slots == 0 and get_experiment("allreduce").make_config("small").slots == 0
    with pytest.raises(ValueError, match="slots must be 0"):
        AllreduceConfig(slots=1025)
    cfg = get_experiment("allreduce").make_config("small")
    rows = [{"kind": "rtt_probe", "workers": 8, "path_rtt_s": [0.014, 0.0151], "slots": 42}]
    for b, t in (("ina", 0.4), ("ring", 0.5)):
        rows.append(allreduce_row([worker([t])] * 8, kind="allreduce", workers=8, backend=b, slots=42 if b == "ina" else None))
    s = get_experiment("allreduce").summarize(rows, cfg)
    p8 = s["points"][0]
    assert p8["slots"] == 42 and p8["path_rtt_ms"] == pytest.approx(15.1) and p8["ina_wire_ratio"] == 0.4 / p8["ina_wire_s"]
    assert "42 slots (path round trip 15.1 ms measured)" in get_experiment("allreduce").report(s)[0]


def test_the_pool_size_curve_is_drawn_against_the_round_trip_its_jobs_measured():
    from topologies.experiments.allreduce import curve_bdp_slots, curve_round_trip, slot_curve

    cfg = get_experiment("allreduce").make_config("small")  # 2 Mbit/s, 10 ms: nominal 11.47 ms, BDP 15.6 slots

    def point(slots, seconds, srtt):
        w = worker([seconds], elements=8192)
        w["stats"]["srtt_s"] = srtt
        return allreduce_row([w, worker([seconds * 0.9], elements=8192)], kind="slots", workers=4, slots=slots)

    rows = [point(1, 3.4, 0.0125), point(4, 0.88, 0.0153), point(8, 0.457, 0.0151), point(16, 0.246, 0.0148),
            point(64, 0.231, 0.034)]  # 16 and 64 are at or above the nominal BDP: their round trips carry a queue
    assert rows[0]["srtt_s"] == 0.0125 and rows[0]["path_rtt_s"] is None  # the slowest worker's; none reported
    rtt, source = curve_round_trip(rows, cfg)
    assert (rtt, source) == (0.0151, "measured") and curve_bdp_slots(rtt, 2.0) == pytest.approx(20.5, abs=0.05)
    curve = slot_curve(rows, cfg)
    assert [(c["slots"], c["regime"]) for c in curve] == [(1, "window"), (4, "window"), (8, "window"), (16, "window"),
                                                          (64, "wire")]
    assert curve[3]["model_s"] == pytest.approx(256 * 0.0151 / 16) and curve[3]["within_target"]
    assert curve[3]["model_nominal_s"] == pytest.approx(curve[4]["wire_s"])  # nominally 16 slots were on the wire
    assert not curve[4]["within_target"]  # 64 slots, 23 % above the wire time
    s = get_experiment("allreduce").summarize(rows, cfg)
    assert s["slot_curve_rtt_source"] == "measured" and s["slot_curve_bdp_slots"] == pytest.approx(20.5, abs=0.05)
    assert "round trip 15.1 ms (measured; nominal 11.5), BDP 20.5 slots (nominal 15.6)" in "\n".join(
        get_experiment("allreduce").report(s))
    unmeasured = [dict(r, srtt_s=None) for r in rows]  # no round trip reported: the nominal one, as before
    assert curve_round_trip(unmeasured, cfg) == (pytest.approx(0.01147, abs=1e-5), "nominal")
    assert [c["regime"] for c in slot_curve(unmeasured, cfg)] == ["window"] * 3 + ["wire"] * 2


# --- configuration -----------------------------------------------------------------------------------------
def test_registry_names_aliases_and_presets():
    assert list(load_all()) == ["allreduce", "hetero", "multijob", "loss", "rina", "tree"]
    assert get_experiment("exp3") is EXPERIMENTS["multijob"]
    with pytest.raises(KeyError, match="valid: allreduce"):
        get_experiment("nope")
    for cls in EXPERIMENTS.values():
        presets = cls.presets()
        assert set(presets) == {"tiny", "small", "full"}
        for cfg in presets.values():
            assert dataclasses.is_dataclass(cfg)
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(cfg, dataclasses.fields(cfg)[0].name, None)
            json.dumps(dataclasses.asdict(cfg))


def test_experiment_options_replace_preset_fields():
    cls = get_experiment("allreduce")
    ns = runner.experiment_parser(cls).parse_args(["--workers", "2,8", "--bw", "5", "--no-calibrate"])
    cfg = cls.make_config("small", vars(ns))
    assert cfg.workers == (2, 8) and cfg.bw_mbps == 5.0 and cfg.calibrate is False
    assert cfg.elements == cls.presets()["small"].elements  # untouched
    with pytest.raises(Exception, match="workers must be between 2 and 16"):
        cls.make_config("small", {"workers": (1,)})


# --- the run: results as measured, kept on failure and interrupt --------------------------------------------
@dataclass(frozen=True)
class FakeConfig:
    points: int = 3
    fail_at: int | None = None
    interrupt_at: int | None = None


class FakeExperiment(Experiment):
    name = "fake"
    title = "a fake experiment"
    Config = FakeConfig

    @classmethod
    def presets(cls):
        return {"tiny": FakeConfig(), "small": FakeConfig(), "full": FakeConfig()}

    def run(self):
        for i in range(self.config.points):
            if i == self.config.fail_at:
                raise RuntimeError("measurement exploded")
            if i == self.config.interrupt_at:
                raise KeyboardInterrupt
            self.ctx.progress(f"point {i}")
            self.ctx.record({"i": i, "value": i * 2, "list": [i]})
            saved = json.loads((self.ctx.out_dir / "results.json").read_text())
            assert len(saved["rows"]) == i + 1 and saved["status"] == "running"  # written as measured

    @staticmethod
    def summarize(rows, config):
        return {"total": sum(r["value"] for r in rows)}

    @staticmethod
    def plot(rows, summary, config, path):
        from topologies.experiments.plotting import figure, save

        fig, axes = figure()
        axes[0][0].plot([r["i"] for r in rows], [r["value"] for r in rows])
        save(fig, path, "fake")

    @staticmethod
    def report(summary):
        return [f"total {summary['total']}"]


def run_fake(tmp_path, **cfg):
    out, err = io.StringIO(), io.StringIO()
    options = RunOptions(out=str(tmp_path), size="tiny")
    code, plot = runner.run_experiment(FakeExperiment, FakeConfig(**cfg), options, out, err)
    run_dir = Path(out.getvalue().split("results: ")[1].split()[0]).parent
    return code, plot, json.loads((run_dir / "results.json").read_text()), out.getvalue(), err.getvalue(), run_dir


@pytest.mark.local
def test_a_run_writes_json_csv_jsonl_and_png_and_ends_with_the_plot_path(tmp_path):
    code, plot, doc, out, err, run_dir = run_fake(tmp_path)
    assert code == 0 and doc["status"] == "complete"
    assert doc["config"] == {"points": 3, "fail_at": None, "interrupt_at": None}
    assert doc["options"]["switch"] == "ina-switch" and doc["summary"] == {"total": 6}
    assert (run_dir / "results.csv").read_text().splitlines()[0] == "i,value,list"
    assert len((run_dir / "measurements.jsonl").read_text().splitlines()) == 3
    assert plot.read_bytes()[:8] == PNG and out.strip().splitlines()[-1] == f"plot: {plot}"
    assert "total 6" in out and "[fake 0:00] point 2" in err
    assert run_dir.parent.name == "fake" and (run_dir.parent / "latest").resolve() == run_dir.resolve()


@pytest.mark.local
def test_a_failed_run_keeps_what_was_measured(tmp_path):
    code, plot, doc, _out, err, _run_dir = run_fake(tmp_path, fail_at=2)
    assert code == 1 and doc["status"] == "failed" and len(doc["rows"]) == 2
    assert "measurement exploded" in doc["errors"][0] and "Traceback" in doc["traceback"]
    assert plot is not None and plot.exists()
    assert "fake failed: RuntimeError: measurement exploded" in err


@pytest.mark.local
def test_an_interrupted_run_keeps_what_was_measured(tmp_path):
    code, plot, doc, _out, _err, _run_dir = run_fake(tmp_path, interrupt_at=1)
    assert code == 130 and doc["status"] == "interrupted" and len(doc["rows"]) == 1 and plot.exists()


# --- command line ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    ([], "choose a command"),
    (["bogus"], "invalid choice"),
    (["run"], "name an experiment"),
    (["run", "nope"], "unknown experiment 'nope'"),
    (["run", "allreduce", "--workers", "x"], "expected comma-separated integers"),
    (["run", "allreduce", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "all", "--workers", "2"], "need one experiment"),
    (["run", "allreduce", "--workers", "1"], "workers must be between 2 and 16"),
    (["run", "loss", "--switch", "nope"], "invalid choice"),
    (["run", "multijob", "--policies", "fair"], "policies must be some of"),
    (["run", "allreduce", "--tiny", "--small"], "not allowed with argument"),
    (["list", "extra"], "unrecognized arguments"),
    (["run", "allreduce", "--switch", "bmv2", "--rtt-ms", "10"], "--rtt-ms: BMv2 cannot delay frames"),
    (["run", "loss", "--rtt-ms", "-1"], "a round trip must be >= 0"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, message):
    out, err = io.StringIO(), io.StringIO()
    assert runner.main(argv, out=out, err=err) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ina-exp: error: ") and message in lines[0], lines


def test_list_and_run_help_show_every_experiment_and_its_options():
    out = io.StringIO()
    assert runner.main(["list", "-v"], out=out) == 0
    text = out.getvalue()
    for name in ("allreduce", "hetero", "multijob", "loss"):
        assert name in text
    assert "--tiny:" in text
    out = io.StringIO()
    assert runner.main(["run", "multijob", "--help"], out=out) == 0
    assert "--supply" in out.getvalue() and "--switch" in out.getvalue()


@pytest.mark.local
def test_run_job_records_a_failed_agent_as_an_error_row_and_goes_on(tmp_path):
    from topologies.experiments.base import RunContext
    from topologies.experiments.testbed import AgentFailure

    class Bed:
        def __init__(self, fail):
            self.fail, self.kwargs = fail, None

        def run_jobs(self, jobs, **kwargs):
            self.kwargs = kwargs
            if self.fail:
                raise AgentFailure("job-a", "worker 1 exited with status 3")
            return {job.name: [{"worker": 0}] for job in jobs}

    job = dataclasses.make_dataclass("Job", ["name"])("job-a")
    ctx = RunContext(FakeExperiment, FakeConfig(), RunOptions(out=str(tmp_path), quiet=True), tmp_path)
    ok = Bed(False)
    assert ctx.run_job(ok, job, {"kind": "x"}, register_first=True) == [{"worker": 0}]
    assert ok.kwargs == {"register_first": True} and not ctx.rows
    assert ctx.run_job(Bed(True), job, {"kind": "x", "n": 2}, label="n=2") is None
    [row] = ctx.rows
    assert set(row) == {"kind", "n", "error"} and row["n"] == 2 and "exited with status 3" in row["error"]
    assert ctx.store.doc["errors"][0].startswith("n=2: ") and "exited with status 3" in ctx.store.doc["errors"][0]


@pytest.mark.parametrize("name", ["allreduce", "hetero", "multijob", "loss", "rina", "tree"])
def test_each_experiments_help_fits_one_screen_and_names_every_option_with_its_presets(name):
    out = io.StringIO()
    assert runner.main(["run", name, "--help"], out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 120, (len(lines), max(map(len, lines)))
    cls = get_experiment(name)
    for flag, field, _kind, _help in cls.options:
        assert any(line.startswith(f"  {flag} ") or line == f"  {flag}" for line in lines), flag
        assert field in {f.name for f in dataclasses.fields(cls.Config)}, field  # every option sets a field there is
