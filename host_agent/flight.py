"""The chunks of one INA window in flight: when each was sent, which are lost, which resends were spurious.

Loss is found two ways (docs/agent.md, "Loss recovery"):

- **Early (RACK, RFC 8985).** A result for a chunk *sent later* than an outstanding one means the
  outstanding one should have come back by now: once it is ``rack_rtt + reorder_window`` past its own
  transmission (``rack_rtt``: the round trip of that later chunk, queueing included), it is resent.
  Results of one worker's chunks come back in the order they were sent (every worker sends in order
  and a slot completes when its last copy arrives), so only loss or real reordering triggers this; the
  reorder window (a quarter of the path's round trip, at least ``REORDER_FLOOR``) widens after an early
  resend turns out spurious.
- **Timeout.** One timer for the window, restarted by every new result (RFC 6298 5.3): while results
  flow (a queue draining, a late peer catching up) it never fires; when it does, the oldest outstanding
  chunk is resent as a probe and the timeout backs off; the probe's result then lets RACK find the rest.

A resend is **spurious** when the chunk's original reached the switch. The agent counts it when the first
result comes back sooner than the path's shortest round trip after the resend (it cannot be the resend's
answer), or when a second result comes back for a chunk resent once (the switch answers a resend of a
completed chunk to its sender alone). A resend held at the switch until a late peer completes the chunk
looks like a needed one: under loss the count is a lower bound (on a lossless path every resend is spurious).

Times are plain floats passed in by the caller (tests use a fake clock).
"""
from __future__ import annotations

import numpy as np

from host_agent.congestion import CongestionWindow
from host_agent.rtt import RttEstimator

__all__ = ["Flight", "REORDER_FLOOR"]

REORDER_FLOOR = 0.001  # seconds: the smallest reorder window
MAX_REORDER_MULT = 4


