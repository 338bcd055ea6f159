"""The INA sender's congestion window: how many of its granted slots a worker keeps in flight.

ATP's window-based congestion control is the anchor (additive increase, multiplicative decrease of the
chunks in flight, below the slots the job holds), with queueing delay in place of ATP's ECN marks (the
switch marks nothing): a grant far above the bandwidth-delay product only fills the queue of the
bottleneck link (an htb queue on the testbed) and makes every round trip longer, so the window stops
growing once round trips grow and shrinks back.

The signal is the *shortest* round trip of each round (one smoothed RTT of results): a standing queue
raises every sample of a round, while a peer that starts a call late or recovers a loss delays only some
chunks (an INA result waits for the last worker), which must not shrink this worker's window. A round
whose shortest round trip exceeds ``path_rtt + max(path_rtt, queue_allowance)`` cuts the window in
proportion to the excess (at most by half); a flat round grows it: doubling per round (slow start) until
the first cut, then by one slot per round. A loss cuts it by half only when the round shows a queue
(loss with a queue is congestion, loss without one is a random drop that a smaller window would not
prevent: with 8 workers at 5 % link loss a third of the rounds lose a chunk); a timeout halves it.

Times are plain floats (seconds) passed in by the caller, so tests drive it with a fake clock.
"""
from __future__ import annotations

__all__ = ["CongestionWindow"]

QUEUE_ALLOWANCE = 0.004  # seconds of queueing a round may show before the window shrinks
MAX_CUT = 0.5  # the largest multiplicative decrease per round
DELAY_GAIN = 0.8  # decrease per round = DELAY_GAIN x (excess delay / round trip), at most MAX_CUT


class CongestionWindow:
    """Chunks a worker may have in flight (at most the slots granted).

    Args:
        initial: the window to start from (and after a reset).
        queue_allowance: queueing delay, in seconds, tolerated above the path's round trip.
    """

    def __init__(self, initial: int = 4, queue_allowance: float = QUEUE_ALLOWANCE) -> None:
        self.initial = initial
        self.queue_allowance = queue_allowance
        self.cwnd = float(initial)
        self.ssthresh = float("inf")
        self.round_end = 0.0
        self.round_min = float("inf")
        self.queued = False  # the last complete round showed a queue
        self.cuts = 0
        self.last_cut = float("-inf")

    def limit(self, granted: int) -> int:
        """The chunks that may be in flight now."""
        return max(1, min(granted, int(self.cwnd)))

    def clamp(self, granted: int) -> None:
        """A new grant: never more in flight than the slots held."""
        self.cwnd = max(1.0, min(self.cwnd, float(granted)))

    def _target(self, path_rtt: float) -> float:
        return path_rtt + max(path_rtt, self.queue_allowance)

    def on_results(self, rtt: float, count: int, now: float, path_rtt: float, srtt: float, granted: int) -> None:
        """``count`` results of chunks sent once arrived at ``now``; ``rtt`` is the shortest of their round trips."""
        if rtt < self.round_min:
            self.round_min = rtt
        if self.cwnd < self.ssthresh:
            self.cwnd = min(self.cwnd + count, float(granted))  # slow start: +1 per result, x2 per round
        if now < self.round_end:
            return
        target = self._target(path_rtt)
        if self.round_min > target:
            cut = min(MAX_CUT, DELAY_GAIN * (self.round_min - target) / self.round_min)
            self.cwnd = max(1.0, self.cwnd * (1.0 - cut))
            self.ssthresh = self.cwnd
            self.cuts += 1
            self.last_cut = now
            self.queued = True
        else:
            if self.cwnd >= self.ssthresh:
                self.cwnd += 1.0
            self.queued = False
        self.cwnd = min(self.cwnd, float(granted))
        self.round_end = now + max(srtt, path_rtt)
        self.round_min = float("inf")

    def on_loss(self, now: float, path_rtt: float, srtt: float) -> None:
        """A chunk was found lost before its timeout: halve, once per round, if the round shows a queue."""
        queue_now = self.round_min != float("inf") and self.round_min > self._target(path_rtt)
        if (self.queued or queue_now) and now - self.last_cut >= max(srtt, path_rtt):
            self._halve(now, srtt, path_rtt)

    def on_timeout(self, now: float, path_rtt: float, srtt: float) -> None:
        """The retransmission timer fired: halve."""
        self._halve(now, srtt, path_rtt)

    def _halve(self, now: float, srtt: float, path_rtt: float) -> None:
        self.cwnd = max(1.0, self.cwnd / 2)
        self.ssthresh = self.cwnd
        self.cuts += 1
        self.last_cut = now
        self.round_end = now + max(srtt, path_rtt)
        self.round_min = float("inf")
