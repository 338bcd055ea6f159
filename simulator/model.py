"""Iteration-time model: compute time plus the all-reduce time of the backend a job gets.

Every formula here is written out, with the origin of its constants, in docs/simulation.md. Rates are
payload bytes per second, times are seconds, ``nbytes`` is the gradient size of one iteration.

    window rtt    W = rtt + propagation + 2 * frame / host   (one frame's serialization up and down)
    INA rate      R_ina(s, m) = min(host * payload/frame, s * payload / W, switch_pps * payload / m)
    INA (1 rack)  t = B / R_ina + W
    ring          t = 2(n-1)/n * B / R + 2(n-1) * (step_latency + propagation),  R = goodput of the slowest link
    Rina          t = 2(r-1)/r * B / min(R_cross, R_ina) + 2(r-1) * (step_latency + propagation) + W   (r racks)
    tree          W_tree = 2 (rtt + propagation) + 2 frame / host + 2 frame / uplink   (worker - ToR - spine and back)
                  R_tree = min(R_ina of every ToR and of the spine with W_tree, uplink share * payload/frame)
                  t = B / R_tree + 2 (rtt + propagation)

shared switch  software rtt x 1 / (1 - rho), rho = sum over the switch's jobs of m_j * R_j / payload / shared_pps
start-up load  a job starting on the switch's cores takes u_j = m_j * startup_cpu / (startup_s * cores) of
               shared_pps while it starts: the others see shared_pps * (1 - sum u_j) (at least 5 %)
congestion     delay target T = W0 + max(allowance, share * W0), W0 = the unloaded window rtt: when the shared
window         switch's stretch would hold round trips above T, the windows shrink until W = T, i.e. the load
               settles at rho* = 1 - rtt / (T - propagation - serialization) and the jobs share rho* * shared_pps
               max-min fairly (equal windows, one round trip), each at most its own bound at W = T

Without a shared switch the congestion window changes nothing here: it settles near the window that reaches
line rate, and slots beyond it add nothing either (the min above).
    iteration     t = compute + (1 - overlap) * t_comm
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from simulator.calibration import Calibration

__all__ = [
    "window_rtt",
    "ina_rate",
    "ina_time",
    "ring_time",
    "rina_time",
    "saturating_slots",
    "offered_pps",
    "shared_stretch",
    "shared_stretches",
    "shared_throughput",
    "startup_load",
    "shared_capacity",
    "tree_window_rtt",
    "tree_time",
    "uplink_bytes",
    "min_useful_slots",
    "compute_time",
    "iteration_time",
]


def window_rtt(cal: Calibration, host_Bps: float | None = None, stretch: float = 1.0) -> float:
    """The round trip a slot is held: the measured software round trip (x `stretch` on a loaded shared switch,
    see shared_stretch), the propagation round trip, and one frame's serialization on the worker's link each
    way (nothing when the link rate is unknown)."""
    serialization = 2 * cal.frame_bytes / host_Bps if host_Bps else 0.0
    return cal.ina_rtt_s * stretch + cal.propagation_rtt_s + serialization


def tree_window_rtt(cal: Calibration, host_Bps: float | None = None, uplink_Bps: float | None = None) -> float:
    """The round trip a slot of a two-level tree is held: worker to ToR to spine and back. The ToR-spine hop is
    taken to cost what the worker-ToR hop costs (software round trip and propagation), plus one frame's
    serialization each way on the uplink."""
    uplink = 2 * cal.frame_bytes / uplink_Bps if uplink_Bps else 0.0
    return window_rtt(cal, host_Bps) + cal.ina_rtt_s + cal.propagation_rtt_s + uplink


def tree_time(cal: Calibration, nbytes: float, rate: float) -> float:
    """One all-reduce through a two-level tree at `rate`: the last result returns one tree round trip later."""
    return nbytes / rate + 2 * (cal.ina_rtt_s + cal.propagation_rtt_s)


def uplink_bytes(cal: Calibration, backend: str, nbytes: float, workers_per_rack: Sequence[int]) -> float:
    """Bytes one all-reduce puts on each of a job's rack uplinks, each direction (`workers_per_rack`: the job's
    workers in each of its racks).

    tree: one framed partial sum per rack up, the final sum down: B * frame / payload, whatever the workers.
    Rina: the racks' ring moves 2(r-1)/r * B through every rack's uplink.
    ring: the workers' ring enters and leaves each rack once, and every hop carries 2(n-1)/n * B.
    One rack: nothing."""
    racks = [c for c in workers_per_rack if c > 0]
    if len(racks) < 2:
        return 0.0
    if backend == "tree":
        return nbytes * cal.frame_bytes / cal.payload_bytes
    if backend == "rina":
        r = len(racks)
        return 2 * (r - 1) / r * nbytes
    n = sum(racks)
    return 2 * (n - 1) / n * nbytes


def ina_rate(cal: Calibration, host_Bps: float, slots: int, workers_in_rack: int, window: float | None = None) -> float:
    """Aggregated payload rate of one job through one switch with `slots` slots.

    Three bounds: the link carries frames but only payload counts (payload/frame); a window of
    `slots` packets is in flight per round trip (SwitchML's bound: each slot holds one packet until
    its result returns); a packet-rate-bound switch processes m packets per aggregated payload.
    """
    window = window_rtt(cal, host_Bps) if window is None else window
    rate = min(host_Bps * cal.ina_efficiency, slots * cal.payload_bytes / window)
    if cal.switch_pps is not None:
        rate = min(rate, cal.switch_pps * cal.payload_bytes / max(1, workers_in_rack))
    return rate


def offered_pps(cal: Calibration, rate: float, workers_in_rack: int) -> float:
    """Gradient packets per second a job sends into one switch at payload rate `rate`: one per worker per chunk."""
    return max(0, workers_in_rack) * rate / cal.payload_bytes


MIN_SHARED_SHARE = 0.05  # the least share of a shared switch that starting agents leave to running jobs


def startup_load(cal: Calibration, workers: int, startup_s: float) -> float:
    """The share of a shared switch's capacity a job's `workers` agents take while they start (over
    `startup_s`): their start-up CPU over the cores they share with the switch. 0 without shared cores."""
    if not cal.shared_cores or not cal.agent_startup_cpu_s or startup_s <= 0:
        return 0.0
    return workers * cal.agent_startup_cpu_s / (startup_s * cal.shared_cores)


def _capacity(cal: Calibration, background: float) -> float | None:
    """The shared capacity left to running jobs while starting agents take `background` of it."""
    cap = cal.switch_shared_pps
    return None if cap is None else cap * max(MIN_SHARED_SHARE, 1.0 - background)


def shared_stretch(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]],
                   background: float = 0.0) -> float:
    """How much the software round trip stretches on a switch shared by `jobs` ((slots, workers) each).

    The switch and, on the testbed, the CPUs it shares with the agents form one processor-sharing server of
    `switch_shared_pps` gradient packets/s. At load rho (offered / capacity) the software part of every
    round trip takes ina_rtt / (1 - rho) (the response time of a processor-sharing queue), which lowers each
    job's window-bound rate, which lowers the load: rho is the fixed point rho = sum_j m_j R_j(rho) / payload
    / capacity, found by bisection (the right side falls as rho grows, to 0 at rho = 1, so the load never
    reaches the capacity). 1.0 without a shared capacity. `background`: the share of the capacity starting
    agents take (startup_load)."""
    cap = _capacity(cal, background)
    if cap is None or not jobs:
        return 1.0

    def load(rho: float) -> float:
        window = window_rtt(cal, host_Bps, 1.0 / (1.0 - rho))
        return sum(offered_pps(cal, ina_rate(cal, host_Bps or math.inf, s, m, window), m) for s, m in jobs) / cap

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if load(mid) > mid:
            lo = mid
        else:
            hi = mid
    return 1.0 / (1.0 - (lo + hi) / 2)


def cwnd_target(cal: Calibration, host_Bps: float | None = None) -> float | None:
    """The congestion window's delay target: the unloaded window round trip plus the queueing the sender
    tolerates (max(allowance, share x that round trip)); None without a congestion window."""
    allowance = cal.cwnd_queue_allowance_s
    if allowance is None:
        return None
    path = window_rtt(cal, host_Bps)
    return path + max(allowance, cal.cwnd_allowance_share * path)


def shared_stretches(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]],
                     background: float = 0.0) -> list[float]:
    """Per job of `jobs` ((slots, workers) each, on one shared switch): the stretch of its software round trip
    that gives its rate through ``window_rtt(cal, host_Bps, stretch)`` and ``ina_rate``.

    Without a congestion window (or while the processor-sharing round trip stays within its delay target) this
    is shared_stretch for every job. Above the target the senders' windows shrink until round trips sit at
    the target T: the load settles at rho* = 1 - rtt / (T - propagation - serialization), and the jobs share
    rho* x capacity max-min fairly (AIMD converges to equal windows; every job sees the same round trip),
    each at most its own bound at W = T (line, window, switch_pps). A job then keeps fewer chunks in flight
    than it holds slots: its stretch is that of the window round trip s x payload / rate ("the time a slot is
    held", slots it does not use included). `background`: as for shared_stretch."""
    stretch = shared_stretch(cal, host_Bps, jobs, background)
    target = cwnd_target(cal, host_Bps)
    cap = _capacity(cal, background)
    if cap is None or target is None or not jobs or window_rtt(cal, host_Bps, stretch) <= target:
        return [stretch] * len(jobs)
    fixed = target - cal.propagation_rtt_s - (window_rtt(cal, host_Bps) - cal.ina_rtt_s - cal.propagation_rtt_s)
    rho = max(0.0, 1.0 - cal.ina_rtt_s / fixed)
    bounds = [ina_rate(cal, host_Bps or math.inf, s, m, target) for s, m in jobs]
    level = _water_level(bounds, [m / cal.payload_bytes for _, m in jobs], rho * cap)
    out = []
    for (s, _), bound in zip(jobs, bounds):
        rate = min(bound, level)
        held = s * cal.payload_bytes / rate if rate > 0 else math.inf
        out.append((held - (window_rtt(cal, host_Bps) - cal.ina_rtt_s)) / cal.ina_rtt_s)
    return out


def _water_level(bounds: Sequence[float], weights: Sequence[float], total: float) -> float:
    """The level L with sum_j weights_j * min(bounds_j, L) = total (max-min fair shares); inf if the bounds fit."""
    if sum(w * b for w, b in zip(weights, bounds)) <= total:
        return math.inf
    lo, hi = 0.0, max(bounds)
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(w * min(b, mid) for w, b in zip(weights, bounds)) > total:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def shared_throughput(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]]) -> float:
    """Gradient packets/s the switch takes from `jobs` running together (the model's shared_stretches)."""
    total = 0.0
    for (s, m), stretch in zip(jobs, shared_stretches(cal, host_Bps, jobs)):
        window = window_rtt(cal, host_Bps, stretch)
        total += offered_pps(cal, ina_rate(cal, host_Bps or math.inf, s, m, window), m)
    return total


