"""Constants of the iteration-time model: the ``[calibration]`` table of ``ina-sim``'s configuration.

The defaults are order-of-magnitude values for a 100 Gbit/s datacenter rack with an ASIC switch and a
SwitchML-style packet format (32 int32 lanes = 128 B of payload per packet): assumptions, not measurements.
A testbed measures its own (topologies/experiments/calibrate.py writes them as a ``[calibration]`` table that
``ina-sim run --config FILE`` reads); docs/simulation.md says how each one enters the model. Link bandwidths
are not here: they describe the cluster (:class:`simulator.cluster.ClusterSpec`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

from inaproto.config import setting
from simulator.errors import SimulatorError

__all__ = ["Calibration", "CalibrationError"]


class CalibrationError(SimulatorError, ValueError):
    """A calibration that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Calibration:
    """Time-model constants; docs/simulation.md gives the formulas that use each one."""

    ina_rtt_us: float = setting(5.0, "round trip of one INA packet, worker -> switch -> worker, with both host stacks "
                                     "(us): slots x payload per round trip bounds INA's rate")
    payload_bytes: int = setting(128, "gradient payload per INA packet (bytes; 32 int32 lanes)")
    frame_bytes: int = setting(184, "bytes on the wire per INA packet: payload, INA header, UDP, IPv4, Ethernet")
    switch_pps: float | None = setting(None, "gradient packets/s one switch aggregates for one job (none: line rate)")
    switch_shared_pps: float | None = setting(
        None, "gradient packets/s one switch sustains over all its jobs, a processor-sharing server (none: no bound)")
    congestion_window: bool = setting(
        True, "the senders' congestion window backs off on a loaded shared switch (false: every job keeps its grant "
              "in flight)")
    cwnd_queue_allowance_us: float = setting(
        2000.0, "the congestion window's delay target: queueing tolerated above the unloaded round trip, at least (us)")
    cwnd_allowance_share: float = setting(0.25, "... or this share of the unloaded round trip, if larger")
    cwnd_min_window: int = setting(4, "the least window the senders keep (chunks)")
    cwnd_floor_bdp: bool = setting(
        True, "the window also stops at the host link's bandwidth-delay product over the unloaded round trip")
    cwnd_latecomer: bool = setting(
        False, "a job's delay target from the shortest round trip it has seen (a latecomer on a loaded switch takes "
               "more) rather than from the unloaded path")
    worker_startup_packets: float = setting(
        0.0, "gradient packets' worth of a shared switch's capacity one worker's start-up takes, spread over its "
             "job's start-up (where hosts share the switch's processors; 0: start-up takes nothing)")
    startup_fair_share: bool = setting(
        True, "starting workers and running jobs share a shared switch max-min fairly per worker (false: in "
              "proportion to what they ask)")
    ring_goodput_fraction: float = setting(0.94, "share of the link rate ring all-reduce reaches with large messages")
    ring_step_latency_us: float = setting(10.0, "latency of one ring step, worker to neighbour through the switch (us)")
    ring_step_overhead_us: float | None = setting(
        None, "what a ring step costs beyond its chunk's transfer, measured on the links and delay at hand: a step "
              "takes max(latency + propagation, overhead + chunk / rate) (us; none: the latency adds to every step)")
    propagation_rtt_us: float = setting(0.0, "propagation round trip between a worker and its switch (us)")
    realloc_pause_us: float = setting(0.0, "pause of a running job whose grant changes: barrier and resend (us)")
    ring_move_restarts_op: bool = setting(
        False, "a job moved off the ring loses its ring all-reduce in flight (progress back to where it began)")
    comm_overlap: float = setting(0.0, "share of communication hidden behind compute, in [0, 1)")
    source: str = setting("defaults: an assumed 100G datacenter rack with an ASIC ToR, not measured",
                          "where these numbers come from")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not _valid(f.name, value):
                raise CalibrationError(f"calibration field {f.name!r}: {_RULES[f.name][1]}, got {value!r}")
        if self.frame_bytes < self.payload_bytes:
            raise CalibrationError(f"calibration: frame_bytes ({self.frame_bytes}) is smaller than payload_bytes "
                                   f"({self.payload_bytes})")

    # Derived values in SI units (seconds, bytes/s), used by simulator.model; computed once (the model reads them
    # on every rate it computes).
    @functools.cached_property
    def ina_rtt_s(self) -> float:
        return self.ina_rtt_us * 1e-6

    @functools.cached_property
    def propagation_rtt_s(self) -> float:
        return self.propagation_rtt_us * 1e-6

    @functools.cached_property
    def realloc_pause_s(self) -> float:
        return self.realloc_pause_us * 1e-6

    @functools.cached_property
    def cwnd_queue_allowance_s(self) -> float | None:
        return self.cwnd_queue_allowance_us * 1e-6 if self.congestion_window else None

    @functools.cached_property
    def ring_step_latency_s(self) -> float:
        return self.ring_step_latency_us * 1e-6

    @functools.cached_property
    def ina_efficiency(self) -> float:
        """Payload share of each INA frame: line rate * this = INA goodput."""
        return self.payload_bytes / self.frame_bytes


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _at_least_zero(value: Any) -> bool:
    return _number(value) and value >= 0


_RULES = {
    "ina_rtt_us": (_positive, "must be a number > 0"),
    "payload_bytes": (_positive, "must be a number > 0"),
    "frame_bytes": (_positive, "must be a number > 0"),
    "switch_pps": (lambda v: v is None or _positive(v), "must be none or a number > 0"),
    "switch_shared_pps": (lambda v: v is None or _positive(v), "must be none or a number > 0"),
    "congestion_window": (lambda v: isinstance(v, bool), "must be true or false"),
    "cwnd_queue_allowance_us": (_at_least_zero, "must be a number >= 0"),
    "cwnd_allowance_share": (_at_least_zero, "must be a number >= 0"),
    "cwnd_min_window": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "must be an integer >= 1"),
    "cwnd_floor_bdp": (lambda v: isinstance(v, bool), "must be true or false"),
    "cwnd_latecomer": (lambda v: isinstance(v, bool), "must be true or false"),
    "worker_startup_packets": (_at_least_zero, "must be a number >= 0"),
    "startup_fair_share": (lambda v: isinstance(v, bool), "must be true or false"),
    "ring_goodput_fraction": (lambda v: _positive(v) and v <= 1, "must be in (0, 1]"),
    "ring_step_latency_us": (_at_least_zero, "must be a number >= 0"),
    "ring_step_overhead_us": (lambda v: v is None or _at_least_zero(v), "must be none or a number >= 0"),
    "propagation_rtt_us": (_at_least_zero, "must be a number >= 0"),
    "realloc_pause_us": (_at_least_zero, "must be a number >= 0"),
    "ring_move_restarts_op": (lambda v: isinstance(v, bool), "must be true or false"),
    "comm_overlap": (lambda v: _number(v) and 0 <= v < 1, "must be in [0, 1)"),
    "source": (lambda v: isinstance(v, str), "must be text"),
}


def _valid(name: str, value: Any) -> bool:
    return _RULES[name][0](value)
