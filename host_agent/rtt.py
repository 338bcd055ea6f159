"""The INA sender's round-trip estimator: SRTT, RTTVAR and the retransmission timeout (RFC 6298).

An INA round trip of a chunk runs from its transmission to its RESULT, which the switch sends when the
*last* worker's copy arrives: it includes the path, the queues on it (an htb link holds a window's frames
for their wire time) and the skew between workers. The timeout has to cover all of that, so it follows
the mean and variation of every sample (unlike a min-filter, which sees only the path and fires on
results that are merely queued or waiting for a later peer). What the min-filter got right is kept
elsewhere: the window's timer restarts on every new result (``host_agent.ina_window``), so a slow peer
or a long queue never makes it fire while results still flow, and ``min_rtt`` (the path alone) is what
the congestion window and the spurious-resend test compare against. Karn's rule: the caller samples
only chunks sent once. Timeouts back off exponentially (capped) until the next valid sample.

Times are plain floats (seconds) passed in by the caller, so tests drive it with a fake clock.
"""
from __future__ import annotations

__all__ = ["RttEstimator"]

ALPHA = 1 / 8  # RFC 6298 gains
BETA = 1 / 4
K = 4
MAX_BACKOFF = 64  # the timeout doubles per consecutive expiry, up to this factor (and rto_max)


class RttEstimator:
    """RFC 6298 with per-sample gains scaled down by the samples expected per round trip (RFC 7323 App. G).

    Args:
        rto_initial: the timeout before the first sample.
        rto_min, rto_max: bounds of the timeout (rto_max also bounds the backed-off timeout).
        granularity: the clock granularity G of RFC 6298 (the timeout is at least SRTT + G).
    """

    def __init__(self, rto_initial: float, rto_min: float, rto_max: float, granularity: float = 0.001) -> None:
        self.rto_initial, self.rto_min, self.rto_max, self.granularity = rto_initial, rto_min, rto_max, granularity
        self.srtt = 0.0
        self.rttvar = 0.0
        self.min_rtt = float("inf")
        self.latest = 0.0
        self.samples = 0
        self.backoff = 1
        self._base_rto = rto_initial

    def reset(self) -> None:
        """Forget the path (a new generation may aggregate in another switch)."""
        self.__init__(self.rto_initial, self.rto_min, self.rto_max, self.granularity)

    def sample(self, rtt: float, per_round: int = 1) -> None:
        """A round trip of a chunk sent once; ``per_round``: samples expected per round trip (the flight)."""
        if rtt < 0:
            return
        self.latest = rtt
        if rtt < self.min_rtt:
            self.min_rtt = rtt
        if self.samples == 0:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            n = per_round if per_round > 1 else 1
            a, b = ALPHA / n, BETA / n
            self.rttvar += b * (abs(self.srtt - rtt) - self.rttvar)
            self.srtt += a * (rtt - self.srtt)
        self.samples += 1
        base = self.srtt + max(self.granularity, K * self.rttvar)
        self._base_rto = min(max(base, self.rto_min), self.rto_max)
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
    def path_rtt(self) -> float:
        """The shortest round trip seen (the path without queues or waiting), or SRTT before any sample."""
        return self.min_rtt if self.samples else self.rto_initial / 4
