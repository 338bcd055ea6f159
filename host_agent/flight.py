"""The chunks of one INA window in flight: when each was sent, which are lost, which resends were spurious.

Loss is found two ways (docs/agent.md, "Loss recovery"):

- **Early (RACK, RFC 8985).** A result for a chunk *sent later* than an outstanding one means the
  outstanding one should have come back by now: once it is ``rack_rtt + reorder_window`` past its own
  transmission (``rack_rtt``: the round trip of that later chunk, queueing included), it is resent.
  Results of one worker's chunks come back in the order they were sent (every worker sends in order
  and a slot completes when its last copy arrives), so only loss or real reordering triggers this; the
  reorder window is an eighth of the path's round trip, at least ``REORDER_FLOOR``. Where the chunks
  take paths of different lengths (Rina on chains: partition p's result comes back after the chain that
  ends at ring member p, one to R members long), that order holds only among chunks of one path, so
  RACK keeps its evidence per *path class* (``classes``): a result of a short path's chunk says nothing
  of a long path's chunk sent before it.
- **Tail probe (TLP).** When results stop for ``tail_wait`` (two shortest round trips and a reorder
  window, at least SRTT + RTTVAR, after the later of the latest result and the oldest chunk's transmission), the
  stalled window resends its oldest chunk, once per stall, without backing off; after an answered probe, the
  overdue tail. With one chunk in flight in the middle of a window, only the timeout acts.
- **Timeout.** One timer for the window, restarted by every new result (RFC 6298 5.3): while results
  flow (a queue draining, a late peer catching up) it never fires; when it does, the oldest outstanding
  chunks are resent and the timeout backs off (until the next new result): every chunk outstanding for a
  timeout that a later-sent chunk's result overtook (lost: results come back in sending order), else the
  oldest alone as a probe (a chunk merely behind the latest result, queued or waiting for a late peer, is
  no loss: a late peer answers the probe, then the rest); after an answered probe (one no first send's
  result followed), every chunk outstanding for a timeout. Only chunks sent once feed RACK (Karn's rule for RACK: an
  INA result of a resent chunk may answer either send, and a probe answered by a late peer says nothing
  of the chunks sent before it). A needless timeout or probe raises SRTT and RTTVAR to the original's round
  trip (RFC 4015's response), which the timer and the tail probe then wait for.

A resend is **spurious** when the chunk's original reached the switch. The agent counts it when the first
result comes back sooner than the path's shortest round trip after the resend (it cannot be the resend's
answer), or when a second result comes back for a chunk resent once (the switch answers a resend of a
completed chunk to its sender alone). A resend held at the switch until a late peer completes the chunk
looks like a needed one: under loss the count is a lower bound (on a lossless path every resend is spurious).

Times are plain floats passed in by the caller (tests use a fake clock).
"""
from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path

import numpy as np

from host_agent.congestion import CongestionWindow
from host_agent.rtt import RttEstimator

__all__ = ["REORDER_FLOOR", "Flight"]

REORDER_FLOOR = 0.001  # seconds: the smallest reorder window
REORDER_SHARE = 1 / 8  # of the path's round trip: a worker's results come back in sending order, so only loss
# reorders them; each lost chunk waits this long before its resend, while SwitchML's slot rule may hold the window
CLASS_RECENT = 16  # round trips kept per path class
MAX_REORDER_MULT = 1  # no widening: in INA a spurious early resend is mostly a peer's loss (see reorder_window)


