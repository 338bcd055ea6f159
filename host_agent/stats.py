"""A worker's counters of its job's stream (``StreamStats``): what every results file of ``ina-agent`` reports."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StreamStats"]


@dataclass
class StreamStats:
    """Counters of one worker's stream (monotonic; read them any time)."""

    calls: int = 0
    chunks: int = 0
    packets_sent: int = 0
    retransmits: int = 0  # every resend (early, timeout probe)
    early_resends: int = 0  # resends of chunks found lost before the timeout (RACK)
    timeouts: int = 0  # expiries of a window's retransmission timer (each resends one probe)
    spurious_resends: int = 0  # resent chunks whose original reached the switch (host_agent/flight.py)
    gap_reports: int = 0  # the switch's reports of this worker's lost frames (docs/agent.md, "Loss signals")
    signal_resends: int = 0  # resends of chunks a gap report or a result's PREV_DONE named lost
    lane_lag_max: int = 0  # most chunks of one lane skipped at once (waiting for a recovery: docs/agent.md, lanes)
    # seconds an INA window had chunks left to send but could not send them (docs/agent.md, "Where the time
    # goes"): waiting for the result of the chunk that last used the next slot (loss recovery, a late peer),
    # for the congestion window, and with every chunk sent, for the last results (the tail)
    slot_wait_s: float = 0.0
    cwnd_wait_s: float = 0.0
    tail_wait_s: float = 0.0
    path_rtt_floor_s: float = 0.0  # the RTT estimator's path floor under the current generation (grant or override)
    # the estimator's path round trip (shortest seen, at least the floor) and smoothed round trip after the last INA
    # window, seconds (0 before any): what experiment 1 sizes its grants to (docs/experiments.md, "Grant sizing")
    path_rtt_s: float = 0.0
    srtt_s: float = 0.0
    window_cuts: int = 0  # congestion-window decreases (host_agent/congestion.py)
    loss_cuts: int = 0  # of those, the ones made on a loss
    results: int = 0
    ignored: int = 0  # duplicate, late or foreign packets
    stale: int = 0  # packets of another generation or job
    overflow_chunks: int = 0
    resyncs: int = 0
    replayed_chunks: int = 0
    ring_ops: int = 0
    ring_redo_int64: int = 0
    generation_history: list = field(default_factory=list)
    # per generation change (not the first sync): [seconds from the grant's arrival to the stop, to the
    # barrier's answer, to the replay's end (first missing chunk back where it was), chunks replayed,
    # seconds of ring work lost (an aborted ring op's time before the stop), the new generation, its plan's kind]
    pauses: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}
