"""ina-exp end to end (root): every experiment's --tiny configuration builds its testbed, measures, writes
results.json (with every daemon's whole configuration) / results.csv / a PNG, and leaves no process, namespace or
interface behind; Ctrl-C (SIGINT)
in the middle of a run stops everything and keeps what was measured; usage errors are one line.

The whole file takes about two minutes on the 2-core machine (docs/experiments.md has the timings).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("mininet")

from controller.config import ControllerConfig
from host_agent.options import AgentOptions
from inaproto.commands import REPO, Command, command_argv
from inaproto.config import load
from simulator.config import SimConfig
from softswitch.config import SwitchConfig
from topologies import state as run_state
from topologies.cleanup import root_interfaces
from topologies.experiments.allreduce import measured_slots
from topologies.experiments.calibrate import read_calibration

PNG = b"\x89PNG\r\n\x1a\n"
INA_EXP = command_argv(Command.EXP)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain ``text`` (the run's own output folder:
    every agent and controller the runner starts names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and "pytest" not in cmd:
            found.append(f"{entry.name}: {cmd[:200]}")
    return found


def unowned_ports() -> set[str]:
    """``ina-*`` switch ports in the root namespace that no live run records (another test's live
    network is allowed to exist; a port nobody owns is a leftover)."""
    live: set[str] = set()
    for path in run_state.state_files():
        try:
            st = run_state.RunState.load(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if st.owner_alive:
            live.update(st.interfaces)
    return {n for n in root_interfaces() if n.startswith("ina-") and n not in live}


def assert_nothing_left(out: Path, pid: int, ports_before: set[str]) -> None:
    deadline = time.monotonic() + 10
    while processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(out)) == []
    path = run_state.STATE_DIR / f"run-{pid}.json"
    if path.exists():  # tolerated only as a record of things already gone (make stop drops such records)
        processes, interfaces = run_state.RunState.load(path).snapshot()
        alive = [p for p in processes if run_state.process_alive(p.pid, p.start_time)]
        assert alive == [], f"the runner left processes running: {alive}"
        assert not set(interfaces) & set(root_interfaces()), "the runner left interfaces behind"
        path.unlink()
    assert unowned_ports() - ports_before == set()


def run(args: list[str], out: Path, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([*INA_EXP, *args, "--out", str(out)], capture_output=True, text=True, timeout=timeout, check=False)
    return proc, time.monotonic() - t0


def assert_daemons_recorded(run_dir: Path, doc: dict) -> dict:
    """results.json's ``daemons``: every testbed of the run (its folder under runs/) with each of its switches, every
    start of its controller and the agents of every job it ran, each as the whole configuration the daemon read from
    its file (config/); returns the testbeds' records."""
    runs = doc["daemons"]["runs"]
    assert set(runs) == {p.name for p in (run_dir / "runs").iterdir()}
    for label, record in runs.items():
        folder = run_dir / "runs" / label
        assert set(record["switches"]) == set(json.loads((folder / "topology.json").read_text())["switches"])
        for name, config in record["switches"].items():
            assert load(SwitchConfig, None, config) == load(SwitchConfig, folder / "config" / f"{name}.toml")
        starts = sorted(start for entry in record["controller"] for start in entry["starts"])
        assert starts == list(range(1, len(list((folder / "logs").glob("controller-*.log"))) + 1))
        for entry in record["controller"]:
            start = entry["starts"][0]
            assert load(ControllerConfig, None, entry["config"]) == load(
                ControllerConfig, folder / "config" / f"controller-{start}.toml")
        jobs = {p.name.removesuffix(".job.json") for p in (folder / "agents").glob("*.job.json")}
        assert {job for entry in record["agents"] for job in entry["workers"]} == jobs
        for entry in record["agents"]:
            for job, workers in entry["workers"].items():
                assert workers == list(range(len(json.loads((folder / "agents" / f"{job}.job.json").read_text())["workers"])))
                assert load(AgentOptions, None, entry["config"]) == load(AgentOptions, folder / "config" / f"agent-{job}.toml")
    return runs


def results_of(out: Path, name: str) -> tuple[Path, dict]:
    run_dir = (out / name / "latest").resolve()
    return run_dir, json.loads((run_dir / "results.json").read_text())