def shared_capacity(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]],
                    measured_pps: float) -> float | None:
    """The ``switch_shared_pps`` with which the model gives `measured_pps` for `jobs` run together (the inverse
    of shared_throughput in the capacity): what a ceiling probe measured is the capacity less what the
    congestion window and the windows leave unused. None when the jobs' own bounds (line, windows) already
    explain the measurement (within 2 %): the probe did not reach the shared ceiling."""
    unbounded = shared_throughput(dataclasses.replace(cal, switch_shared_pps=None), host_Bps, jobs)
    if not measured_pps > 0 or measured_pps >= 0.98 * unbounded:
        return None
    lo, hi = measured_pps, measured_pps
    while shared_throughput(dataclasses.replace(cal, switch_shared_pps=hi), host_Bps, jobs) < measured_pps:
        hi *= 2
        if hi > 1e4 * measured_pps:
            return None
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if shared_throughput(dataclasses.replace(cal, switch_shared_pps=mid), host_Bps, jobs) < measured_pps:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def ina_time(cal: Calibration, nbytes: float, rate: float) -> float:
    """One all-reduce through one switch: stream B bytes up at `rate`, the last result returns one round trip
    (software and propagation) later."""
    return nbytes / rate + cal.ina_rtt_s + cal.propagation_rtt_s


