"""Iteration-time model: compute time plus the all-reduce time of the backend a job gets.

Every formula here is written out, with the origin of its constants, in docs/simulation.md. Rates are
payload bytes per second, times are seconds, ``nbytes`` is the gradient size of one iteration.

    window rtt    W = rtt + propagation + 2 * frame / host   (one frame's serialization up and down)
    INA rate      R_ina(s, m) = min(host * payload/frame, s * payload / W, switch_pps * payload / m)
    INA (1 rack)  t = B / R_ina + W
    ring step     s(c, R) = step_latency + propagation + c / R                      (c = B/n bytes; no overhead measured)
                  s(c, R) = max(step_latency + propagation, step_overhead + c / R)  (ring_step_overhead_us measured)
    ring          t = 2(n-1) * s(B/n, R),  R = goodput of the slowest link
    Rina          t = 2(r-1) * s(B/r, min(R_cross, R_ina)) + W   (r racks)
    tree          W_tree = 2 (rtt + propagation) + 2 frame / host + 2 frame / uplink   (worker - ToR - spine and back)
                  R_tree = min(R_ina of every ToR and of the spine with W_tree, uplink share * payload/frame)
                  t = B / R_tree + 2 (rtt + propagation)

    iteration     t = compute + (1 - overlap) * t_comm
    shared switch simulator/shared_switch.py: processor sharing, the congestion window, jobs starting

Without a shared switch the congestion window changes nothing here: it settles near the window that reaches
line rate, and slots beyond it add nothing either (the min above).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.calibration import Calibration

__all__ = [
    "compute_time",
    "ina_rate",
    "ina_time",
    "iteration_time",
    "min_useful_slots",
    "offered_pps",
    "rina_time",
    "ring_step_time",
    "ring_time",
    "saturating_slots",
    "tree_time",
    "tree_window_rtt",
    "uplink_bytes",
    "window_rtt",
]


def window_rtt(cal: Calibration, host_Bps: float | None = None, stretch: float = 1.0) -> float:
    """The round trip a slot is held: the measured software round trip (x `stretch` on a loaded shared switch,
    see simulator.shared_switch), the propagation round trip, and one frame's serialization on the worker's link each
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


def ina_time(cal: Calibration, nbytes: float, rate: float) -> float:
    """One all-reduce through one switch: stream B bytes up at `rate`, the last result returns one round trip
    (software and propagation) later."""
    return nbytes / rate + cal.ina_rtt_s + cal.propagation_rtt_s


def ring_step_time(cal: Calibration, chunk_bytes: float, rate: float) -> float:
    """One ring step: a chunk of `chunk_bytes` to the right neighbour while one arrives from the left, at `rate`.

    A step cannot end before the neighbour's chunk has crossed the path (the software step latency and the
    propagation: a worker-to-worker hop crosses the switch). Without a measured ``ring_step_overhead_us`` that
    latency adds to the chunk's transfer (a ring that waits out every step on a link with no credit for its idle
    time). With it (the ring probe's fit at the calibration's link rate and delay), what the ring and the links
    really expose: the transfer plus that overhead, at least the path's latency (a shaper that banks the link's
    idle time while a step waits, or a pipelined ring, hides the latency behind the bytes)."""
    latency = cal.ring_step_latency_s + cal.propagation_rtt_s
    if cal.ring_step_overhead_us is None:
        return latency + chunk_bytes / rate
    return max(latency, cal.ring_step_overhead_us * 1e-6 + chunk_bytes / rate)


def ring_time(cal: Calibration, nbytes: float, workers: int, rate: float) -> float:
    """Ring all-reduce among `workers`: 2(n-1) steps of B/n bytes each over the slowest link."""
    if workers <= 1:
        return 0.0
    n = workers
    return 2 * (n - 1) * ring_step_time(cal, nbytes / n, rate)


def rina_time(cal: Calibration, nbytes: float, racks: int, rate: float) -> float:
    """Rina: each rack's ToR aggregates its workers in-network, the r racks form one ring.

    `rate` is min(cross-rack goodput, the slowest rack's INA rate): each ring step is an in-rack
    aggregation pipelined with a cross-rack transfer. With r = 1 this is plain INA.
    """
    if racks <= 1:
        return ina_time(cal, nbytes, rate)
    r = racks
    return 2 * (r - 1) * ring_step_time(cal, nbytes / r, rate) + cal.ina_rtt_s + cal.propagation_rtt_s


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
