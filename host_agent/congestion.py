"""The INA sender's congestion window: how many of its granted slots a worker keeps in flight.

ATP's window-based congestion control is the anchor (additive increase, multiplicative decrease of the
chunks in flight, below the slots the job holds), with queueing delay in place of ATP's ECN marks (the
switch marks nothing): a grant far above the bandwidth-delay product only fills the queue of the
bottleneck link (an htb queue on the testbed) and makes every round trip longer, so the window stops
growing once round trips grow and shrinks back.

The signal is the *shortest* recent round trip (of the last 32 samples, ``RttEstimator.recent_min``),
taken once per round (one smoothed RTT of results): a standing queue raises every sample, while a peer
that starts a call late or recovers a loss delays only some chunks (an INA result waits for the last
worker), which must not shrink this worker's window. (The shortest of one round alone is not enough:
with a small window under loss a round has few samples, all of them may wait for a recovery, and the
window would collapse.) The window never drops below ``MIN_WINDOW`` (or the grant): early loss
detection needs later chunks in flight.

**The queue is kept short** (experiment 4): a round whose shortest round trip exceeds
``path_rtt + allowance`` (``allowance = max(queue_allowance, path_rtt / 4)``) cuts the window in
proportion to the excess (at most by half); a flat round grows it: doubling per round (slow start) until
the first cut, then by one slot per round. A standing queue costs nothing while nothing is lost, but a
resend waits behind it twice (the loss is found one queued round trip late, and the resend queues
again), and SwitchML's slot rule stops the window at ``lost chunk + S`` until then: with a grant of twice
the BDP, a queue of a whole round trip (what a target of ``2 x path_rtt`` allowed) turned every lost
packet into a stall of about a round trip.

**Loss is not a congestion signal here** (ATP tells congestion apart from random loss the same way, by
its marks): a lost chunk (found early or by the timeout) cuts the window only in a round that already
shows a queue above the target, once per round, by the delay rule (at most ``MAX_CUT``); a random drop
on a path without a queue, which a smaller window would not prevent, changes nothing. (Loss from a full
queue comes with that queue's delay first: the delay rule acts before the queue is full. Every drop
halving the window, as TCP Reno does, took 8 workers at 5 % link loss to the minimum window: a third
of their rounds lose a chunk.)

**No cut goes below the bandwidth-delay product** (experiment 1's pool-size curve): a window
of ``W`` chunks delivered at ``R`` chunks/s keeps at most ``W / R`` seconds of round trip in flight, so a
window of at most ``R x path_rtt`` makes no queue at all. When the round trips exceed the target anyway
(the skew of a peer descheduled on the loaded machine, whose stall every INA round trip of its peers
includes; the software switch's own queue), cutting the window below that would only idle the link. So
no cut goes below ``floor = R_max x path_rtt`` (``R_max``: the highest delivery rate of the last
``RATE_ROUNDS`` rounds, BBR's bottleneck-bandwidth filter), the BDP once a round has filled the link.
(Without it, a grant of 2-4x the BDP on 2 Mbit/s / 10 ms was cut to about half the BDP by such rounds
and took 1.3-1.5x the framed wire time; experiment 1. A floor at ``R_max x target``, a quarter round
trip higher, kept that queue under loss too: 85 % of lossless goodput at 1 % loss instead of 88 %.)

Times are plain floats (seconds) passed in by the caller, so tests drive it with a fake clock.
"""
from __future__ import annotations

import math
from collections import deque

__all__ = ["CongestionWindow"]