class Flight:
    """Send times, resends and loss detection of chunks ``[i0, K)`` of one window.

    Args:
        K, i0: the window's chunks are ``i0 .. K-1``.
        rtt: the stream's round-trip estimator (sampled here, Karn's rule).
        cwnd: the stream's congestion window (fed here).
        granted: slots granted (the window's upper bound).
        stats: the stream's counters (``spurious_resends``).
        reorder_mult: the stream's current widening of the reorder window (carried between windows).
        classes: each chunk's path class (``int`` array of length K, values ``0 .. C-1``; RACK compares
            chunks of one class only), or None: one path.
        class_rtts: per class, its recent round trips (the stream's, carried between windows; sampled
            here): the tail probe and the resend timer wait for the *longest* class's recent shortest
            round trip, not the estimator's ``recent_min`` (the shortest path's), so a long chain's chunks
            are not probed and resent again and again while their results are still on the way.
        trace: keep every chunk's first send, resends and result time for ``dump_trace`` (a diagnostic,
            ``StreamOptions.flight_trace``).
    """

    def __init__(self, K: int, i0: int, rtt: RttEstimator, cwnd: CongestionWindow, granted: int, stats,
                 reorder_mult: int = 1, classes: np.ndarray | None = None,
                 class_rtts: list[deque[float]] | None = None, trace: bool = False) -> None:
        self.K, self.i0, self.rtt, self.cwnd, self.granted, self.stats = K, i0, rtt, cwnd, granted, stats
        self.sent_at = np.zeros(K, dtype=np.float64)  # last transmission of each chunk
        self.first_at = np.zeros(K, dtype=np.float64)  # first transmission (a spurious timeout's true round trip)
        self.tries = bytearray(K)  # resends of each chunk (saturating)
        self.early = bytearray(K)  # 1: resent by RACK (a spurious one widens the reorder window)
        self.counted = bytearray(K)  # 1: counted as a spurious resend already
        self.txn = np.full(K, -1, dtype=np.int64)  # loss signals: each chunk's latest transmission counter (-1: none)
        self.numbered = False  # the window numbers its frames (``Flags.TX_COUNTED``; docs/agent.md, "Loss signals")
        self.signals = False  # ... and the switch sends loss signals: RACK leaves a peer's loss to the peer
        self.reorder_mult = reorder_mult
        self.classes = classes
        c = int(classes.max()) + 1 if classes is not None and len(classes) else 1
        self._xmit = np.full(c, float("-inf"))  # per class: transmission time of the latest-sent chunk with a result
        self._idx = np.full(c, -1, dtype=np.int64)  # ... that chunk
        self._rtt = np.zeros(c)  # ... its round trip
        self.class_rtts = class_rtts if classes is not None else None
        if self.class_rtts is not None:
            while len(self.class_rtts) < c:
                self.class_rtts.append(deque(maxlen=CLASS_RECENT))
        self.rack_timer = float("inf")  # when an outstanding chunk becomes lost unless its result comes
        self.rack_dirty = False
        self.last_new = 0.0  # when the latest new result arrived
        self.probe_answered = False  # a timeout's probe came back: the next timeout resends every overdue chunk
        self.tail_probed = False  # the tail probe of the current stall was sent (re-armed by a new result)
        self.trace = trace  # diagnostics: first sends, resends, results, the window
        if trace:
            self.result_at = np.zeros(K, dtype=np.float64)
            self.resends: list[tuple[int, float, int]] = []
            self.windows: list[tuple[float, float]] = []

    @property
    def _latest(self) -> int:
        return int(np.lexsort((self._idx, self._xmit))[-1])

    @property
    def rack_xmit(self) -> float:
        """Transmission time of the latest-sent chunk with a result (of any class)."""
        return float(self._xmit[self._latest])

    @property
    def rack_i(self) -> int:
        return int(self._idx[self._latest])

    @property
    def rack_rtt(self) -> float:
        return float(self._rtt[self._latest])

    def _class_of(self, i: int) -> int:
        return 0 if self.classes is None else int(self.classes[i])

    def _evidence(self, i: int, t: float, rtt: float) -> None:
        """Chunk ``i``, sent once at ``t``, has its result after ``rtt``: RACK's evidence for its class."""
        c = self._class_of(i)
        if self.class_rtts is not None:
            self.class_rtts[c].append(rtt)
        if t > self._xmit[c] or (t == self._xmit[c] and i > self._idx[c]):
            self._xmit[c], self._idx[c], self._rtt[c] = t, i, rtt
            self.rack_dirty = True

    # ------------------------------------------------------------------ transmissions

    def sent(self, first: int, end: int, now: float) -> None:
        self.sent_at[first:end] = now
        self.first_at[first:end] = now

    def resent(self, i: int, now: float, early: bool) -> None:
        self.sent_at[i] = now
        if self.tries[i] < 255:
            self.tries[i] += 1
        self.early[i] = 1 if early else 0
        if self.trace:
            self.resends.append((i, now, int(early)))

    # ------------------------------------------------------------------ results

    def _spurious(self, i: int, now: float | None = None) -> None:
        """Chunk ``i``'s resend was needless. After a timeout or a probe (not RACK), the original's round trip, which
        the timer did not allow for, raises the timeout (``RttEstimator.spurious_timeout``, RFC 4015's response):
        only after a single resend (after two, the result may answer the first of them) and at most by the current
        timeout (an INA result also waits for the peers' own recoveries)."""
        if not self.counted[i] and self.tries[i]:
            self.counted[i] = 1
            self.stats.spurious_resends += 1
            if self.early[i] and self.reorder_mult < MAX_REORDER_MULT:
                self.reorder_mult += 1
            if not self.early[i] and now is not None and self.tries[i] == 1:  # one resend: the answer is the original's
                self.rtt.spurious_timeout(min(now - float(self.first_at[i]), self.rtt.rto))

    def delivered(self, i: int, now: float) -> None:
        """The first result of chunk ``i`` arrived at ``now``."""
        t = float(self.sent_at[i])
        rtt = now - t
        self.last_new = now
        if self.trace:
            self.result_at[i] = now
            self.windows.append((now, self.cwnd.cwnd))
        self.tail_probed = False
        est = self.rtt
        est.progressed()
        if self.tries[i]:
            if rtt < est.path_rtt:
                self._spurious(i, now)  # it answers an earlier send
            elif not self.early[i]:
                self.probe_answered = True
            return  # Karn: a resent chunk's time says nothing of the path, nor of what was sent before it
        self.probe_answered = False  # the window's first sends flow again: the probe met a late peer
        est.sample(rtt, int(self.cwnd.cwnd) // 2)
        self.cwnd.on_results(est.recent_min, 1, now, self.window_path_rtt(), est.srtt, self.granted)
        self._evidence(i, t, rtt)

    def delivered_many(self, sel: np.ndarray, now: float) -> None:
        """The first results of chunks ``sel`` (in arrival order) arrived at ``now``."""
        self.last_new = now
        self.tail_probed = False
        self.rtt.progressed()
        if self.trace:
            self.result_at[sel] = now
            self.windows.append((now, self.cwnd.cwnd))
        t = self.sent_at[sel]
        rtts = now - t
        once = np.frombuffer(self.tries, dtype=np.uint8)[sel] == 0
        est = self.rtt
        if once.any():
            sample = rtts[once]
            step = max(1, sample.size // 16)  # a few samples stand for the batch (same arrival time)
            per_round = int(self.cwnd.cwnd) // (2 * step)
            for r in sample[::step]:
                est.sample(float(r), per_round)
            self.cwnd.on_results(est.recent_min, int(sample.size), now, self.window_path_rtt(), est.srtt,
                                 self.granted)
        if not once.all():
            resent = ~once
            early = rtts < est.path_rtt
            for i in sel[resent & early]:
                self._spurious(int(i), now)
            answered = sel[resent & ~early]
            if answered.size and not all(self.early[int(i)] for i in answered):
                self.probe_answered = True
        if once.any():
            self.probe_answered = False  # with results of first sends: the probe met a late peer
            tv = t[once]
            so = sel[once]
            rv = rtts[once]
            cls = self.classes[so] if self.classes is not None else np.zeros(so.size, dtype=np.int64)
            for c in np.unique(cls):
                of = np.flatnonzero(cls == c)
                last = tv[of].max()
                ties = of[tv[of] == last]
                k = int(ties[np.argmax(so[ties])])  # the latest transmission; of a run, the highest chunk
                self._evidence(int(so[k]), float(last), float(rv[k]))

    def delivered_few(self, sel: list[int], now: float) -> None:
        """``delivered_many`` for a short batch (a list, in arrival order), in plain Python: numpy's fixed cost per
        call outweighs a few results. The same state after as ``delivered_many``."""
        self.last_new = now
        self.tail_probed = False
        est = self.rtt
        est.progressed()
        if self.trace:
            self.result_at[sel] = now
            self.windows.append((now, self.cwnd.cwnd))
        sent_at, tries = self.sent_at, self.tries
        once = [i for i in sel if not tries[i]]
        if once:
            step = max(1, len(once) // 16)
            per_round = int(self.cwnd.cwnd) // (2 * step)
            for i in once[::step]:
                est.sample(float(now - sent_at[i]), per_round)
            self.cwnd.on_results(est.recent_min, len(once), now, self.window_path_rtt(), est.srtt, self.granted)
        if len(once) != len(sel):
            path, probe = est.path_rtt, False
            for i in sel:
                if tries[i]:
                    if now - sent_at[i] < path:
                        self._spurious(i, now)
                    elif not self.early[i]:
                        probe = True
            if probe:
                self.probe_answered = True
        if once:
            self.probe_answered = False  # with results of first sends: the probe met a late peer
            latest: dict[int, int] = {}  # class -> its latest transmission; of a run (same time), the highest chunk
            for i in once:
                c = 0 if self.classes is None else int(self.classes[i])
                k = latest.get(c)
                if k is None or sent_at[i] > sent_at[k] or (sent_at[i] == sent_at[k] and i > k):
                    latest[c] = i
            for c in sorted(latest):
                k = latest[c]
                self._evidence(k, float(sent_at[k]), float(now - sent_at[k]))

    def duplicate(self, i: int) -> None:
        """Another result for chunk ``i``, which already has one."""
        if self.tries[i] == 1:
            self._spurious(i)

    # ------------------------------------------------------------------ loss detection

    def reorder_window(self) -> float:
        """An eighth of the path's round trip (``REORDER_SHARE``), at least ``REORDER_FLOOR``. RACK widens it after spurious
        early resends; here it stays (``MAX_REORDER_MULT``): when a peer loses a chunk every worker's RACK
        resends it, spuriously but for one packet, and a wider window would only delay the recoveries
        that are needed."""
        est = self.rtt
        w = max(est.path_rtt * REORDER_SHARE, REORDER_FLOOR) * self.reorder_mult
        return min(w, max(est.srtt, REORDER_FLOOR)) if est.samples else w

    def resend_timeout(self) -> float:
        """How long a resent chunk may stay unanswered before it is resent again: one smoothed round trip (SRTT,
        at least the recent shortest) and two reorder windows, at least ``rto_min``, without backoff (a resend
        lost too would otherwise cost the whole job a timeout). A resend's answer waits for what every INA
        result waits for, the queue and the skew between workers (SRTT covers both; the shortest recent round
        trip does not), and, when a peer lost the chunk too, for that peer's resend: timed by the shortest
        round trip, two thirds of the second resends at 5 % loss in experiment 4 were answered by the first
        (their result came less than a path round trip after the second; docs/experiments.md)."""
        return max(max(self.rtt.srtt, self.recent_min()) + 2 * self.reorder_window(), self.rtt.rto_min)

    def peer_wait(self) -> float:
        """With loss signals, how much longer than RACK's usual wait a hole no signal named is left alone: it is a
        peer's loss (the peer learns of it when RACK would, then its resend takes a round trip behind its own
        queue), a lane lagging after a peer's lost result, or, rarely, a signal lost on the way. The
        retransmission timeout (SRTT + 4 RTTVAR, at least SRTT + ``rto_min``), at least the resend timeout: one
        smoothed round trip alone resent ~80 % of these holes needlessly at 5 %
        loss in experiment 4."""
        return max(self.resend_timeout(), self.rtt.rto)

    def short_wait(self) -> float:
        """One recent shortest round trip (with path classes, the longest class's: ``recent_min``) and two
        reorder windows, at least ``rto_min``."""
        return max(self.recent_min() + 2 * self.reorder_window(), self.rtt.rto_min)

    def lost(self, got: np.ndarray, lo: int, hi: int, now: float, queued: bytearray) -> list[int]:
        """Outstanding chunks in ``[lo, hi)`` found lost: sent once before the latest-sent chunk with a
        result (of the same path class) and overdue by ``min(rack_rtt, recent_min) + reorder window`` (RACK;
        results of one worker's chunks on one path come back in sending order, so the later chunk's result is the evidence, and the round trip only allows
        for reordering), or resent and unanswered for ``resend_timeout``."""
        self.rack_dirty = False
        self.rack_timer = float("inf")
        if hi <= lo:
            return []
        t = self.sent_at[lo:hi]
        idx = np.arange(lo, hi)
        out = (got[lo:hi] == 0) & (np.frombuffer(queued, dtype=np.uint8)[lo:hi] == 0)
        resent = np.frombuffer(self.tries, dtype=np.uint8)[lo:hi] > 0
        cand = out & ~resent
        c = self.classes[lo:hi] if self.classes is not None else np.zeros(hi - lo, dtype=np.int64)
        cand &= self._overtaken(lo, hi, t)
        wait = np.minimum(self._rtt[c], self.rtt.recent_min)
        if self.signals:  # this worker's own losses are signalled by the switch: an unsignalled one is a peer's
            wait = wait + self.peer_wait()
        due = np.where(resent, t + self.resend_timeout(), t + (wait + self.reorder_window()))
        pending = cand | (out & resent)
        if not pending.any():
            return []
        over = pending & (due <= now)
        rest = pending & ~over
        if rest.any():
            self.rack_timer = float(due[rest].min())
        return [int(i) for i in idx[over]]

    def on_timeout(self, got: np.ndarray, lo: int, hi: int, now: float, queued: bytearray,
                   after: float | None = None) -> list[int]:
        """The window's timer (or tail probe) fired (its oldest outstanding chunk is ``lo``): what to resend.

        Every chunk in ``[lo, hi)`` outstanding for ``after`` (default: a timeout) that a later-sent chunk's
        result overtook (of its path class: results come back in sending order, so it was lost), or after
        an answered probe; else only ``lo``, as a probe. A chunk sent before the latest result *arrived* but
        after the latest-answered chunk was *sent* is merely behind it (in a queue, or waiting at the switch
        for a late peer): resending such chunks at a timeout resent a window's whole queue spuriously
        (experiment 1, grants of 2-4x the BDP).

        A probe counts as answered only while no result of a chunk sent once came after it (see
        ``delivered``): when the late original of a stalled peer answers it, the rest of the window follows.
        """
        probe_answered, self.probe_answered = self.probe_answered, False
        t = self.sent_at[lo:hi]
        wait = self.rtt.rto if after is None else after
        cand = (got[lo:hi] == 0) & (np.frombuffer(queued, dtype=np.uint8)[lo:hi] == 0) & (t + wait <= now)
        if not probe_answered:
            cand &= self._overtaken(lo, hi, t)
        lost = [int(i) + lo for i in np.flatnonzero(cand)]
        return lost if lost else [lo]

    def _overtaken(self, lo: int, hi: int, t: np.ndarray) -> np.ndarray:
        """Chunks ``[lo, hi)`` (sent at ``t``) sent before the latest-sent chunk with a result of their class."""
        idx = np.arange(lo, hi)
        c = self.classes[lo:hi] if self.classes is not None else np.zeros(hi - lo, dtype=np.int64)
        xmit, last = self._xmit[c], self._idx[c]
        return (last >= 0) & ((t < xmit) | ((t == xmit) & (idx < last)))

    def tail_deadline(self, lo: int, all_sent: bool = False, alone: bool = False) -> float:
        """When a stalled window sends its tail probe (TLP, RFC 8985): results have stopped for twice the
        recent shortest round trip plus the reorder window, long before the timeout (which also covers
        the skew between workers and backs off). A lost tail has no later chunk to reveal it to RACK.

        ``all_sent``: the window has sent its last chunk, and ``lo`` was in flight when the latest result
        came: then the probe goes after ``short_wait`` (one shortest round trip, two reorder windows). The
        link is idle there, so a probe costs no time; and it happens once per window, so even a spurious
        one is one chunk in a call. A stall in the middle of a window (every chunk a tail at windows 1-4)
        keeps ``tail_wait``: a peer descheduled on the loaded machine stalls results as a lost tail would
        (one round trip there resent 3-28 % of chunks spuriously at windows 1-4 and 10 ms)."""
        if self.tail_probed or not self.last_new:  # before the window's first result: a late peer, not a tail
            return float("inf")
        # ``alone``: one chunk in flight in the middle of the window (a window of 1). A probe there is the timer's
        # resend, only sooner and without its lesson: the timer acts (docs/agent.md, "Loss recovery").
        if all_sent and float(self.sent_at[lo]) < self.last_new:  # the window's own tail: see the docstring
            return self.last_new + self.short_wait()
        if alone:
            return float("inf")
        return max(self.last_new, float(self.sent_at[lo])) + self.tail_wait()

    def tail_wait(self) -> float:
        """Twice the recent shortest round trip plus the reorder window, at least ``rto_min`` (as Linux
        floors its probe timeout: below that, a worker descheduled for a moment looks like a lost tail) and
        at least SRTT + RTTVAR: a needless timeout or probe raises both (``RttEstimator.spurious_timeout``), so
        the next stall of that length is waited out by the probe as by the timer (with the timer alone raised,
        the probe took over its needless resends at a window of 4 on the loaded machine).

        One round trip plus two reorder windows (it would save a round trip per lost tail) resent 3-28 % of chunks spuriously at windows 1-4 and a 10 ms round trip on the
        loaded machine: there every chunk is a tail, and a peer descheduled for longer than the margin
        stalls the results as a lost chunk would."""
        est = self.rtt
        return max(2 * self.recent_min() + self.reorder_window(), est.rto_min, est.srtt + est.rttvar)

    def window_path_rtt(self) -> float:
        """The round trip the congestion window's floor and queue target take: with path classes (Rina's chains
        of different lengths) the mean of the classes' shortest recent round trips, since a window of W chunks
        spread over every class holds W / rate x that mean in flight (the shortest class's made the floor a
        fraction of the window, which every round cut further); else the shortest seen."""
        base = self.rtt.path_rtt
        if self.class_rtts:
            mins = [min(d) for d in self.class_rtts if d]
            if mins:
                return max(base, sum(mins) / len(mins))
        return base

    def recent_min(self) -> float:
        """The estimator's recent shortest round trip, or with path classes the longest class's."""
        base = self.rtt.recent_min
        if self.class_rtts:
            return max([base] + [min(d) for d in self.class_rtts if d])
        return base

    def dump_trace(self, folder: Path, first_chunk: int, worker_id: int, started: float) -> None:
        """Append this window's timeline to ``folder/w<worker>-<pid>.jsonl`` (``StreamOptions.flight_trace``: where a
        lost chunk's time goes; docs/agent.md, "Flight traces"). Times are seconds after ``started`` (the window's
        start on the monotonic clock, which every agent on the machine shares)."""
        if not self.trace:
            return
        rec = {"worker": worker_id, "first_chunk": first_chunk, "i0": self.i0, "granted": self.granted,
               "path_rtt": self.rtt.path_rtt, "srtt": self.rtt.srtt, "rto": self.rtt.rto, "started": started,
               "first_at": [round(float(x) - started, 6) for x in self.first_at],
               "result_at": [round(float(x) - started, 6) for x in self.result_at],
               "resends": [(i, round(t - started, 6), e) for i, t, e in self.resends],
               "cwnd": [(round(t - started, 6), round(c, 2)) for t, c in self.windows]}
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"w{worker_id}-{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    def rto_deadline(self, lo: int) -> float:
        """When the window's timer fires, given its oldest outstanding chunk ``lo``."""
        return max(self.last_new, float(self.sent_at[lo])) + self.rtt.rto