@pytest.mark.parametrize("name", ["allreduce", pytest.param("hetero", marks=pytest.mark.slow), "multijob", "loss"])  # hetero: over 30 s
def test_tiny_configuration_runs_end_to_end(name, tmp_path):
    ports_before = unowned_ports()
    # As a user runs it: the default, relative results folder, from a folder that is not the checkout.
    proc = subprocess.Popen([*INA_EXP, "run", name, "--tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    run_dir, doc = results_of(tmp_path / "results", name)
    assert doc["status"] == "complete" and not doc["errors"], doc["errors"]
    assert doc["stopped_after_results"] == []  # every agent exited by itself
    assert doc["config"] == doc["config"] | {}  # present, as the preset
    assert doc["options"]["size"] == "tiny" and doc["options"]["switch"] == "ina-switch"
    assert doc["rows"] and all(not r.get("error") for r in doc["rows"])
    assert (run_dir / "results.csv").read_text().count("\n") == len(doc["rows"]) + 1
    png = run_dir / f"{name}.png"
    assert png.read_bytes()[:8] == PNG
    assert stdout.strip().splitlines()[-1] == f"plot: {png}"
    assert f"[{name} " in stderr  # progress lines
    assert_nothing_left(tmp_path / "results", proc.pid, ports_before)
    daemons = assert_daemons_recorded(run_dir, doc)

    rows = doc["rows"]
    if name == "allreduce":
        kinds = {(r["workers"], r["backend"]) for r in rows if r["kind"] == "allreduce"}
        assert kinds == {(2, "ina"), (2, "ring"), (2, "rina"), (4, "ina"), (4, "ring"), (4, "rina")}
        # exact sums for INA, ring and Rina in namespaces through ina-switch: every worker checked its result
        assert all(r["exact"] is True for r in rows if r["kind"] == "allreduce"), [r.get("exact") for r in rows]
        assert {r["granted_backend"] for r in rows if r["kind"] == "allreduce" and r["backend"] != "rina"} == {"ina", "ring"}
        cal = read_calibration(run_dir / "calibration.toml")  # ina-sim's [calibration], read by its own checks
        assert cal.ina_rtt_us > 0 and cal.switch_pps and "ina-exp allreduce" in cal.source
        assert doc["summary"]["points"][1]["ina_ring_ratio"] > 0
        curve = doc["summary"]["slot_curve"]  # the pool-size curve: 1 slot is window-bound, 8 near the BDP (nominal 7.4)
        bdp = doc["summary"]["slot_curve_bdp_slots"]  # the BDP of the round trip the curve's jobs measured
        assert [c["slots"] for c in curve] == [1, 8] and curve[0]["regime"] == "window"
        assert all(c["regime"] == ("window" if c["slots"] < bdp else "wire") for c in curve)
        assert curve[0]["seconds_median"] > 2 * curve[1]["seconds_median"] and all(c["exact"] is True for c in curve)
    elif name == "multijob":
        jobs = [r for r in rows if r["kind"] == "job"]
        assert {(r["supply"], r["policy"]) for r in jobs} == {(s, p) for s in (1.0, 0.5) for p in ("first-fit", "priority", "static")}
        assert all(r["jct_s"] > r["busy_s"] > 0 and r["exact"] is True for r in jobs)
        assert {r["requested"] for r in jobs if r["policy"] == "static" and r["supply"] == 0.5} == {4}  # pool 8 / 2 jobs
        memory = [r for r in rows if r["kind"] == "memory"]
        assert len(memory) == 6 and all(max(s for _, s in r["samples"]) <= r["pool"] for r in memory)
        sims = [r for r in rows if r["kind"] == "sim"]
        assert len(sims) == len(jobs) and all(r["sim_s"] > 0 for r in sims)
        assert read_calibration(run_dir / "calibration.toml").propagation_rtt_us == 4000
        assert doc["summary"]["simulator"]["jobs_compared"] == len(jobs)
        assert {"best_vs_unlimited", "static_vs_unlimited", "priority_high_speedup_over_static"} <= set(doc["summary"]["targets"])
        trace_run = next((run_dir / "runs").glob("*-trace"))  # after the calibration probes' testbeds
        assert "1:2" in daemons[trace_run.name]["switches"]["s1"]["link_delay"]  # half the round trip each way
        assert [s for e in daemons[trace_run.name]["controller"] for s in e["starts"]]  # restarted per pool and policy
        simulated = doc["daemons"]["ina-sim"]  # every simulated trace's configuration, as ina-sim runs it again
        assert set(simulated) == {p.name for p in (run_dir / "sim").iterdir()}
        assert all(load(SimConfig, None, c) == load(SimConfig, run_dir / "sim" / k / "sim.toml") for k, c in simulated.items())
        probes = {r["probe"]: r for r in rows if r["kind"] == "probe"}
        assert {"ina-window", "ina-shared-pps", "agent-startup-cpu", "agent-lifecycle-cpu"} <= set(probes)
        shared = probes["ina-shared-pps"]  # on the trace's own star: its links (2 Mbit/s), round trip and request
        assert shared["gradients_per_s"] > 0 and (shared["bw_mbps"], shared["rtt_ms"], shared["job_workers"], shared["slots"]) == (2.0, 4.0, [2, 2], 8)
        assert shared["exact"] is True and shared["conditions"]["jobs"] == 2 and shared["conditions"]["wall_s"] > 0
        assert all(r.get("conditions", {}).get("busy_cores") is not None for r in memory)  # the machine during each run
        cal = read_calibration(run_dir / "calibration.toml")  # the probe's CPU accounting: cores left / CPU per gradient
        from topologies.experiments.calibrate import shared_capacity_from_cpu

        assert cal.switch_shared_pps == pytest.approx(shared_capacity_from_cpu(shared)) and cal.startup_fair_share is True
        assert doc["summary"]["probes"][[p["probe"] for p in doc["summary"]["probes"]].index("ina-shared-pps")][
            "capacity_from_cpu"] == pytest.approx(cal.switch_shared_pps)
        life = probes["agent-lifecycle-cpu"]  # an agent's whole life, on the trace's star
        cores = os.cpu_count()  # an agent's start-up CPU over the shared cores, as a share of the switch's capacity
        assert cal.worker_startup_packets > 0
        assert cal.worker_startup_packets == pytest.approx(life["cpu_s_per_agent"] * cal.switch_shared_pps / cores)
        from topologies.experiments.calibrate import ring_step_fit

        ring = [r for r in rows if r.get("probe") == "ring-steps"]  # the ring on the trace's star, two sizes
        assert sorted(r["elements"] for r in ring) == [2048, 4096] and all(r["exact"] is True for r in ring)
        assert all((r["bw_mbps"], r["rtt_ms"], r["workers"]) == (2.0, 4.0, 2) for r in ring)
        fit = ring_step_fit(ring)
        assert (cal.ring_step_overhead_us is None) == (fit is None)
    elif name == "loss":
        points = doc["summary"]["points"]
        assert [p["loss"] for p in points] == [0.0, 0.05]
        assert points[1]["retransmits_per_chunk"] > 0  # the switch really dropped INA packets
        assert points[1]["gap_reports"] > 0  # the switch's loss signals came
        # lossless: a gap report names at least one frame that did not reach the switch's pipeline, and without
        # injected loss only the kernel loses frames there (a full receive ring or buffer), which the switch logs
        # when it stops (a send the worker's socket refused takes no counter)
        log = (run_dir / "runs" / "01-loss0-ina" / "logs" / "s1.log").read_text()
        kernel_drops = sum(int(n) for n in re.findall(r"(\d+) (?:frames lost )?to a full receive (?:ring|buffer)", log))
        assert points[0]["gap_reports"] <= kernel_drops
        assert all(p["exact"] is True for p in points)  # and every result is still the exact sum
        assert daemons["02-loss5-ina"]["switches"]["s1"]["faults"]["drop"] == ["0.05"]
        assert daemons["01-loss0-ina"]["switches"]["s1"]["faults"]["drop"] == []
    elif name == "hetero":
        train = {(r["scenario"], r["mode"]): r for r in rows if r["kind"] == "train"}
        assert set(train) == {(sc, m) for sc in ("ratio 1:1", "ratio 3:1", "straggler") for m in ("equal", "static", "adaptive")}
        assert all(r["same_model"] for r in train.values())  # every worker ends with the same parameters
        assert all(len(r["step_wall_s"]) == 9 and r["evals"] and r["t_comm_ms"] > 0 for r in train.values())
        # static allocation gives the 3x slower worker (worker 0) the smallest share
        split = train[("ratio 3:1", "static")]["final_batch"]
        assert split[0] == min(split) and sum(split) == doc["config"]["global_batch"]
        # adaptive follows the straggler (a third of its speed from step 3 to 5): a smaller share there
        B = doc["config"]["global_batch"]
        shares = [b[0] for b in train[("straggler", "adaptive")]["batch_sizes"]]
        assert shares[0] == B // 3 and min(shares[4:6]) < B // 3
        summary = doc["summary"]
        assert summary["straggler"]["adaptive_time_to_target_s"]["n"] == 1 and summary["targets"]["convergence_1pp"] is not None
        assert (run_dir / "hetero_shares.png").read_bytes()[:8] == PNG


def test_relative_out_from_the_checkout_root(tmp_path):
    """``--out`` relative to the checkout (where the README's commands run): every path handed to the
    controller, switches and agents is absolute, so they find their files from their own working folders.
    ``--slots 0``: the grant is sized to the round trip a probe job measures first (experiment 1's default)."""
    out = Path(os.path.relpath(tmp_path / "res", REPO))
    proc = subprocess.run([*INA_EXP, "run", "allreduce", "--tiny", "--no-calibrate", "--workers", "2", "--slots", "0",
                           "--backends", "ina", "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir, doc = results_of(tmp_path / "res", "allreduce")
    assert doc["status"] == "complete" and [r["exact"] for r in doc["rows"] if r["kind"] == "allreduce"] == [True]
    probe = next(r for r in doc["rows"] if r["kind"] == "rtt_probe")
    assert len(probe["path_rtt_s"]) == 2 and min(probe["path_rtt_s"]) > 0
    assert [r["slots"] for r in doc["rows"] if r["kind"] == "allreduce"] == [probe["slots"]]
    assert probe["slots"] == measured_slots(max(probe["path_rtt_s"]), probe["bw_mbps"])
    topology = json.loads((run_dir / "runs" / "01-n2-star" / "controller-topology.json").read_text())
    assert topology  # written where the controller read it
    assert proc.stdout.strip().splitlines()[-1] == f"plot: {run_dir / 'allreduce.png'}"


def test_ctrl_c_mid_run_stops_everything_and_keeps_the_measurements(tmp_path):
    ports_before = unowned_ports()
    proc = subprocess.Popen([*INA_EXP, "run", "allreduce", "--tiny", "--no-calibrate", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 120
    # Interrupt while the second measurement's agents run (one row is already measured).
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "backend=ring: 1+" in line:
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            break
    else:
        proc.kill()
        pytest.fail("no progress line: " + "".join(lines))
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    run_dir, doc = results_of(tmp_path, "allreduce")
    assert doc["status"] == "interrupted"
    assert len(doc["rows"]) >= 1 and doc["rows"][0]["backend"] == "ina"
    assert (run_dir / "allreduce.png").exists()  # a plot of what was measured
    assert_nothing_left(tmp_path, proc.pid, ports_before)


def test_usage_errors_exit_non_zero_with_one_line(tmp_path):
    for args, code in ((["run", "nope"], 2), (["run", "allreduce", "--workers", "1"], 2), (["frobnicate"], 2)):
        proc = subprocess.run([*INA_EXP, *args], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == code
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("ina-exp: error: ")
    assert not list(tmp_path.iterdir())


def test_rina_is_exact_on_every_deployment_mix(tmp_path):
    """ina-exp rina at tiny size (2 racks x 2 workers, ina-switch) with 100, 50 and 0 % INA racks, the flat ring
    and single-switch INA: every worker's result is the exact sum (--check); 100 % runs on the racks'
    chains (every worker plain INA towards its rack's switch), 50 % too, the workers of the rack without INA
    as host members (each plain INA towards its own copy of the chain in its agent), 0 % the ring."""
    ports_before = unowned_ports()
    proc = subprocess.Popen([*INA_EXP, "run", "rina", "--tiny", "--fractions", "1,0.5,0", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stderr[-3000:]
    run_dir, doc = results_of(tmp_path, "rina")
    assert doc["status"] == "complete" and not doc["errors"], doc["errors"]
    rows = {r["run"]: r for r in doc["rows"]}
    assert set(rows) == {"leafspine-2ina", "leafspine-1ina", "leafspine-0ina", "leafspine-ring", "star"}
    assert all(r["exact"] is True for r in rows.values()), {k: r.get("exact") for k, r in rows.items()}
    assert {k: r["granted_backend"] for k, r in rows.items()} == {
        "leafspine-2ina": "ina", "leafspine-1ina": "ina", "leafspine-0ina": "ring", "leafspine-ring": "ring",
        "star": "ina"}
    fractions = [p["ina_fraction"] for p in doc["summary"]["points"][0]["rina"]]
    assert fractions == [1.0, 0.5, 0.0]
    assert (run_dir / "rina.png").read_bytes()[:8] == PNG
    assert_nothing_left(tmp_path, proc.pid, ports_before)
    assert_daemons_recorded(run_dir, doc)