def ring_time(cal: Calibration, nbytes: float, workers: int, rate: float) -> float:
    """Ring all-reduce among `workers`: 2(n-1) steps of B/n bytes each over the slowest link."""
    if workers <= 1:
        return 0.0
    n = workers
    return 2 * (n - 1) / n * nbytes / rate + 2 * (n - 1) * (cal.ring_step_latency_s + cal.propagation_rtt_s)


def rina_time(cal: Calibration, nbytes: float, racks: int, rate: float) -> float:
    """Rina: each rack's ToR aggregates its workers in-network, the r racks form one ring.

    `rate` is min(cross-rack goodput, the slowest rack's INA rate): each ring step is an in-rack
    aggregation pipelined with a cross-rack transfer. With r = 1 this is plain INA.
    """
    if racks <= 1:
        return ina_time(cal, nbytes, rate)
    r = racks
    return (2 * (r - 1) / r * nbytes / rate + 2 * (r - 1) * (cal.ring_step_latency_s + cal.propagation_rtt_s)
            + cal.ina_rtt_s + cal.propagation_rtt_s)


def saturating_slots(cal: Calibration, rate: float, host_Bps: float | None = None) -> int:
    """Slots whose window reaches `rate`: the bandwidth-delay product in packets, ceil(rate * W / payload)."""
    return max(1, math.ceil(rate * window_rtt(cal, host_Bps) / cal.payload_bytes - 1e-9))


def min_useful_slots(cal: Calibration, requested: int, slot_time, ring: float) -> int | None:
    """Smallest slot count s <= requested whose INA/Rina time slot_time(s) is no worse than `ring`.

    None when even `requested` slots lose to ring: a job then asks for no slots at all. slot_time must
    be non-increasing in s (it is: more slots never lower the window bound), so this bisects.
    """
    if slot_time(requested) > ring:
        return None
    lo, hi = 1, requested
    while lo < hi:
        mid = (lo + hi) // 2
        if slot_time(mid) <= ring:
            hi = mid
        else:
            lo = mid + 1
    return lo


def compute_time(per_worker: Sequence[float], data_split: str) -> float:
    """Compute time of one synchronous iteration.

    ``equal``: every worker gets 1/n of the batch, the slowest finishes last: max(c_i).
    ``proportional``: data in proportion to speed (static allocation of the heterogeneous-cluster
    paper), all finish together: n / sum(1 / c_i). c_i is worker i's time for an equal 1/n share.
    """
    if len(per_worker) == 1:
        return per_worker[0]
    if data_split == "equal":
        return max(per_worker)
    if data_split == "proportional":
        if min(per_worker) <= 0:
            return 0.0
        return len(per_worker) / sum(1.0 / c for c in per_worker)
    raise ValueError(f"unknown data split {data_split!r}; valid: equal, proportional")


def iteration_time(cal: Calibration, compute: float, comm: float) -> float:
    return compute + (1.0 - cal.comm_overlap) * comm
