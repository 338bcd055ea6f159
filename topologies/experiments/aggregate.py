"""Turning agents' JSON results into rows and rows into figures: pure functions, no testbed needed.

An all-reduce is finished when its slowest worker has the result, so a call's time is the maximum over
the workers of that call's time (``ina-agent allreduce`` reports ``seconds``, one per timed call).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from inaproto import wire

__all__ = [
    "ETH_TCP_FRAME",
    "RING_WIRE_PER_SEGMENT",
    "TCP_ACK_FRAME",
    "TCP_PAYLOAD",
    "TCP_SEGMENTS_PER_ACK",
    "allreduce_row",
    "bdp_slots",
    "framed_ina_ring_ratio",
    "group_by",
    "ideal_ina_ring_ratio",
    "ina_wire_seconds",
    "median",
    "per_call_max",
    "ring_wire_seconds",
    "slot_model_seconds",
    "spread",
    "window_rtt_seconds",
]

# A full TCP segment on the wire: 1500-byte MTU + 14 Ethernet; 1448 bytes of payload with timestamps.
ETH_TCP_FRAME = 1514
TCP_PAYLOAD = 1448
# Every ring link carries data one way per direction *and* the ACKs of the other direction's data: a pure
# ACK is 66 bytes (Ethernet 14, IPv4 20, TCP 20 + timestamps 12) and Linux acknowledges every second full
# segment. So a ring link's direction spends RING_WIRE_PER_SEGMENT bytes of wire per 1448 payload bytes
# (measured on a 2 Mbit/s htb veth: 181 data frames and 90 ACKs per 256 KiB each way; docs/experiments.md, "The ring's wire time"); INA frames need no ACKs.
TCP_ACK_FRAME = 66
TCP_SEGMENTS_PER_ACK = 2
RING_WIRE_PER_SEGMENT = ETH_TCP_FRAME + TCP_ACK_FRAME / TCP_SEGMENTS_PER_ACK


def median(values: Iterable[float]) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else None


def spread(values: Iterable[float]) -> tuple[float | None, float | None]:
    vals = [float(v) for v in values if v is not None]
    return (min(vals), max(vals)) if vals else (None, None)


def per_call_max(workers: Sequence[Mapping[str, Any]]) -> list[float]:
    """Time of each timed call: the slowest worker's (the all-reduce is done when every worker has it)."""
    lists = [list(w.get("seconds", [])) for w in workers]
    if not lists or not all(lists):
        return []
    k = min(len(x) for x in lists)
    return [max(x[i] for x in lists) for i in range(k)]