class Flight:
    """Send times, resends and loss detection of chunks ``[i0, K)`` of one window.

    Args:
        K, i0: the window's chunks are ``i0 .. K-1``.
        rtt: the stream's round-trip estimator (sampled here, Karn's rule).
        cwnd: the stream's congestion window (fed here).
        granted: slots granted (the window's upper bound).
        stats: the stream's counters (``spurious_resends``).
        reorder_mult: the stream's current widening of the reorder window (carried between windows).
    """

    def __init__(self, K: int, i0: int, rtt: RttEstimator, cwnd: CongestionWindow, granted: int, stats,
                 reorder_mult: int = 1) -> None:
        self.K, self.i0, self.rtt, self.cwnd, self.granted, self.stats = K, i0, rtt, cwnd, granted, stats
        self.sent_at = np.zeros(K, dtype=np.float64)  # last transmission of each chunk
        self.tries = bytearray(K)  # resends of each chunk (saturating)
        self.early = bytearray(K)  # 1: resent by RACK (a spurious one widens the reorder window)
        self.counted = bytearray(K)  # 1: counted as a spurious resend already
        self.reorder_mult = reorder_mult
        self.rack_xmit = float("-inf")  # transmission time of the latest-sent chunk with a result
        self.rack_i = -1
        self.rack_rtt = 0.0
        self.rack_timer = float("inf")  # when an outstanding chunk becomes lost unless its result comes
        self.rack_dirty = False
        self.last_new = 0.0  # when the latest new result arrived

    # ------------------------------------------------------------------ transmissions

    def sent(self, first: int, end: int, now: float) -> None:
        self.sent_at[first:end] = now

    def resent(self, i: int, now: float, early: bool) -> None:
        self.sent_at[i] = now
        if self.tries[i] < 255:
            self.tries[i] += 1
        self.early[i] = 1 if early else 0

    # ------------------------------------------------------------------ results

    def _spurious(self, i: int) -> None:
        if not self.counted[i]:
            self.counted[i] = 1
            self.stats.spurious_resends += 1
            if self.early[i] and self.reorder_mult < MAX_REORDER_MULT:
                self.reorder_mult += 1

    def delivered(self, i: int, now: float) -> None:
        """The first result of chunk ``i`` arrived at ``now``."""
        t = float(self.sent_at[i])
        rtt = now - t
        self.last_new = now
        est = self.rtt
        if not self.tries[i]:
            est.sample(rtt, int(self.cwnd.cwnd) // 2)
            self.cwnd.on_results(rtt, 1, now, est.path_rtt, est.srtt, self.granted)
        elif rtt < est.path_rtt:
            self._spurious(i)
            return  # it answers an earlier send: its time says nothing of the path
        if t > self.rack_xmit or (t == self.rack_xmit and i > self.rack_i):
            self.rack_xmit, self.rack_i, self.rack_rtt = t, i, rtt
            self.rack_dirty = True

    def delivered_many(self, sel: np.ndarray, now: float) -> None:
        """The first results of chunks ``sel`` (in arrival order) arrived at ``now``."""
        self.last_new = now
        t = self.sent_at[sel]
        rtts = now - t
        once = np.frombuffer(self.tries, dtype=np.uint8)[sel] == 0
        est = self.rtt
        valid = once
        if once.any():
            sample = rtts[once]
            step = max(1, sample.size // 16)  # a few samples stand for the batch (same arrival time)
            per_round = int(self.cwnd.cwnd) // (2 * step)
            for r in sample[::step]:
                est.sample(float(r), per_round)
            self.cwnd.on_results(float(sample.min()), int(sample.size), now, est.path_rtt, est.srtt, self.granted)
        if not once.all():
            resent = ~once
            early = rtts < est.path_rtt
            for i in sel[resent & early]:
                self._spurious(int(i))
            valid = once | (resent & ~early)
        if valid.any():
            tv = t[valid]
            j = int(np.argmax(tv))  # the latest transmission (the first of equal ones: lowest index of a run)
            last = tv[j]
            ties = np.flatnonzero(tv == last)
            k = int(ties[np.argmax(sel[valid][ties])])
            if last > self.rack_xmit or (last == self.rack_xmit and int(sel[valid][k]) > self.rack_i):
                self.rack_xmit, self.rack_i, self.rack_rtt = float(last), int(sel[valid][k]), float(rtts[valid][k])
                self.rack_dirty = True

    def duplicate(self, i: int) -> None:
        """Another result for chunk ``i``, which already has one."""
        if self.tries[i] == 1:
            self._spurious(i)

    # ------------------------------------------------------------------ loss detection

    def reorder_window(self) -> float:
        est = self.rtt
        w = max(est.path_rtt / 4, REORDER_FLOOR) * self.reorder_mult
        return min(w, max(est.srtt, REORDER_FLOOR)) if est.samples else w

    def lost(self, got: np.ndarray, lo: int, hi: int, now: float, queued: bytearray) -> list[int]:
        """RACK: outstanding chunks in ``[lo, hi)`` sent before the latest-sent chunk with a result, and
        overdue by ``rack_rtt + reorder window``."""
        self.rack_dirty = False
        self.rack_timer = float("inf")
        if self.rack_i < 0 or hi <= lo:
            return []
        t = self.sent_at[lo:hi]
        idx = np.arange(lo, hi)
        cand = (got[lo:hi] == 0) & (np.frombuffer(queued, dtype=np.uint8)[lo:hi] == 0)
        cand &= (t < self.rack_xmit) | ((t == self.rack_xmit) & (idx < self.rack_i))
        if not cand.any():
            return []
        due = t[cand] + (self.rack_rtt + self.reorder_window())
        over = due <= now
        if not over.all():
            self.rack_timer = float(due[~over].min())
        return [int(i) for i in idx[cand][over]]

    def rto_deadline(self, lo: int) -> float:
        """When the window's timer fires, given its oldest outstanding chunk ``lo``."""
        return max(self.last_new, float(self.sent_at[lo])) + self.rtt.rto
