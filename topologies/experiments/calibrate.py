"""Measured constants for ``ina-sim`` (simulator/calibration.py's format) and the testbed-vs-simulator check.

The probes run on an unshaped star of two workers, so that what they measure is the software path, not a
link: one INA slot (the round trip, ``ina_rtt_us = payload / throughput``), many INA slots (the packet
rate the agents and switch sustain, ``switch_pps``), and a one-chunk ring all-reduce (the latency of a
ring step). A fourth probe (:func:`run_shared_probe`, experiment 3) runs as many concurrent INA jobs as the
experiment's trace on its own star, unshaped, to measure the packet rate the switch and the agents sustain
together (``switch_shared_pps``), after one of its jobs alone with half its BDP of slots, window-bound, whose
round trip less the added delay replaces the two-worker ``ina_rtt_us`` (:func:`run_window_probe`). ``ring_goodput_fraction`` comes from ring all-reduces on shaped links (ideal wire time /
measured time). :func:`calibration_from` combines whatever was measured with the simulator's defaults and
checks the result with ``simulator.calibration``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from inaproto import wire
from simulator.calibration import Calibration
from topologies.experiments.aggregate import allreduce_row, median
from topologies.experiments.testbed import AgentJob, Testbed

__all__ = ["PROBES", "SHARED_PROBE", "STARTUP_PROBE", "run_probes", "run_shared_probe", "run_startup_probe", "calibration_from", "shared_capacity_of",
           "ring_fraction", "write_calibration"]

PROBES = ("ina-1slot", "ina-pps", "ring-latency")
SHARED_PROBE = "ina-shared-pps"
WINDOW_PROBE = "ina-window"
STARTUP_PROBE = "agent-startup-cpu"


def run_probes(bed: Testbed, *, elements: int, iterations: int, udp_port: int,
               record: Callable[[dict], None], progress: Callable[[str], None]) -> list[dict]:
    """Run the calibration probes on a started two-worker testbed; each result is recorded as a row."""
    hosts = ("h1", "h2")
    plans = [
        ("ina-1slot", "ina", 1, elements),
        ("ina-pps", "ina", 64, elements),
        ("ring-latency", "ring", None, wire.LANES * 8),
    ]
    rows = []
    for k, (probe, backend, slots, elems) in enumerate(plans):
        progress(f"calibration probe {probe} ({backend}, {elems} elements, slots {slots or '-'})")
        job = AgentJob(f"probe-{probe}", hosts, "allreduce", backend=backend, requested_slots=slots,
                       args=("--elements", str(elems), "--iterations", str(iterations), "--warmup", "1"),
                       udp_port=udp_port + k)
        workers = bed.run_jobs([job])[job.name]
        row = allreduce_row(workers, kind="probe", probe=probe, workers=len(hosts), backend=backend, slots=slots)
        record(row)
        rows.append(row)
    return rows


def run_shared_probe(bed: Testbed, groups: Sequence[Sequence[str]], *, elements: int, iterations: int, slots: int,
                     udp_port: int, record: Callable[[dict], None], progress: Callable[[str], None],
                     bw_mbps: float | None = None, rtt_ms: float = 0.0) -> dict:
    """The shared packet-rate ceiling: one INA job per host group, all at once, ``slots`` each, on ``bed``'s
    links (``bw_mbps`` and ``rtt_ms``, recorded for :func:`calibration_from`). The links and windows must
    allow more than the switch and the agents' CPUs can serve, so that those are the bottleneck; shaped links
    make the probe pay the shaper's work per packet as the experiment does.

    Recorded as one row with ``gradients_per_s`` = sum over jobs of workers x chunks / median call time
    (the jobs' calls overlap, so their rates add up); the first call of each job is a warm-up (start-up
    skew between its agents)."""
    progress(f"calibration probe {SHARED_PROBE} ({len(groups)} concurrent INA jobs of "
             f"{'/'.join(str(len(g)) for g in groups)} workers, {elements} elements, {slots} slots each, "
             f"links {f'{bw_mbps:g} Mbit/s' if bw_mbps else 'unshaped'}, {rtt_ms:g} ms round trip)")
    jobs = [AgentJob(f"probe-shared-{k}", tuple(hosts), "allreduce", backend="ina", requested_slots=slots,
                     args=("--elements", str(elements), "--iterations", str(iterations), "--warmup", "1"),
                     udp_port=udp_port + k) for k, hosts in enumerate(groups)]
    results = bed.run_jobs(jobs, register_first=True)
    chunks = math.ceil(elements * 4 / wire.INA_DATA_LEN)
    rates, per_job = [], []
    for job in jobs:
        row = allreduce_row(results[job.name], kind="probe", probe=SHARED_PROBE, workers=len(job.hosts))
        per_job.append(row["seconds_median"])
        if row["seconds_median"]:
            rates.append(len(job.hosts) * chunks / float(row["seconds_median"]))
    row = {"kind": "probe", "probe": SHARED_PROBE, "jobs": len(jobs), "workers": sum(len(g) for g in groups),
           "slots": slots, "job_workers": [len(g) for g in groups], "bw_mbps": bw_mbps, "rtt_ms": rtt_ms,
           "elements": elements, "bytes": elements * 4, "job_seconds_median": per_job,
           "gradients_per_s": sum(rates) if len(rates) == len(jobs) else None}
    record(row)
    return row


def run_startup_probe(*, repeats: int, record: Callable[[dict], None], progress: Callable[[str], None]) -> dict:
    """The CPU one agent's start-up takes (``agent_startup_cpu_s``): user + system seconds of a Python process
    importing the agent (``host_agent.cli``, what ``ina-agent`` loads before it registers), median of `repeats`,
    on the machine the switch and agents share (``cores``: its CPU count). A lower bound: registering and the
    first grant come on top. Runs no namespaces."""
    progress(f"calibration probe {STARTUP_PROBE} ({repeats} agent imports)")
    cpu = []
    for _ in range(repeats):
        proc = subprocess.Popen([sys.executable, "-c", "import host_agent.cli"], stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode == 0:
            cpu.append(usage.ru_utime + usage.ru_stime)
    row = {"kind": "probe", "probe": STARTUP_PROBE, "cpu_s": cpu, "cpu_s_median": median(cpu), "cores": os.cpu_count()}
    record(row)
    return row


def run_window_probe(bed: Testbed, hosts: Sequence[str], *, elements: int, iterations: int, slots: int, rtt_ms: float,
                     bw_mbps: float | None, udp_port: int, record: Callable[[dict], None],
                     progress: Callable[[str], None]) -> dict:
    """The software round trip of one of the experiment's jobs: its workers on the experiment's links (``bw_mbps``,
    ``rtt_ms``) with ``slots`` below the BDP, so the job is window-bound: round trip W = time / (chunks / slots
    + 1). Less the added ``rtt_ms`` and one frame's serialization each way this is ``ina_rtt_us`` as the job
    sees it (the slowest of its workers each chunk, the agents' and the switch's CPU, the shaper)."""
    progress(f"calibration probe {WINDOW_PROBE} ({len(hosts)} workers, {slots} slots, {rtt_ms:g} ms round trip)")
    job = AgentJob(f"probe-{WINDOW_PROBE}", tuple(hosts), "allreduce", backend="ina", requested_slots=slots,
                   args=("--elements", str(elements), "--iterations", str(iterations), "--warmup", "1"), udp_port=udp_port)
    workers = bed.run_jobs([job])[job.name]
    row = allreduce_row(workers, kind="probe", probe=WINDOW_PROBE, workers=len(hosts), backend="ina", slots=slots,
                        rtt_ms=rtt_ms, bw_mbps=bw_mbps)
    record(row)
    return row


def ring_fraction(rows: Sequence[Mapping[str, Any]], link_mbps: float, rtt_ms: float = 0.0) -> float | None:
    """Ring goodput as a share of the link rate, as ina-sim's ring formula uses it (payload bytes only,
    so TCP/IP framing is part of the fraction): 2(n-1)/n * B / link rate over the measured time less the
    propagation ina-sim adds itself (2(n-1) hops of ``rtt_ms``), median over ring rows (n >= 2)."""
    shares = []
    for r in rows:
        if r.get("backend") == "ring" and r.get("seconds_median") and int(r.get("workers", 0)) >= 2 and r.get("kind") != "probe":
            n = int(r["workers"])
            ideal = 2 * (n - 1) / n * int(r["bytes"]) * 8 / (link_mbps * 1e6)
            moving = float(r["seconds_median"]) - 2 * (n - 1) * rtt_ms / 1000
            if moving > 0:
                shares.append(min(1.0, ideal / moving))
    return median(shares)


def calibration_from(probes: Sequence[Mapping[str, Any]], *, ring_goodput: float | None, source: str,
                     rtt_ms: float = 0.0, realloc_pause_s: float | None = None) -> Calibration:
    """A :class:`Calibration` from probe rows (see :data:`PROBES`); unmeasured fields keep their defaults.

    The probes run unshaped and undelayed (the software path); ``rtt_ms``, the experiment's added round
    trip, is carried as ``propagation_rtt_us`` and ``realloc_pause_s`` (measured by the agents) as
    ``realloc_pause_us``."""
    by = {r.get("probe"): r for r in probes}
    fields: dict[str, Any] = {"payload_bytes": wire.INA_DATA_LEN, "frame_bytes": wire.INA_FRAME_LEN, "source": source,
                              "propagation_rtt_us": rtt_ms * 1000}
    if realloc_pause_s:
        fields["realloc_pause_us"] = realloc_pause_s * 1e6
    one = by.get("ina-1slot")
    if one and one.get("seconds_median"):
        bps = float(one["bytes"]) / float(one["seconds_median"])
        fields["ina_rtt_us"] = wire.INA_DATA_LEN / bps * 1e6
    pps = by.get("ina-pps")
    if pps and pps.get("seconds_median"):
        chunks = math.ceil(float(pps["bytes"]) / wire.INA_DATA_LEN)
        fields["switch_pps"] = int(pps.get("workers", 2)) * chunks / float(pps["seconds_median"])
    # The trace's probes may be repeated (multijob: before each repetition): the median of their values.
    rtts = [v for v in (_window_rtt_us(r, rtt_ms) for r in probes if r.get("probe") == WINDOW_PROBE) if v is not None]
    if rtts:
        fields["ina_rtt_us"] = median(rtts)
    lat = by.get("ring-latency")
    if lat and lat.get("seconds_median"):
        n = int(lat.get("workers", 2))
        fields["ring_step_latency_us"] = float(lat["seconds_median"]) / (2 * (n - 1)) * 1e6
    if ring_goodput:
        fields["ring_goodput_fraction"] = float(ring_goodput)
    startup = by.get(STARTUP_PROBE)
    if startup and startup.get("cpu_s_median") and startup.get("cores"):
        fields["agent_startup_cpu_s"] = float(startup["cpu_s_median"])
        fields["shared_cores"] = float(startup["cores"])
    sharing = Calibration(**fields)
    caps = [c for c in (shared_capacity_of(sharing, r) for r in probes if r.get("probe") == SHARED_PROBE
                        and r.get("gradients_per_s")) if c is not None]
    if caps:
        fields["switch_shared_pps"] = median(caps)
    return Calibration(**fields)


def _window_rtt_us(window: Mapping[str, Any], rtt_ms: float) -> float | None:
    """``ina_rtt_us`` from one ``ina-window`` row: ina-sim's INA time with s slots is chunks x W / s + W (the last
    result's round trip), W less the added round trip and one frame's serialization each way."""
    if not window.get("seconds_median") or not window.get("slots"):
        return None
    chunks = math.ceil(float(window["bytes"]) / wire.INA_DATA_LEN)
    round_trip_us = float(window["seconds_median"]) / (chunks / int(window["slots"]) + 1) * 1e6
    bw = window.get("bw_mbps")
    serialization_us = 2 * wire.INA_FRAME_LEN * 8 / (float(bw) * 1e6) * 1e6 if bw else 0.0
    if round_trip_us <= rtt_ms * 1000 + serialization_us:
        return None
    return round_trip_us - rtt_ms * 1000 - serialization_us


def shared_capacity_of(cal: Calibration, row: Mapping[str, Any]) -> float | None:
    """``switch_shared_pps`` from an ``ina-shared-pps`` row: the capacity with which ina-sim's model
    (simulator.shared_switch.shared_capacity, with `cal`'s round trip and congestion window) gives the measured rate for
    the probe's own jobs, links and round trip. Rows without the probe's configuration (older runs) give the
    measured rate itself; None when the probe's links or windows, not the shared ceiling, bound it."""
    measured = float(row["gradients_per_s"])
    workers = row.get("job_workers")
    if not workers or not row.get("slots"):
        return measured
    from simulator import shared_switch

    probe = dataclasses.replace(cal, propagation_rtt_us=float(row.get("rtt_ms") or 0.0) * 1000)
    bw = row.get("bw_mbps")
    host_Bps = float(bw) * 1e6 / 8 if bw else None
    return shared_switch.shared_capacity(probe, host_Bps, [(int(row["slots"]), int(m)) for m in workers], measured)


def write_calibration(cal: Calibration, path: Path) -> Path:
    path.write_text(cal.to_json())
    return path


def calibration_dict(cal: Calibration) -> dict:
    return dataclasses.asdict(cal)


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
