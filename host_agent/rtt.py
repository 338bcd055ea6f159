"""The INA sender's round-trip estimator: SRTT, RTTVAR and the retransmission timeout (RFC 6298).

An INA round trip of a chunk runs from its transmission to its RESULT, which the switch sends when the
*last* worker's copy arrives: it includes the path, the queues on it (an htb link holds a window's frames
for their wire time) and the skew between workers. The timeout has to cover all of that, so it follows
the mean and variation of every sample (unlike a min-filter, which sees only the path and fires on
results that are merely queued or waiting for a later peer). What the min-filter got right is kept
elsewhere: the window's timer restarts on every new result (``host_agent.ina_window``), so a slow peer
or a long queue never makes it fire while results still flow, and ``min_rtt`` (the path alone) is what
the congestion window and the spurious-resend test compare against; ``recent_min`` (the shortest of
the last 32 round trips: path and standing queue) is what early loss detection expects. Karn's rule: the caller samples
only chunks sent once. Timeouts back off exponentially (capped) until the next new result.

Times are plain floats (seconds) passed in by the caller, so tests drive it with a fake clock.
"""
from __future__ import annotations

from collections import deque

__all__ = ["RttEstimator"]

ALPHA = 1 / 8  # RFC 6298 gains
BETA = 1 / 4
K = 4
MAX_BACKOFF = 64  # the timeout doubles per consecutive expiry, up to this factor (and rto_max)
RECENT = 32  # samples in the recent minimum


class RttEstimator:
    """RFC 6298 with per-sample gains scaled down by the samples expected per round trip (RFC 7323 App. G).

    Args:
        rto_initial: the timeout before the first sample.
        rto_min: the least margin of the timeout above SRTT (Linux floors the variance term the same way:
            an INA round trip jitters with the skew between workers, which a steady path hides from RTTVAR).
        rto_max: the largest timeout, backed off or not.
        granularity: the clock granularity G of RFC 6298 (the timeout is at least SRTT + G).
        path_floor: the shortest round trip the path can have at its links' rate (0: none): ``path_rtt`` is
            never below it. On htb links the measured minimum is shorter: a link that idled passes a burst
            (``cburst``, 8 INA frames) at veth speed, so the shortest sample crossed every link without its
            serialization, and the congestion window's queue target, built on ``path_rtt``, then reads a
            longer path's normal round trip (a tree's 4 link crossings) as a queue (docs/experiments.md,
            "Aggregation trees").
    """

    def __init__(self, rto_initial: float, rto_min: float, rto_max: float, granularity: float = 0.001,
                 path_floor: float = 0.0) -> None:
        self.rto_initial, self.rto_min, self.rto_max, self.granularity = rto_initial, rto_min, rto_max, granularity
        self.path_floor = path_floor
        self.srtt = 0.0
        self.rttvar = 0.0
        self.min_rtt = float("inf")
        self.latest = 0.0
        self.samples = 0
        self.backoff = 1
        self._base_rto = rto_initial
        self._recent: deque[float] = deque(maxlen=RECENT)

    def reset(self) -> None:
        """Forget the path (a new generation may aggregate in another switch)."""
        self.__init__(self.rto_initial, self.rto_min, self.rto_max, self.granularity, self.path_floor)

    def sample(self, rtt: float, per_round: int = 1) -> None:
        """A round trip of a chunk sent once; ``per_round``: samples expected per round trip (the flight)."""
        if rtt < 0:
            return
        self.latest = rtt
        self._recent.append(rtt)
        self.min_rtt = min(self.min_rtt, rtt)
        if self.samples == 0:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            n = max(1, per_round)
            a, b = ALPHA / n, BETA / n
            self.rttvar += b * (abs(self.srtt - rtt) - self.rttvar)
            self.srtt += a * (rtt - self.srtt)
        self.samples += 1
        self._rearm()
        self.backoff = 1

    def _rearm(self) -> None:
        """The timeout from SRTT and RTTVAR (``rto_min``: the least margin, as Linux)."""
        self._base_rto = min(self.srtt + max(self.granularity, K * self.rttvar, self.rto_min), self.rto_max)

    def spurious_timeout(self, rtt: float) -> None:
        """A timeout or tail probe was needless: the original's result came back ``rtt`` after its first send, later
        than the timer allowed (a peer descheduled on the loaded machine; at a window of 1 every chunk is a tail).
        RFC 4015's response: ``SRTT = max(SRTT, rtt)``, ``RTTVAR = max(RTTVAR, rtt / 2)``, so the next stall of that
        length waits for its result; later samples bring the timeout back down at the usual gains."""
        if not self.samples or rtt <= 0:
            return
        self.srtt = max(self.srtt, rtt)
        self.rttvar = max(self.rttvar, rtt / 2)
        self._rearm()

    def progressed(self) -> None:
        """A new result arrived (of any chunk): the path works again, so the backoff ends (as Linux does;
        Karn's rule still keeps resent chunks out of the estimate)."""
        self.backoff = 1

    def expired(self) -> None:
        """The timer fired: back off (doubling, capped) until the next valid sample."""
        if self.backoff < MAX_BACKOFF:
            self.backoff *= 2

    @property
    def rto(self) -> float:
        """The current timeout, backed off."""
        return min(self._base_rto * self.backoff, self.rto_max)

    @property
    def recent_min(self) -> float:
        """The shortest of the last 32 round trips: the path and its standing queue now, without the
        waits for late peers and their loss recovery (what loss detection should expect)."""
        return min(self._recent) if self._recent else self.rto_initial / 4

    @property
    def path_rtt(self) -> float:
        """The shortest round trip seen (the path without queues or waiting), at least ``path_floor``; before any
        sample a quarter of the initial timeout."""
        return max(self.min_rtt, self.path_floor) if self.samples else self.rto_initial / 4
