"""A switch shared by several INA jobs: its processing as one server, the senders' congestion window on it, and
jobs in their start-up taking part of it.

Formulas (docs/simulation.md, "The time model"); a = ina_rtt, P = propagation + serialization,
W(rho) = a / (1 - rho) + P the window round trip at load rho, C = switch_shared_pps:

    processor sharing  rho = sum_j m_j R_j(W(rho)) / payload / C, a fixed point (shared_stretch)
    start-up load      a starting job takes u_j = (m_j w + g_j) / (startup_s_j C) of C: w the packets' worth one
                       worker's start-up takes (worker_startup_packets), g_j the gradient packets of the all-reduces
                       it runs within its start-up (startup_load)
    congestion window  job j's delay target T_j = path_j + max(allowance, share x path_j), path_j the path's
                       unloaded round trip, or with cwnd_latecomer the shortest round trip the job has seen; where
                       W would exceed targets, the windows settle (shared_state)

The congestion window's equilibrium with per-job targets: a job whose target is below the round trip shrinks to
its minimum window, one whose target is above it grows to its grant, and the round trip settles at the target of
the jobs in between (at W* = T_k: rho* = 1 - a / (T_k - P), those jobs share what the others leave of rho* C,
max-min fairly), or between two targets (no job at its target: the fixed point with the windows so fixed). A
latecomer that first saw a loaded switch has a higher target than a job that saw it idle, and takes more: the
unfairness of delay-based congestion control (TCP Vegas, LEDBAT). The agents' congestion window does not show
it (jobs started staggered share equally: docs/experiments.md), so the engine gives every job the unloaded
path's target unless the calibration's cwnd_latecomer asks for per-job targets.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.calibration import Calibration
from simulator.model import ina_rate, offered_pps, window_rtt

__all__ = [
    "SharedState",
    "cwnd_target",
    "shared_capacity",
    "shared_state",
    "shared_stretch",
    "shared_stretches",
    "shared_throughput",
    "startup_load",
    "startup_share",
]

MIN_SHARED_SHARE = 0.05  # the least share of a shared switch that starting jobs leave to running jobs


@dataclass(frozen=True)
class SharedState:
    """The switch's steady state for its jobs: per job the stretch of its software round trip that gives its rate
    through ``window_rtt(cal, host_Bps, stretch)`` and ``ina_rate`` (the time a slot is held, slots the congestion
    window leaves unused included), and the round trip every job sees (what its congestion window measures)."""

    stretches: tuple[float, ...]
    rtt: float


def startup_load(cal: Calibration, workers: int, startup_s: float, gradients: float = 0.0) -> float:
    """The share of a shared switch's capacity a starting job takes over its start-up (`startup_s`): its `workers`
    workers' start-up (``worker_startup_packets`` each) and the `gradients` packets it sends meanwhile (a warm-up
    all-reduce: workers x chunks each), over the capacity. 0 without a shared capacity."""
    if startup_s <= 0 or not cal.switch_shared_pps:
        return 0.0
    share = 0.0
    if cal.worker_startup_packets:
        share += workers * cal.worker_startup_packets / (startup_s * cal.switch_shared_pps)
    if gradients > 0:
        share += gradients / (startup_s * cal.switch_shared_pps)
    return share


def startup_share(cal: Calibration, starting: float, starting_workers: int, running_pps: float,
                  running_claims: int) -> float:
    """The share of a shared switch's capacity starting workers take from the running jobs, with the capacity shared
    max-min fairly among its claimants rather than in proportion to demand: a running job's worker, which waits
    between packets, gets what it asks while that is below an equal share, and the start-up takes the rest.

    `starting`: what the starting jobs ask, as a share of the capacity (startup_load summed), spread over
    `starting_workers`; `running_pps`: what the running jobs offer at their own bounds, spread over `running_claims`
    (their workers and the switch's own work). The running jobs lose capacity only where their claimants' demand
    exceeds the level the capacity is shared out at (water-filling); with ``startup_fair_share`` false, the whole
    of `starting`."""
    if not cal.startup_fair_share or starting <= 0 or not cal.switch_shared_pps:
        return starting
    run = running_pps / cal.switch_shared_pps  # the running jobs' demand as a share of the capacity
    if run + starting <= 1.0 or running_claims <= 0:
        return starting if run + starting <= 1.0 else min(starting, 1.0)
    start_each, run_each = starting / max(1, starting_workers), run / running_claims
    lo, hi = 0.0, 1.0  # the level each claimant gets at most: sum of min(demand, level) = 1
    for _ in range(60):
        level = (lo + hi) / 2
        used = running_claims * min(run_each, level) + max(1, starting_workers) * min(start_each, level)
        lo, hi = (level, hi) if used < 1.0 else (lo, level)
    return max(1, starting_workers) * min(start_each, (lo + hi) / 2)


def _capacity(cal: Calibration, background: float) -> float | None:
    """The shared capacity left to running jobs while starting jobs take `background` of it."""
    cap = cal.switch_shared_pps
    return None if cap is None else cap * max(MIN_SHARED_SHARE, 1.0 - background)


def _fixed_point(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]], cap: float) -> float:
    """The processor-sharing stretch 1 / (1 - rho) for `jobs` ((window, workers) each) at capacity `cap`."""
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


def shared_stretch(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]],
                   background: float = 0.0) -> float:
    """How much the software round trip stretches on a switch shared by `jobs` ((slots, workers) each), every
    job keeping its whole grant in flight (no congestion window).

    The switch (with whatever processors it shares with its hosts) is one processor-sharing server of
    `switch_shared_pps` gradient packets/s. At load rho (offered / capacity) the software part of every
    round trip takes ina_rtt / (1 - rho) (the response time of a processor-sharing queue), which lowers each
    job's window-bound rate, which lowers the load: rho is the fixed point rho = sum_j m_j R_j(rho) / payload
    / capacity, found by bisection (the right side falls as rho grows, to 0 at rho = 1, so the load never
    reaches the capacity). 1.0 without a shared capacity. `background`: the share of the capacity starting
    jobs take (startup_load)."""
    cap = _capacity(cal, background)
    if cap is None or not jobs:
        return 1.0
    return _fixed_point(cal, host_Bps, jobs, cap)


def cwnd_target(cal: Calibration, host_Bps: float | None = None, path: float | None = None) -> float | None:
    """The congestion window's delay target: `path` (the shortest round trip the sender has seen; default the
    unloaded window round trip) plus the queueing it tolerates (max(allowance, share x path)); None without a
    congestion window."""
    allowance = cal.cwnd_queue_allowance_s
    if allowance is None:
        return None
    path = window_rtt(cal, host_Bps) if path is None else path
    return path + max(allowance, cal.cwnd_allowance_share * path)


def least_window(cal: Calibration, host_Bps: float, slots: int, base: float) -> float:
    """The smallest window (chunks) a job's senders keep under a congestion cut: ``cwnd_min_window``, and with
    ``cwnd_floor_bdp`` the host link's bandwidth-delay product over the unloaded round trip ``base`` (the agent's
    floor, its highest recent delivery rate x the path's round trip, host_agent/congestion.py, is that BDP once
    a round has filled the link; a CPU-bound rate lowers the agent's floor with the rate, so no floor beyond
    cwnd_min_window without a host link); never more than the grant."""
    least = float(cal.cwnd_min_window)
    if cal.cwnd_floor_bdp and math.isfinite(host_Bps):
        least = max(least, host_Bps * cal.ina_efficiency * base / cal.payload_bytes)
    return min(float(slots), least)


def shared_state(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]], background: float = 0.0,
                 paths: Sequence[float | None] | None = None) -> SharedState:
    """The steady state of `jobs` ((slots, workers) each) on one shared switch (module docstring).

    `paths`: per job the shortest round trip its senders have seen (None: the unloaded round trip), which sets
    its congestion window's delay target. Without a congestion window, or while the round trip with every job at
    its grant stays within every target, every job's stretch is shared_stretch's."""
    a = cal.ina_rtt_s
    base = window_rtt(cal, host_Bps)
    fixed = base - a  # propagation and serialization: the part of W that does not stretch
    cap = _capacity(cal, background)
    if cap is None or not jobs:
        return SharedState((1.0,) * len(jobs), base)
    stretch = _fixed_point(cal, host_Bps, jobs, cap)
    rtt = window_rtt(cal, host_Bps, stretch)
    paths = list(paths) if paths is not None else [None] * len(jobs)
    targets = [cwnd_target(cal, host_Bps, p) for p in paths]
    if targets[0] is None or rtt <= min(targets):
        return SharedState((stretch,) * len(jobs), rtt)
    host = host_Bps or math.inf
    least = [least_window(cal, host, s, base) for s, _ in jobs]
    weights = [m / cal.payload_bytes for _, m in jobs]

    def held(rates: Sequence[float], level: float) -> SharedState:
        out = []
        for (s, _), r in zip(jobs, rates):
            slot_time = s * cal.payload_bytes / r if r > 0 else math.inf
            out.append((slot_time - fixed) / a)
        return SharedState(tuple(out), level)

    levels = sorted(set(targets), reverse=True)
    for level in levels:
        if level <= base:
            break
        budget = (1.0 - a / (level - fixed)) * cap
        low = [min(ina_rate(cal, host, s, m, level), n * cal.payload_bytes / level) for (s, m), n in zip(jobs, least)]
        high = [ina_rate(cal, host, s, m, level) for s, m in jobs]
        rates = [h if t > level else lo for t, h, lo in zip(targets, high, low)]
        free = [j for j, t in enumerate(targets) if t == level]
        floor = sum(w * r for w, r in zip(weights, rates))
        roof = floor + sum(weights[j] * (high[j] - low[j]) for j in free)
        if floor <= budget <= roof:  # the jobs at this target share what the others leave
            lo_l, hi_l = 0.0, max(high[j] for j in free)
            for _ in range(100):
                mid = (lo_l + hi_l) / 2
                total = sum(weights[j] * min(high[j], max(low[j], mid)) if j in free else weights[j] * rates[j]
                            for j in range(len(jobs)))
                lo_l, hi_l = (mid, hi_l) if total < budget else (lo_l, mid)
            for j in free:
                rates[j] = min(high[j], max(low[j], (lo_l + hi_l) / 2))
            return held(rates, level)
        if budget < floor:  # the round trip lies above this target: its jobs at their minimum window too
            windows = [(s if t > level else n, m) for (s, m), t, n in zip(jobs, targets, least)]
            st = _fixed_point(cal, host_Bps, windows, cap)
            w = window_rtt(cal, host_Bps, st)
            rates = [ina_rate(cal, host, s, m, w) for s, m in windows]
            return held(rates, w)
        # else the round trip lies below this target: its jobs at their grants, try the next lower one
    # below every target with every job at its grant: the plain fixed point (reached only through rounding)
    return SharedState((stretch,) * len(jobs), rtt)


def shared_stretches(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]],
                     background: float = 0.0, paths: Sequence[float | None] | None = None) -> list[float]:
    """Per job, the stretch of shared_state."""
    return list(shared_state(cal, host_Bps, jobs, background, paths).stretches)


def shared_throughput(cal: Calibration, host_Bps: float | None, jobs: Sequence[tuple[int, int]]) -> float:
    """Gradient packets/s the switch takes from `jobs` started together (every target from the unloaded round
    trip), as shared_state gives it."""
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
