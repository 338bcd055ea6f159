"""Measured constants for ``ina-sim`` (simulator/calibration.py's format) and the testbed-vs-simulator check.

The probes run on an unshaped star of two workers, so that what they measure is the software path, not a
link: one INA slot (the round trip, ``ina_rtt_us = payload / throughput``), many INA slots (the packet
rate the agents and switch sustain, ``switch_pps``), and a one-chunk ring all-reduce (the latency of a
ring step). Experiment 3's probes run on the trace's own star, before each repetition, under the trace's
process conditions (its links, request, ``--check``, controller polling): an agent's whole life's CPU
(:func:`run_lifecycle_probe`, ``agent_startup_cpu_s``), one job's window-bound round trip
(:func:`run_window_probe`, ``ina_rtt_us``) and the trace's jobs all at once (:func:`run_shared_probe`,
``switch_shared_pps``: from the probe's CPU accounting, :func:`shared_capacity_from_cpu`; ina-sim's model inverted on
the probe's configuration where no accounting was recorded) and ring all-reduces of two sizes
(:func:`run_ring_probe`, ``ring_step_overhead_us`` and ``ring_goodput_fraction``: what a ring step costs on those
links, fitted by :func:`ring_step_fit`); each records the machine's conditions (topologies.experiments.conditions). ``ring_goodput_fraction`` comes from ring all-reduces on shaped links (ideal wire time /
measured time). :func:`calibration_from` combines whatever was measured with the simulator's defaults into a
:class:`LabCalibration`, whose :meth:`~LabCalibration.simulator` is what ina-sim gets (:func:`write_calibration`).
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inaproto import wire
from inaproto.config import load, setting, to_toml
from simulator.calibration import Calibration
from simulator.config import SimConfig
from topologies.experiments.aggregate import allreduce_row, median
from topologies.experiments.testbed import AgentJob, Testbed

__all__ = [
    "LIFECYCLE_PROBE",
    "PROBES",
    "RING_PROBE",
    "SHARED_PROBE",
    "STARTUP_PROBE",
    "WINDOW_PROBE",
    "LabCalibration",
    "calibration_from",
    "overlapping_calls",
    "read_calibration",
    "ring_fraction",
    "ring_step_fit",
    "ring_steps_summary",
    "run_lifecycle_probe",
    "run_probes",
    "run_ring_probe",
    "run_shared_probe",
    "run_startup_probe",
    "run_window_probe",
    "shared_capacity_from_cpu",
    "shared_capacity_of",
    "shared_cpu_per_gradient",
    "shared_cpu_summary",
    "write_calibration",
]

PROBES = ("ina-1slot", "ina-pps", "ring-latency")
SHARED_PROBE = "ina-shared-pps"
WINDOW_PROBE = "ina-window"
STARTUP_PROBE = "agent-startup-cpu"
LIFECYCLE_PROBE = "agent-lifecycle-cpu"
RING_PROBE = "ring-steps"


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


def run_shared_probe(bed: Testbed, jobs: Sequence[AgentJob], *, slots: int, udp_port: int,
                     record: Callable[[dict], None], progress: Callable[[str], None],
                     bw_mbps: float | None = None, rtt_ms: float = 0.0,
                     on_sample: Callable[[float], None] | None = None) -> dict:
    """The shared packet-rate ceiling: ``jobs`` (INA, ``slots`` each, one warm-up call) all at once on ``bed``,
    whose links (``bw_mbps``, ``rtt_ms``) are recorded for :func:`calibration_from`, which inverts ina-sim's model
    on exactly this configuration. Run as a trace whose jobs all arrive at 0 (``bed.run_trace``, with
    ``on_sample`` polling the controller as the trace does), so that the probe is the trace's own process
    conditions: its links, windows, ``--check``, controller polling and agent start-up.

    Recorded as one row: ``gradients_per_s`` = sum over jobs of workers x chunks / the job's median call among
    those run while every job ran (:func:`overlapping_calls`; all its calls if none), and ``conditions``
    (topologies.experiments.conditions: load, cores busy, CPU of the switch, controller, agents, others)."""
    from topologies.experiments.conditions import Conditions

    groups = [job.hosts for job in jobs]
    progress(f"calibration probe {SHARED_PROBE} ({len(jobs)} concurrent INA jobs of "
             f"{'/'.join(str(len(g)) for g in groups)} workers, {slots} slots each, "
             f"links {f'{bw_mbps:g} Mbit/s' if bw_mbps else 'unshaped'}, {rtt_ms:g} ms round trip)")
    probe_jobs = [dataclasses.replace(job, name=f"probe-shared-{k}", backend="ina", requested_slots=slots, min_slots=slots,
                                      udp_port=udp_port + k) for k, job in enumerate(jobs)]
    conditions = Conditions(switch_pids=_switch_pids(bed), controller_pids=_controller_pids(bed), probe=SHARED_PROBE,
                            bw_mbps=bw_mbps, rtt_ms=rtt_ms, window_slots=slots, jobs=len(jobs),
                            workers=sum(len(g) for g in groups))
    with conditions:
        results = bed.run_trace(probe_jobs, {job.name: 0.0 for job in probe_jobs}, on_sample=on_sample)
    rows = [allreduce_row(results[job.name], kind="probe", probe=SHARED_PROBE, workers=len(job.hosts)) for job in probe_jobs]
    exits = [max(w["runner"]["exited_s"] for w in results[job.name]) for job in probe_jobs]
    inside = overlapping_calls([r["seconds"] for r in rows], exits)
    rates, per_job = [], []
    for job, row, calls in zip(probe_jobs, rows, inside):
        call = median(calls) if calls else row["seconds_median"]
        per_job.append(call)
        if call:
            rates.append(len(job.hosts) * math.ceil(int(row["bytes"]) / wire.INA_DATA_LEN) / float(call))
    row = {"kind": "probe", "probe": SHARED_PROBE, "jobs": len(jobs), "workers": sum(len(g) for g in groups),
           "slots": slots, "job_workers": [len(g) for g in groups], "bw_mbps": bw_mbps, "rtt_ms": rtt_ms,
           "elements": rows[0]["elements"], "bytes": rows[0]["bytes"], "job_seconds_median": per_job,
           "job_calls_overlapping": [len(c) for c in inside], "retransmits": sum(r["retransmits"] for r in rows),
           "exact": all(r["exact"] is not False for r in rows),
           "gradients_per_s": sum(rates) if len(rates) == len(jobs) else None, "conditions": conditions.result}
    record(row)
    return row


def overlapping_calls(calls: Sequence[Sequence[float]], exits: Sequence[float]) -> list[list[float]]:
    """Per job, its calls that ran while every job was running its calls: a job's calls end at its exit less the
    calls after them (the exit's own seconds taken as nil), and the window is from the latest first call's
    start to the earliest last call's end (a call counts when it lies within the window)."""
    spans = []
    for job_calls, exited in zip(calls, exits):
        ends = [exited - sum(job_calls[k + 1:]) for k in range(len(job_calls))]
        spans.append([(end - c, end) for c, end in zip(job_calls, ends)])
    if not spans or not all(spans):
        return [[] for _ in calls]
    begin = max(s[0][0] for s in spans)
    finish = min(s[-1][1] for s in spans)
    return [[e - b for b, e in s if b >= begin - 1e-9 and e <= finish + 1e-9] for s in spans]


def _switch_pids(bed: Testbed) -> list[int]:
    net = getattr(bed, "net", None)
    return [sw.process.pid for sw in (net.switches if net is not None else []) if getattr(sw, "process", None)]


def _controller_pids(bed: Testbed) -> list[int]:
    return [bed.controller.pid] if getattr(bed, "controller", None) is not None else []


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


def run_lifecycle_probe(bed: Testbed, hosts: Sequence[str], *, udp_port: int, record: Callable[[dict], None],
                        progress: Callable[[str], None], args: Sequence[str] = ()) -> dict:
    """The CPU an agent's whole life takes besides its gradients and its imports (``agent_startup_cpu_s``, the
    measured value; the import-only :func:`run_startup_probe` is its lower bound): one job of ``hosts`` on ``bed``
    whose agents start ahead of it (``Testbed.prestart``, as the trace's do), register, get their grant, all-reduce
    one chunk once and exit; the CPU its agents used (reaped children, topologies.experiments.conditions) per agent.
    ``args``: more agent options (the trace's ``--check``)."""
    from topologies.experiments.conditions import Conditions

    progress(f"calibration probe {LIFECYCLE_PROBE} ({len(hosts)} agents: start, one one-chunk all-reduce, exit)")
    job = AgentJob(f"probe-{LIFECYCLE_PROBE}", tuple(hosts), "allreduce", backend="ina", requested_slots=1, min_slots=1,
                   args=("--elements", str(wire.LANES), "--iterations", "1", "--warmup", "0", *args), udp_port=udp_port)
    bed.prestart([job])
    conditions = Conditions(switch_pids=_switch_pids(bed), controller_pids=_controller_pids(bed), probe=LIFECYCLE_PROBE,
                            prestarted_pids=bed.warm_pids(), jobs=1, workers=len(hosts), warm=True)
    with conditions:
        bed.run_jobs([job])
    cond = conditions.result
    row = {"kind": "probe", "probe": LIFECYCLE_PROBE, "workers": len(hosts), "conditions": cond,
           "cpu_s_per_agent": cond["agents_cores"] * cond["wall_s"] / len(hosts), "cores": os.cpu_count()}
    record(row)
    return row


def run_window_probe(bed: Testbed, hosts: Sequence[str], *, elements: int, iterations: int, slots: int, rtt_ms: float,
                     bw_mbps: float | None, udp_port: int, record: Callable[[dict], None],
                     progress: Callable[[str], None], args: Sequence[str] = ()) -> dict:
    """The software round trip of one of the experiment's jobs: its workers on the experiment's links (``bw_mbps``,
    ``rtt_ms``) with ``slots`` below the BDP, so the job is window-bound: round trip W = time / (chunks / slots
    + 1). Less the added ``rtt_ms`` and one frame's serialization each way this is ``ina_rtt_us`` as the job
    sees it (the slowest of its workers each chunk, the agents' and the switch's CPU, the shaper). ``args``: more
    agent options (the trace's ``--check``). The row carries ``conditions`` (topologies.experiments.conditions)."""
    from topologies.experiments.conditions import Conditions

    progress(f"calibration probe {WINDOW_PROBE} ({len(hosts)} workers, {slots} slots, {rtt_ms:g} ms round trip)")
    job = AgentJob(f"probe-{WINDOW_PROBE}", tuple(hosts), "allreduce", backend="ina", requested_slots=slots, min_slots=slots,
                   args=("--elements", str(elements), "--iterations", str(iterations), "--warmup", "1", *args),
                   udp_port=udp_port)
    conditions = Conditions(switch_pids=_switch_pids(bed), controller_pids=_controller_pids(bed), probe=WINDOW_PROBE,
                            bw_mbps=bw_mbps, rtt_ms=rtt_ms, window_slots=slots, jobs=1, workers=len(hosts))
    with conditions:
        workers = bed.run_jobs([job])[job.name]
    row = allreduce_row(workers, kind="probe", probe=WINDOW_PROBE, workers=len(hosts), backend="ina", slots=slots,
                        rtt_ms=rtt_ms, bw_mbps=bw_mbps)
    row["conditions"] = conditions.result
    record(row)
    return row


def run_ring_probe(bed: Testbed, hosts: Sequence[str], *, sizes: Sequence[int], iterations: int, rtt_ms: float,
                   bw_mbps: float | None, udp_port: int, record: Callable[[dict], None],
                   progress: Callable[[str], None], args: Sequence[str] = ()) -> list[dict]:
    """What a ring step costs on the experiment's links: ring all-reduces among ``hosts`` on ``bed`` (its links,
    ``bw_mbps``, and its added round trip, ``rtt_ms``), one job per tensor size in ``sizes`` (elements), each
    ``iterations`` timed calls after one warm-up. Measured rather than assumed so that ina-sim follows whatever the
    ring implementation and the links do (whether a step waits out the path's delay or hides it behind its bytes):
    :func:`ring_step_fit` turns the rows into a per-step overhead and a per-byte cost. One row per size, with
    ``conditions`` (topologies.experiments.conditions). ``args``: more agent options (the trace's ``--check``)."""
    from topologies.experiments.conditions import Conditions

    rows = []
    for k, elements in enumerate(sizes):
        progress(f"calibration probe {RING_PROBE} ({len(hosts)} workers, ring, {elements} elements, "
                 f"{f'{bw_mbps:g} Mbit/s' if bw_mbps else 'unshaped'}, {rtt_ms:g} ms round trip)")
        job = AgentJob(f"probe-{RING_PROBE}-{k}", tuple(hosts), "allreduce", backend="ring",
                       args=("--elements", str(elements), "--iterations", str(iterations), "--warmup", "1", *args),
                       udp_port=udp_port + k)
        conditions = Conditions(switch_pids=_switch_pids(bed), controller_pids=_controller_pids(bed), probe=RING_PROBE,
                                bw_mbps=bw_mbps, rtt_ms=rtt_ms, jobs=1, workers=len(hosts))
        with conditions:
            workers = bed.run_jobs([job])[job.name]
        row = allreduce_row(workers, kind="probe", probe=RING_PROBE, workers=len(hosts), backend="ring", rtt_ms=rtt_ms,
                            bw_mbps=bw_mbps)
        row["conditions"] = conditions.result
        record(row)
        rows.append(row)
    return rows


def ring_step_fit(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(overhead seconds, seconds per byte) of one ring step from :data:`RING_PROBE` rows: per tensor size the median
    of the rows' median calls, divided into its 2(n-1) steps, against the step's chunk (bytes / n); a least-squares
    line with a non-negative intercept (a negative one is refitted through the origin: a step costs at least its
    bytes). None without two sizes or with a slope <= 0."""
    points: dict[float, list[float]] = {}
    for r in rows:
        if r.get("probe") == RING_PROBE and r.get("seconds_median") and int(r.get("workers") or 0) >= 2:
            n = int(r["workers"])
            points.setdefault(float(r["bytes"]) / n, []).append(float(r["seconds_median"]) / (2 * (n - 1)))
    if len(points) < 2:
        return None
    xs = sorted(points)
    ys = [median(points[x]) for x in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    overhead = my - slope * mx
    if overhead < 0:
        overhead, slope = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return (overhead, slope) if slope > 0 else None


def ring_goodput_share(seconds_per_byte: float, bw_mbps: float) -> float:
    """A fitted step's per-byte cost as a share of the link's rate (at most 1): ``ring_goodput_fraction``."""
    return min(1.0, 8 / (seconds_per_byte * bw_mbps * 1e6))


def ring_steps_summary(rows: Sequence[Mapping[str, Any]], bw_mbps: float) -> dict:
    """The ring probe's calls per tensor size (``call_s``: medians over the repeated probes, keyed by elements) and
    the step fitted from them (:func:`ring_step_fit`; ``overhead_us``, ``goodput_fraction`` of ``bw_mbps``); {}
    without ring probe rows."""
    ring = [r for r in rows if r.get("kind") == "probe" and r.get("probe") == RING_PROBE and r.get("seconds_median")]
    if not ring:
        return {}
    fit = ring_step_fit(ring)
    sizes: dict[int, list[float]] = {}
    for r in ring:
        sizes.setdefault(int(r["elements"]), []).append(float(r["seconds_median"]))
    return {"workers": ring[0].get("workers"), "call_s": {e: median(v) for e, v in sorted(sizes.items())},
            "overhead_us": fit[0] * 1e6 if fit else None,
            "goodput_fraction": ring_goodput_share(fit[1], bw_mbps) if fit else None}


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
                     rtt_ms: float = 0.0, realloc_pause_s: float | None = None) -> LabCalibration:
    """A :class:`LabCalibration` from probe rows (see :data:`PROBES`); unmeasured fields keep their defaults.

    The probes run unshaped and undelayed (the software path); ``rtt_ms``, the experiment's added round
    trip, is carried as ``propagation_rtt_us`` and ``realloc_pause_s`` (measured by the agents) as
    ``realloc_pause_us``; a move off the ring keeps the ring op in flight (``ring_move_restarts_op`` false: the
    agents let it finish on a move to INA, ``RingPhases.ring_op_worth_finishing``). Ring probe rows
    (:data:`RING_PROBE`, on shaped links) give ``ring_step_overhead_us`` and ``ring_goodput_fraction``
    (:func:`ring_step_fit`), in place of ``ring_goodput``. An agent's start-up CPU and the machine's cores (the
    lifecycle or import probe) stay the lab's: :meth:`LabCalibration.simulator` maps them onto the cluster model."""
    by = {r.get("probe"): r for r in probes}
    # ring_move_restarts_op: a plain ring op moving to INA finishes (with 4 members whenever 4 % of it is done), so no
    # progress is lost. The model then moves at once: optimistic by the op's rest x (1 - 1/INA's speed-up), <= 4 % of
    # an op here.
    fields: dict[str, Any] = {"payload_bytes": wire.INA_DATA_LEN, "frame_bytes": wire.INA_FRAME_LEN, "source": source,
                              "propagation_rtt_us": rtt_ms * 1000, "ring_move_restarts_op": False}
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
    # The median of every window probe's excess over the added round trip and the frames' serialization, which may
    # be <= 0 (htb's burst lets a window that does not fill the link leave without waiting its serialization): a
    # median <= 0 resolves no software round trip, and the unshaped one-slot probe's stands.
    rtts = [v for v in (_window_rtt_us(r, rtt_ms) for r in probes if r.get("probe") == WINDOW_PROBE) if v is not None]
    if rtts and median(rtts) > 0:
        fields["ina_rtt_us"] = median(rtts)
    lat = by.get("ring-latency")
    if lat and lat.get("seconds_median"):
        n = int(lat.get("workers", 2))
        fields["ring_step_latency_us"] = float(lat["seconds_median"]) / (2 * (n - 1)) * 1e6
    if ring_goodput:
        fields["ring_goodput_fraction"] = float(ring_goodput)
    # The ring probe on the experiment's links: its fitted step (one measurement of overhead and per-byte cost) replaces
    # the goodput given above and adds the overhead; the per-byte cost as a share of the link rate (at most 1).
    ring_rows = [r for r in probes if r.get("probe") == RING_PROBE and r.get("bw_mbps")]
    fit = ring_step_fit(ring_rows)
    if fit is not None:
        fields["ring_step_overhead_us"] = fit[0] * 1e6
        fields["ring_goodput_fraction"] = ring_goodput_share(fit[1], float(ring_rows[0]["bw_mbps"]))
    lab: dict[str, float] = {}
    startup = by.get(STARTUP_PROBE)
    if startup and startup.get("cpu_s_median") and startup.get("cores"):
        lab = {"agent_startup_cpu_s": float(startup["cpu_s_median"]), "shared_cores": float(startup["cores"])}
    # An agent's whole life (start, register, grant, exit) measured on the trace's star, when taken: its median
    # replaces the import's lower bound.
    lives = [r for r in probes if r.get("probe") == LIFECYCLE_PROBE and r.get("cpu_s_per_agent") and r.get("cores")]
    if lives:
        lab = {"agent_startup_cpu_s": median([float(r["cpu_s_per_agent"]) for r in lives]),
               "shared_cores": float(lives[0]["cores"])}
    sharing = Calibration(**fields)
    # Each shared probe's capacity from its CPU accounting (its CPU per gradient and the cores left to it), else the
    # model inverted on its rate; the median over the repetitions.
    caps = [c for c in (shared_capacity_from_cpu(r) or shared_capacity_of(sharing, r) for r in probes
                        if r.get("probe") == SHARED_PROBE and r.get("gradients_per_s")) if c is not None]
    if caps:
        fields["switch_shared_pps"] = median(caps)
    return LabCalibration(model=Calibration(**fields), **lab)


def _window_rtt_us(window: Mapping[str, Any], rtt_ms: float) -> float | None:
    """``ina_rtt_us`` from one ``ina-window`` row: ina-sim's INA time with s slots is chunks x W / s + W (the last
    result's round trip), W less the added round trip and one frame's serialization each way (<= 0: none resolved)."""
    if not window.get("seconds_median") or not window.get("slots"):
        return None
    chunks = math.ceil(float(window["bytes"]) / wire.INA_DATA_LEN)
    round_trip_us = float(window["seconds_median"]) / (chunks / int(window["slots"]) + 1) * 1e6
    bw = window.get("bw_mbps")
    serialization_us = 2 * wire.INA_FRAME_LEN * 8 / (float(bw) * 1e6) * 1e6 if bw else 0.0
    return round_trip_us - rtt_ms * 1000 - serialization_us


SHARED_OWN_OVERHEAD = ("controller_cores", "runner_cores", "irq_cores")  # the measurement's own work besides its data path
SHARED_BACKGROUND = ("others_cores", "steal_cores")  # what other processes and the hypervisor took meanwhile


def shared_cpu_per_gradient(row: Mapping[str, Any]) -> float | None:
    """CPU-seconds one gradient packet costs the shared probe's agents and switch together (its conditions' agents
    and switch cores over its gradients/s); None without the accounting."""
    cond = row.get("conditions") or {}
    rate, cpu = row.get("gradients_per_s"), (cond.get("agents_cores") or 0.0) + (cond.get("switch_cores") or 0.0)
    return cpu / float(rate) if rate and cpu > 0 else None


def shared_capacity_from_cpu(row: Mapping[str, Any]) -> float | None:
    """``switch_shared_pps`` from an ``ina-shared-pps`` row's CPU accounting: the cores left to the agents and the
    switch (the machine's cores less the measurement's own controller, runner and interrupt work and the background
    it measured: other processes, steal) over what one gradient costs them (:func:`shared_cpu_per_gradient`).

    Unlike the probe's rate (which its links bound whenever the cores are not saturated, and which a moment's
    background moves: 4.2k-5.3k gradients/s over three probes, one with the hypervisor taking 0.4 cores), the CPU
    per gradient is a property of the data path (269-297 us over the same probes, 271-296 us over another run's), so every
    probe gives the ceiling, saturated or not. None without the accounting (older rows: the model inverted)."""
    cond = row.get("conditions") or {}
    per = shared_cpu_per_gradient(row)
    cores = cond.get("cores")
    if per is None or not cores:
        return None
    left = float(cores) - sum(float(cond.get(k) or 0.0) for k in SHARED_OWN_OVERHEAD + SHARED_BACKGROUND)
    return left / per if left > 0 else None


def shared_cpu_summary(row: Mapping[str, Any]) -> dict:
    """A shared-ceiling probe's CPU per gradient (us) and the capacity it gives, for the summary ({} for others)."""
    if row.get("probe") != SHARED_PROBE:
        return {}
    per = shared_cpu_per_gradient(row)
    return {"cpu_us_per_gradient": None if per is None else per * 1e6, "capacity_from_cpu": shared_capacity_from_cpu(row)}


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


@dataclass(frozen=True)
class LabCalibration:
    """What the testbed's probes measured: the cluster model's constants, and the testbed's own, which ina-sim gets
    mapped onto its cluster (:meth:`simulator`): the testbed runs the switch and every agent on one machine, so an
    agent's start-up takes part of the switch's capacity."""

    model: Calibration = setting(factory=Calibration, doc="the time model's constants as measured (ina-sim's [calibration])")
    agent_startup_cpu_s: float = setting(0.0, "CPU-seconds one agent's start-up takes (agent-lifecycle-cpu probe; the "
                                              "agent's import, agent-startup-cpu, is its lower bound)")
    shared_cores: float = setting(0.0, "cores the switch shares with the agents: the machine's (0: none shared)")

    def simulator(self) -> Calibration:
        """ina-sim's calibration: an agent's start-up CPU over the shared cores is that share of the switch's capacity
        for the start-up's length, ``worker_startup_packets`` = CPU-seconds x switch_shared_pps / cores."""
        capacity = self.model.switch_shared_pps
        if not (self.agent_startup_cpu_s and self.shared_cores and capacity):
            return self.model
        packets = self.agent_startup_cpu_s * capacity / self.shared_cores
        return dataclasses.replace(self.model, worker_startup_packets=packets)


def write_calibration(lab: LabCalibration, path: Path) -> Path:
    """The calibration ina-sim reads (``ina-sim run --config PATH``: its [calibration] table), the lab's own
    measurements in its header."""
    path.write_text(f"# {lab.model.source}\n# agent start-up {lab.agent_startup_cpu_s:g} CPU-s on {lab.shared_cores:g} "
                    f"shared cores\n[calibration]\n{to_toml(lab.simulator())}")
    return path


def read_calibration(path: Path) -> Calibration:
    """A calibration file as :func:`write_calibration` writes it (any ina-sim configuration: its [calibration])."""
    return load(SimConfig, path).calibration