def allreduce_row(results: Sequence[Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    """One row from every worker's ``ina-agent allreduce`` JSON: per-call times, median, goodput, counters.

    ``goodput_mbps`` is the tensor's bytes per second of the median call (what each worker gets summed),
    in Mbit/s. ``exact`` is True when every worker checked its result and found it exact, None when no
    worker checked.
    """
    workers = results
    calls = per_call_max(workers)
    med = median(calls)
    nbytes = int(workers[0].get("bytes", 4 * int(workers[0].get("elements", 0)))) if workers else 0
    stats = [w.get("stats", {}) or {} for w in workers]
    checks = [w.get("check") for w in workers]
    exact: bool | None
    if all(c is None for c in checks):
        exact = None
    else:
        exact = all(_check_ok(c) for c in checks)
    row = {
        **extra,
        "granted_backend": sorted({str(w.get("backend")) for w in workers}),
        "elements": int(workers[0].get("elements", 0)) if workers else 0,
        "bytes": nbytes,
        "seconds": calls,
        "seconds_median": med,
        "seconds_min": min(calls) if calls else None,
        "seconds_max": max(calls) if calls else None,
        "goodput_mbps": (nbytes * 8 / med / 1e6) if med else None,
        "retransmits": sum(int(s.get("retransmits", 0)) for s in stats),
        "spurious_resends": sum(int(s.get("spurious_resends", 0)) for s in stats),
        "early_resends": sum(int(s.get("early_resends", 0)) for s in stats),
        "timeouts": sum(int(s.get("timeouts", 0)) for s in stats),
        "packets_sent": sum(int(s.get("packets_sent", 0)) for s in stats),
        "resyncs": sum(int(s.get("resyncs", 0)) for s in stats),
        "exact": exact,
        # Round trips (a chunk's turnaround waits for every worker): the slowest worker's shortest, the workers'
        # median smoothed one (the median: one worker's last window, stalled, does not speak for the job).
        "path_rtt_s": max((float(s.get("path_rtt_s") or 0) for s in stats), default=0.0) or None,
        "srtt_s": median(v for v in (float(s.get("srtt_s") or 0) for s in stats) if v > 0),
    }
    if len(row["granted_backend"]) == 1:
        row["granted_backend"] = row["granted_backend"][0]
    return row


def _check_ok(check: Any) -> bool:
    if isinstance(check, Mapping):
        for key in ("exact", "ok", "passed"):
            if key in check:
                return bool(check[key])
        return False
    return bool(check)


def ideal_ina_ring_ratio(n: int) -> float:
    """INA time / ring time counting payload bytes only: each worker moves B with INA, 2(n-1)/n B with ring."""
    return n / (2 * (n - 1)) if n > 1 else float("nan")


def framed_ina_ring_ratio(n: int, frame: int = wire.INA_FRAME_LEN, payload: int = wire.INA_DATA_LEN) -> float:
    """The same ratio counting frames on the wire: INA carries ``payload`` bytes per ``frame`` (128 in
    184), ring full TCP segments (1448 in 1514) plus half an ACK each (``RING_WIRE_PER_SEGMENT``)."""
    if n <= 1:
        return float("nan")
    return (frame / payload) / (2 * (n - 1) / n * RING_WIRE_PER_SEGMENT / TCP_PAYLOAD)


def ina_wire_seconds(nbytes: int, link_mbps: float, frame: int = wire.INA_FRAME_LEN, payload: int = wire.INA_DATA_LEN) -> float:
    """Time an INA all-reduce of ``nbytes`` needs on a link of ``link_mbps`` (each worker sends its whole tensor)."""
    chunks = math.ceil(nbytes / payload)
    return chunks * frame * 8 / (link_mbps * 1e6)


def ring_wire_seconds(nbytes: int, n: int, link_mbps: float) -> float:
    """Time a ring all-reduce of ``nbytes`` over ``n`` workers needs on links of ``link_mbps``: 2(n-1)/n of the
    tensor each way per link in full TCP segments, with the ACKs of the other way's data (``RING_WIRE_PER_SEGMENT``)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes * RING_WIRE_PER_SEGMENT / TCP_PAYLOAD * 8 / (link_mbps * 1e6)


def window_rtt_seconds(rtt_ms: float, link_mbps: float, frame: int = wire.INA_FRAME_LEN) -> float:
    """The round trip one INA slot waits for: the added propagation round trip plus one frame's serialization
    on the way up (worker link) and one on the way down (the switch's egress to the worker)."""
    return rtt_ms / 1000 + 2 * frame * 8 / (link_mbps * 1e6)


def bdp_slots(rtt_ms: float, link_mbps: float, frame: int = wire.INA_FRAME_LEN) -> float:
    """The bandwidth-delay product in slots (frames): how many chunks fill the window round trip at line rate."""
    return window_rtt_seconds(rtt_ms, link_mbps, frame) * link_mbps * 1e6 / (frame * 8)


def slot_model_seconds(nbytes: int, slots: float, rtt_ms: float, link_mbps: float, round_trip_s: float | None = None) -> float:
    """SwitchML's pool-size curve: max(framed wire time, chunks x RTT / slots). RTT is ``round_trip_s`` when given
    (a measured round trip), else the nominal one of ``rtt_ms`` (``window_rtt_seconds``)."""
    chunks = math.ceil(nbytes / wire.INA_DATA_LEN)
    rtt = round_trip_s if round_trip_s is not None else window_rtt_seconds(rtt_ms, link_mbps)
    return max(ina_wire_seconds(nbytes, link_mbps), chunks * rtt / slots)


def group_by(rows: Iterable[Mapping[str, Any]], *keys: str) -> dict[tuple, list[Mapping[str, Any]]]:
    out: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return out