MIN_WINDOW = 4  # chunks: fewer leave early loss detection nothing to compare with
QUEUE_ALLOWANCE = 0.002  # seconds of queueing a round may show before the window shrinks (at least; see _target)
ALLOWANCE_SHARE = 0.25  # ... or this share of the path's round trip, whichever is larger
MAX_CUT = 0.5  # the largest multiplicative decrease per round
DELAY_GAIN = 0.8  # decrease per round = DELAY_GAIN x (excess delay / round trip), at most MAX_CUT
RATE_ROUNDS = 32  # rounds whose delivery rates the floor's max filter keeps


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
        self.last_round_min = float("inf")  # its shortest round trip
        self.cuts = 0
        self.loss_cuts = 0  # of the cuts, those made on a loss or a timeout
        self.last_cut = float("-inf")
        self.round_start: float | None = None  # when the current round began (the previous one ended)
        self.round_delivered = 0  # results of chunks sent once in the current round
        self._rates: deque[float] = deque(maxlen=RATE_ROUNDS)  # delivery rate of each recent round (chunks/s)

    def limit(self, granted: int) -> int:
        """The chunks that may be in flight now."""
        return max(1, min(granted, max(int(self.cwnd), MIN_WINDOW)))

    def clamp(self, granted: int) -> None:
        """A new grant: never more in flight than the slots held."""
        self.cwnd = max(1.0, min(self.cwnd, float(granted)))

    def _target(self, path_rtt: float) -> float:
        """The longest shortest-round-trip of a round that does not shrink the window."""
        return path_rtt + max(self.queue_allowance, ALLOWANCE_SHARE * path_rtt)

    @property
    def rate(self) -> float:
        """The highest delivery rate of the recent rounds, in chunks per second (0 before a round ended)."""
        return max(self._rates, default=0.0)

    def floor(self, path_rtt: float) -> float:
        """The smallest window a queue may cut it to: the bandwidth-delay product at the delivery rate (see
        the module docstring)."""
        return math.ceil(self.rate * path_rtt)

    def on_results(self, rtt: float, count: int, now: float, path_rtt: float, srtt: float, granted: int) -> None:
        """``count`` results of chunks sent once arrived at ``now``; ``rtt``: the shortest recent round trip."""
        self.round_min = min(self.round_min, rtt)
        self.round_delivered += count
        if self.cwnd < self.ssthresh:
            self.cwnd = min(self.cwnd + count, float(granted))  # slow start: +1 per result, x2 per round
        if now < self.round_end:
            return
        if self.round_start is not None and now > self.round_start:
            self._rates.append(self.round_delivered / (now - self.round_start))
        self.round_start, self.round_delivered = now, 0
        target = self._target(path_rtt)
        if self.round_min > target:
            if now - self.last_cut >= max(srtt, path_rtt):  # a loss may have cut in this round already
                self._cut(self.round_min, target, now, self.floor(path_rtt))
            self.queued = True
        else:
            if self.cwnd >= self.ssthresh:
                self.cwnd += 1.0
            self.queued = False
        self.cwnd = min(self.cwnd, float(granted))
        self.round_end = now + max(srtt, path_rtt)
        self.last_round_min = self.round_min
        self.round_min = float("inf")

    def _cut(self, rtt: float, target: float, now: float, floor: float) -> bool:
        """Decrease in proportion to the excess delay (at most ``MAX_CUT``), not below ``floor``; slow start
        ends. True if the window shrank."""
        cut = min(MAX_CUT, DELAY_GAIN * (rtt - target) / rtt)
        new = max(1.0, self.cwnd * (1.0 - cut), floor)
        self.ssthresh = min(self.ssthresh, max(new, 1.0))
        if new >= self.cwnd:
            return False  # the window is too small to have made this queue
        self.cwnd = new
        self.ssthresh = new
        self.cuts += 1
        self.last_cut = now
        return True

    def on_loss(self, now: float, path_rtt: float, srtt: float) -> None:
        """A chunk was found lost before its timeout: a cut only if this round shows a queue above the target
        (by the delay rule, once per round); a random drop with no queue changes nothing."""
        target = self._target(path_rtt)
        rtt = self.round_min if self.round_min != float("inf") else (self.last_round_min if self.queued else 0.0)
        if (rtt and rtt > target and now - self.last_cut >= max(srtt, path_rtt)
                and self._cut(rtt, target, now, self.floor(path_rtt))):
            self.loss_cuts += 1

    def on_timeout(self, now: float, path_rtt: float, srtt: float) -> None:
        """The retransmission timer fired: the same rule as a loss (a lost tail or a late peer is no congestion)."""
        self.on_loss(now, path_rtt, srtt)
