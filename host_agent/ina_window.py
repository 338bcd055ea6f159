"""A worker's INA sender: SwitchML's sliding window over its switch's slots, with ATP-style loss recovery.

Chunk ``g`` of the stream goes to slot ``(g - base) mod S`` and shadow copy ``((g - base) div S) mod 2`` with
``seq = g mod 2**32``, and ``g + S`` is sent only after the result of ``g`` (SwitchML's rule: the other copy of
the slot keeps the previous round until every worker has moved on). ``InaSender`` is what one worker keeps
from window to window (its round-trip estimator, congestion window, transmission counter, pacing); each
``InaSender.run`` is one ``InaWindow``, whose turn reads like the worker's algorithm:

1. **receive results** (``ResultBatch``: a drain of the socket, applied together);
2. **loss signals**: chunks the switch's gap reports or a result's ``PREV_DONE`` named lost go first;
3. **RACK**: a chunk overtaken by a later one's result is lost once a reorder window has passed (``Flight``);
4. **tail probe and timeout**: a stalled window resends its oldest chunk, the timer the overdue ones;
5. **resend** what was found lost;
6. **send the window**: new chunks that the slots (``i - S`` has its result), the congestion window
   (``CongestionWindow``), the reorder guard and pacing allow, as runs (``DatagramIo.send_run``);
7. **wait** for a datagram, the next timer, or what holds a send back.

docs/agent.md, "The INA window" and "Loss recovery".
"""
from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from host_agent.chunks import CHUNK_BYTES, Segment
from host_agent.congestion import CongestionWindow
from host_agent.errors import AgentTimeout
from host_agent.flight import Flight
from host_agent.grant import Rack
from host_agent.options import StreamOptions
from host_agent.rtt import RttEstimator
from host_agent.stats import StreamStats
from host_agent.udp_io import DatagramIo
from inaproto import wire

__all__ = ["InaSender", "InaWindow", "ResultBatch", "gradient_packets", "queue_signalled"]

PAYLOAD = wire.INA_PAYLOAD_LEN
GRADIENT, RESULT, STATUS = int(wire.MsgType.GRADIENT), int(wire.MsgType.RESULT), int(wire.MsgType.STATUS)
F_RETRANSMIT, F_OVERFLOW = int(wire.Flags.RETRANSMIT), int(wire.Flags.OVERFLOW)
F_TX_COUNTED, F_GAP, F_PREV_DONE = int(wire.Flags.TX_COUNTED), int(wire.Flags.GAP), int(wire.Flags.PREV_DONE)
TX_MOD = wire.TX_COUNTER_MOD  # the transmission counter and a completion's seq travel mod 128
RS_BYTE = wire.INA_FIELD_OFFSETS["reserved_shadow"]  # byte of ``reserved`` (7 bits) and ``shadow`` (1)
RESULTS_PER_DRAIN = 1024  # results applied together at most (one window of a full switch)
TICK = 0.05  # s: the longest wait in a window, so that a stop is seen quickly even without a wake-up
HDR = wire.HEADER


def gradient_packets(contrib: np.ndarray, first: int, base: int, num_slots: int, job_id: int, generation: int,
                     worker_id: int, flags: int = 0) -> memoryview:
    """The GRADIENT payloads of chunks ``first, first + 1, ...`` (the rows of ``contrib``), back to back, in one pass
    (writable: with ``Flags.TX_COUNTED`` each send stamps its counter into ``reserved``)."""
    rel = np.arange(first - base, first - base + contrib.shape[0], dtype=np.int64)
    rec = np.empty(contrib.shape[0], dtype=wire.PAYLOAD_DTYPE)
    rec["msg_type"], rec["flags"], rec["job_id"], rec["generation"] = GRADIENT, flags, job_id, generation
    rec["slot"] = rel % num_slots
    rec["seq"] = (rel + base) & 0xFFFFFFFF
    rec["worker_id"] = worker_id
    rec["reserved_shadow"] = (rel // num_slots) & 1
    rec["lanes"] = contrib
    return memoryview(rec.view(np.uint8).reshape(-1))


def queue_signalled(signalled: list[int], got: bytearray, queued: bytearray, lost: deque[tuple[int, bool]]) -> int:
    """Put the chunks the switch's loss signals named lost (``ResultBatch.signalled``, emptied) at the front of
    ``lost``, in the order named, each once (a report and a ``PREV_DONE``, or two reports, may name a chunk twice).
    Returns how many were queued (chunks with a result or queued already are not)."""
    fresh = []
    for i in signalled:
        if not got[i] and not queued[i]:
            queued[i] = 1
            fresh.append(i)
    lost.extendleft((i, True) for i in reversed(fresh))
    signalled.clear()
    return len(fresh)


class InaSender:
    """What one worker's INA windows share: the socket's I/O and wake-up, the round-trip estimator, the congestion
    window, the loss signals' transmission counter, the reorder guard's and the pacing's clocks.

    ``wake()`` (any thread) ends a window's wait at once: the stream calls it when a grant or a release arrives.
    """

    def __init__(self, sock, options: StreamOptions, stats: StreamStats, *, job_id: int, worker_id: int,
                 name: str) -> None:
        self.options, self.stats, self.job_id, self.worker_id = options, stats, job_id, worker_id
        self.io = DatagramIo(sock, batched=False, name=name)
        self.rbatch = bytearray(RESULTS_PER_DRAIN * PAYLOAD + self.io.read_room)  # ResultBatch's drain buffer
        self.rtt = RttEstimator(options.rto_initial, options.rto_min, options.rto_max)
        self.cwnd = CongestionWindow(options.initial_window)
        self.reorder_mult = 1  # widening of the reorder window after spurious early resends (host_agent/flight.py)
        self.chain_rtts: list = []  # Rina on chains: recent round trips per chain (Flight's class_rtts)
        self.txn = 0  # loss signals: this worker's INA gradient frames to the job so far (the counter's source)
        self.txlog = np.full(TX_MOD, -1, dtype=np.int64)  # ... the chunk each counter value (mod 128) last carried
        self.signals_seen = False  # a result carried PREV_DONE: the switch sends loss signals
        self.guard_until = 0.0  # reorder guard: the previous window's slots are free from then on
        self.pace_gap = (wire.INA_FRAME_LEN * 8 / options.link_bps) if options.link_bps else 0.0
        self.pace_next = 0.0  # link emulation: when the next INA packet may leave
        self.wakefd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.poll = select.poll()  # the window's: the socket and the wake-up
        self.poll.register(sock, select.POLLIN)
        self.poll.register(self.wakefd, select.POLLIN)

    def wake(self) -> None:
        """End a window's wait now (from any thread)."""
        try:
            os.eventfd_write(self.wakefd, 1)
        except OSError:
            pass

    def clear_wake(self) -> None:
        try:
            os.eventfd_read(self.wakefd)
        except OSError:
            pass

    def new_generation(self, path_floor: float) -> None:
        """The stream moved to another generation (maybe another switch): measure the path afresh."""
        self.rtt.reset()
        self.rtt.path_floor = path_floor
        self.chain_rtts.clear()
        self.signals_seen = False  # ... which may not send loss signals (a chain's)

    @property
    def rto(self) -> float:
        return self.rtt.rto

    def run(self, seg: Segment, i0: int, rack: Rack, *, generation: int, base: int, check: Callable[[], None],
            caught_up: Callable[[], bool] | None = None, caught_up_at: int = 0) -> None:
        """Contribute chunks ``seg[i0:]`` to ``rack``'s switch; returns when every one has its result in ``seg``.

        ``check()`` is called every turn and raises to stop the window (a pending generation, a release).
        ``caught_up()`` is called once the window's lowest chunk without a result reaches ``caught_up_at``, and again
        every turn until it returns True."""
        InaWindow(self, seg, i0, rack, generation, base, check, caught_up, caught_up_at).run()

    def close(self) -> None:
        try:
            os.close(self.wakefd)
        except OSError:
            pass


class InaWindow:
    """One window: chunks ``seg[i0:]`` contributed to ``rack``'s switch until every one has its result.

    The state of a turn: ``got`` (the chunk has its result), ``lost`` (chunks to resend, in order, each with
    whether it was found early), ``queued`` (in ``lost``, or skipped and not sent yet: no loss detection for
    either), ``deferred`` (chunks skipped while their slot was busy), ``nxt`` (the next chunk to send) and ``lo``
    (the lowest chunk without a result)."""

    def __init__(self, sender: InaSender, seg: Segment, i0: int, rack: Rack, generation: int, base: int,
                 check: Callable[[], None], caught_up: Callable[[], bool] | None, caught_up_at: int) -> None:
        self.sender, self.seg, self.i0, self.rack = sender, seg, i0, rack
        self.check, self.caught_up, self.caught_up_at = check, caught_up, caught_up_at
        self.opts, self.stats, self.io = sender.options, sender.stats, sender.io
        self.K, self.a, self.S, self.addr = seg.K, seg.a, rack.num_slots, rack.address
        self.est, self.cwnd = sender.rtt, sender.cwnd
        self.cwnd.clamp(self.S)
        K = self.K
        self.got = bytearray(K)
        self.got[:i0] = b"\x01" * i0
        self.gotv = np.frombuffer(self.got, dtype=np.uint8)
        classes = None  # Rina on chains: each partition's results come over a chain of its own length
        if rack.chains > 1:  # one class per chain (``Rack.slot_chains``), not per slot
            rel = np.arange(self.a - base, self.a - base + K, dtype=np.int64) % self.S
            classes = np.asarray(rack.slot_chains, dtype=np.int64)[rel]
        # loss signals (docs/agent.md, "Loss signals"): a window on one path numbers its frames for the gap reports
        self.counted = classes is None
        self.pkts = gradient_packets(seg.contrib[i0:], self.a + i0, base, self.S, sender.job_id, generation,
                                     sender.worker_id, F_TX_COUNTED if self.counted else 0)
        self.col = np.frombuffer(self.pkts, dtype=np.uint8)[RS_BYTE::PAYLOAD]  # each packet's reserved:7|shadow:1
        self.flight = Flight(K, i0, self.est, self.cwnd, self.S, self.stats, sender.reorder_mult, classes,
                             sender.chain_rtts, trace=self.opts.flight_trace is not None)
        self.flight.numbered = self.counted
        self.flight.signals = self.counted and sender.signals_seen
        self.results = ResultBatch(sender, seg, self.got, i0, sender.job_id, generation, self.flight)
        self.guard, self.pace = self.opts.reorder_guard, sender.pace_gap
        self.lost: deque[tuple[int, bool]] = deque()
        self.queued = bytearray(K)
        self.unsent = bytearray(K)  # 1: skipped while its slot was busy, not sent yet (in ``deferred``)
        self.deferred: list[int] = []
        self.nxt = self.lo = i0
        self.sent = 0  # packets sent by this window (first sends)
        self.left = 0  # room left in the congestion window after this turn's sends
        self.last_progress = self.started = time.monotonic()
        # seconds held back (StreamStats.slot_wait_s, cwnd_wait_s, tail_wait_s) and what holds the next chunk now
        self.waits = {"slot": 0.0, "window": 0.0, "tail": 0.0}
        self.waiting: str | None = None
        self.wait_since = self.started
        self.cuts0, self.loss_cuts0 = self.cwnd.cuts, self.cwnd.loss_cuts

    # ------------------------------------------------------------------ the turn

    def run(self) -> None:
        if self.guard:  # the first S chunks reuse the slots of the previous window's last ones
            delay = self.sender.guard_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        results = self.results
        while results.remaining:
            self.check()
            progressed = results.drain()  # 1. receive results
            now = time.monotonic()
            if results.signalled:
                self.take_loss_signals(now)  # 2.
            if progressed:
                self.last_progress = now
            self.advance_low()
            self.rack_losses(now)  # 3.
            if self.timers(now):  # 4. (results were waiting: take them first)
                continue
            self.resend(now)  # 5.
            self.send_window(now)  # 6.
            self.account_waits(now)
            self.check_stalled(now)
            self.sleep(now, progressed)  # 7.
        self.finish()

    def take_loss_signals(self, now: float) -> None:
        """The switch's loss signals named these chunks lost: resend them first."""
        fresh = queue_signalled(self.results.signalled, self.got, self.queued, self.lost)
        if fresh:
            self.stats.signal_resends += fresh
            self.cwnd.on_loss(now, self.est.path_rtt, self.est.srtt)

    def advance_low(self) -> None:
        sent = self.results.sent
        if self.lo < sent:
            lo = self.got.find(0, self.lo, sent)
            self.lo = sent if lo < 0 else lo
            if self.caught_up is not None and self.a + self.lo >= self.caught_up_at and self.caught_up():
                self.caught_up = None  # back where the last generation change stopped it (StreamStats.pauses)

    def rack_losses(self, now: float) -> None:
        """Early (RACK): chunks overtaken by a later-sent chunk's result, a reorder window late, go to the back."""
        flight = self.flight
        if flight.rack_dirty or now >= flight.rack_timer:
            found = flight.lost(self.gotv, self.lo, self.results.sent, now, self.queued)
            if found:
                for i in found:
                    self.queued[i] = 1
                    self.lost.append((i, True))
                self.stats.early_resends += len(found)
                self.cwnd.on_loss(now, self.est.path_rtt, self.est.srtt)

    def _outstanding(self) -> bool:
        return self.lo < self.results.sent and not self.queued[self.lo]

    def _deadlines(self) -> tuple[float, float]:
        """(tail probe, timeout) of the oldest outstanding chunk. One chunk in flight (a window of 1): no tail probe
        in the middle of the window, the timer acts."""
        results, flight = self.results, self.flight
        alone = results.sent - self.K + results.remaining - len(self.deferred) <= 1
        all_sent = self.nxt >= self.K and not self.deferred
        return flight.tail_deadline(self.lo, all_sent, alone), flight.rto_deadline(self.lo)

    def timers(self, now: float) -> bool:
        """The tail probe (TLP) and the window's timeout; True if results were waiting in the socket instead (this
        worker was descheduled since the drain): merely queued, no loss."""
        if not self._outstanding():
            return False
        flight, lo, sent = self.flight, self.lo, self.results.sent
        tail_due, rto_due = self._deadlines()
        if now >= min(tail_due, rto_due) and self.results.drain():
            self.last_progress = time.monotonic()
            return True
        if tail_due <= now < rto_due:
            flight.tail_probed = True
            # one chunk, unless a probe was answered already (then the overdue tail): a worker that stalls for a
            # moment costs one packet, not a window
            probe = flight.on_timeout(self.gotv, lo, sent, now, self.queued, flight.tail_wait()) \
                if flight.probe_answered else [lo]
            self.stats.early_resends += len(probe)
            self._resend_first(probe)  # a probe: its answer lets the next one resend the tail
        if self._outstanding() and now >= flight.rto_deadline(lo):
            overdue = flight.on_timeout(self.gotv, lo, sent, now, self.queued)
            self.est.expired()
            self.cwnd.on_timeout(now, self.est.path_rtt, self.est.srtt)
            self.stats.timeouts += 1
            self._resend_first(overdue)  # the probe, or the tail after an answered probe
        return False

    def _resend_first(self, chunks: list[int]) -> None:
        for i in reversed(chunks):
            self.queued[i] = 1
            self.lost.appendleft((i, False))

    def resend(self, now: float) -> None:
        """Resend what was found lost, in order (paced like first sends)."""
        lost, got, flight, pace, sender = self.lost, self.got, self.flight, self.pace, self.sender
        while lost:
            if pace:
                if now < sender.pace_next:
                    return
                sender.pace_next = max(sender.pace_next, now - 8 * pace) + pace
            i, early = lost.popleft()
            self.queued[i] = 0
            if got[i]:
                continue
            off = (i - self.i0) * PAYLOAD
            pkt = bytearray(self.pkts[off : off + PAYLOAD])
            prev_tx = int(flight.txn[i])  # its latest frame's counter, should this one be refused
            if self.counted:
                self.stamp(i, i + 1)  # the packet's copy below carries it
                pkt[1] = F_RETRANSMIT | F_TX_COUNTED
                pkt[RS_BYTE] = self.col[i - self.i0]
            else:
                pkt[1] = F_RETRANSMIT
            self.io.send_run(memoryview(pkt), PAYLOAD, 1, self.addr, in_order=self.counted)
            if self.io.unsent:  # refused (the socket's buffer full): lost as on the link, the timer resends it
                self.give_back(i, i + 1, prev_tx)
            flight.resent(i, now, early)
            self.stats.retransmits += 1

    def send_window(self, now: float) -> None:
        """Send what the slots, the congestion window, the reorder guard and pacing allow."""
        K, S, i0 = self.K, self.S, self.i0
        self.left = 0
        if self.nxt >= K and not self.deferred:
            return
        done = K - i0 - self.results.remaining
        left = self.cwnd.limit(S) - (self.results.sent - i0 - done - len(self.deferred))
        if self.deferred:
            left = self.send_deferred(now, left)
        if left > 0 and self.nxt < K:
            left = self.send_runs(now, left) if not self.guard and not self.pace else self.send_paced(now, left)
        self.left = left

    def send_deferred(self, now: float, left: int) -> int:
        """Chunks skipped while their slot was busy go once it is free, in order, whatever the window: they are older
        than every chunk in flight, and a window cut since the skip could fill with chunks whose peers wait for these
        (a deadlock: 8 workers at 5 % loss stalled until timeout). Returns the room left."""
        got, S, deferred = self.got, self.S, self.deferred
        for j in [j for j in deferred if got[j - S]]:
            self.stamp(j, j + 1)
            self.io.send_run(self.pkts[(j - self.i0) * PAYLOAD :], PAYLOAD, 1, self.addr, in_order=self.counted)
            if self.io.unsent:  # refused (the socket's buffer full): it stays skipped, sent next turn
                self.give_back(j, j + 1)
                break
            deferred.remove(j)
            self.unsent[j] = self.queued[j] = 0
            self.flight.sent(j, j + 1, now)
            self.sent += 1
            left -= 1
        return left

    def send_runs(self, now: float, left: int) -> int:
        """Runs up to the first chunk whose slot is still busy; SwitchML's slots are independent lanes, so that chunk
        is skipped (sent once its slot's result comes) and the link keeps carrying the other lanes' chunks while a
        loss is recovered (docs/agent.md, "Loss recovery")."""
        K, S, i0, got, io = self.K, self.S, self.i0, self.got, self.io
        nxt = self.nxt
        while left > 0 and nxt < K:
            upper = min(K, nxt + left)
            lo_s = max(nxt - S, i0)
            busy = got.find(0, lo_s, upper - S) if upper - S > lo_s else -1
            end = upper if busy < 0 else busy + S
            if end > nxt:
                self.stamp(nxt, end)
                io.send_run(self.pkts[(nxt - i0) * PAYLOAD :], PAYLOAD, end - nxt, self.addr, in_order=self.counted)
                refused = io.unsent  # the socket's buffer full: the rest go next turn
                if refused:
                    self.give_back(end - refused, end)
                    end -= refused
                self.flight.sent(nxt, end, now)
                self.sent += end - nxt
                left -= end - nxt
                nxt = end
                if refused:
                    break
            if busy < 0 or left <= 0 or len(self.deferred) >= S:  # done, full, or a slot count of chunks skipped
                break
            self.skip(nxt, busy)
            nxt += 1
        self.nxt = self.results.sent = nxt
        return left

    def skip(self, j: int, busy: int) -> None:
        """Chunk ``j``'s slot still waits for the result of ``busy``: ``j`` is sent once it comes."""
        self.deferred.append(j)
        self.unsent[j] = self.queued[j] = 1  # queued: no loss detection for a chunk not sent yet
        lag, k = 1, busy  # chunks of this lane now skipped (StreamStats.lane_lag_max)
        while k >= self.i0 and self.unsent[k]:
            lag, k = lag + 1, k - self.S
        self.stats.lane_lag_max = max(self.stats.lane_lag_max, lag)

    def send_paced(self, now: float, left: int) -> int:
        """In order, each chunk once its slot is free, no earlier than the reorder guard and the pacing allow."""
        K, S, i0, got, sender = self.K, self.S, self.i0, self.got, self.sender
        first = nxt = self.nxt
        upper = min(K, nxt + left)
        last_tx = self.flight.sent_at
        while nxt < upper and (nxt - S < i0 or got[nxt - S]):
            if self.guard and nxt - S >= i0 and now < last_tx[nxt - S] + self.guard:
                break
            if self.pace:
                if now < sender.pace_next:
                    break
                sender.pace_next = max(sender.pace_next, now - 8 * self.pace) + self.pace  # bursts of <= 8 after a late wake-up
            nxt += 1
        if nxt > first:
            self.stamp(first, nxt)
            self.io.send_run(self.pkts[(first - i0) * PAYLOAD :], PAYLOAD, nxt - first, self.addr, in_order=self.counted)
            if self.io.unsent:  # the socket's buffer full: the rest go next turn
                self.give_back(nxt - self.io.unsent, nxt)
                nxt -= self.io.unsent
            self.results.sent = nxt
            self.flight.sent(first, nxt, now)
            self.sent += nxt - first
            left -= nxt - first
        self.nxt = nxt
        return left

    # ------------------------------------------------------------------ loss signals' counter

    def stamp(self, first: int, end: int) -> None:
        """Number chunks ``[first, end)``, about to go in this order, with the next transmission counters."""
        if not self.counted:
            return
        sender, col, i0, a = self.sender, self.col, self.i0, self.a
        tx = sender.txn
        if end - first == 1:
            col[first - i0] = ((tx % TX_MOD) << 1) | (col[first - i0] & 1)
            self.flight.txn[first] = tx
            sender.txlog[tx % TX_MOD] = a + first
        else:
            txs = np.arange(tx, tx + end - first, dtype=np.int64)
            c = col[first - i0 : end - i0]
            c[:] = ((txs % TX_MOD) << 1).astype(np.uint8) | (c & 1)
            self.flight.txn[first:end] = txs
            sender.txlog[txs % TX_MOD] = np.arange(a + first, a + end, dtype=np.int64)
        sender.txn = tx + end - first

    def give_back(self, first: int, end: int, prev: int = -1) -> None:
        """Chunks ``[first, end)``, the last stamped, did not go (the socket refused them): their counters go to the
        next frames, so the switch sees no gap (``DatagramIo.send_run``'s ``in_order``)."""
        if self.counted:
            self.sender.txn -= end - first
            self.flight.txn[first:end] = prev  # a first send: never numbered; a resend: its previous frame's

    # ------------------------------------------------------------------ time

    def account_waits(self, now: float) -> None:
        """Where the time goes (``StreamStats.*_wait_s``): what holds the next chunk back until the next turn."""
        if self.waiting is not None:
            self.waits[self.waiting] += now - self.wait_since
        self.wait_since = now
        nxt, S, i0 = self.nxt, self.S, self.i0
        if nxt >= self.K and not self.deferred:
            self.waiting = "tail"
        elif self.left <= 0:
            self.waiting = "window"  # the congestion window (or the grant) is full
        elif self.deferred or (nxt - S >= i0 and not self.got[nxt - S]):
            self.waiting = "slot"  # room in the window, but the slot's previous chunk has no result: a hole
        else:
            self.waiting = None

    def check_stalled(self, now: float) -> None:
        if now - self.last_progress > self.opts.op_timeout:
            first = self.got.find(0)
            raise AgentTimeout(
                f"worker {self.sender.worker_id}: no result from switch {self.rack.switch} at {self.addr[0]}:"
                f"{self.addr[1]} for {self.opts.op_timeout}s (job {self.sender.job_id}, generation "
                f"{self.results.gen}, chunk {self.a + (first if first >= 0 else self.K)})")

    def sleep(self, now: float, progressed: bool) -> None:
        """Wait for a datagram, the next timer, or the pacing/guard that holds a send back."""
        if progressed:
            # after progress, once more at once: at high rates the next results are there already (polling instead
            # halved the agent's rate through bench/agent_bench.py's echo)
            return
        wake = now + TICK
        if self._outstanding():
            wake = min(wake, *self._deadlines())
        wake = min(wake, self.flight.rack_timer)
        nxt, S, i0 = self.nxt, self.S, self.i0
        held = bool(self.guard or self.pace) and nxt < self.K and self.left > 0 \
            and (nxt - S < i0 or self.got[nxt - S])  # by pacing or the guard
        if self.lost or held:
            hold = self.sender.pace_next if self.pace else now
            if held and not self.lost and self.guard and nxt - S >= i0:
                hold = max(hold, self.flight.sent_at[nxt - S] + self.guard)
            wake = min(wake, hold)
        wait = wake - now
        if wait > 0:
            self.sender.poll.poll(wait * 1000.0)

    def finish(self) -> None:
        stats, sender, flight, est, cwnd = self.stats, self.sender, self.flight, self.est, self.cwnd
        if self.waiting is not None:
            self.waits[self.waiting] += time.monotonic() - self.wait_since
        stats.slot_wait_s += self.waits["slot"]
        stats.cwnd_wait_s += self.waits["window"]
        stats.tail_wait_s += self.waits["tail"]
        stats.window_cuts += cwnd.cuts - self.cuts0
        stats.loss_cuts += cwnd.loss_cuts - self.loss_cuts0
        sender.reorder_mult = flight.reorder_mult
        if est.samples:
            stats.path_rtt_s, stats.srtt_s = est.path_rtt, est.srtt
        if self.guard and self.sent:
            sender.guard_until = float(flight.sent_at.max()) + self.guard
        stats.packets_sent += self.sent
        stats.results += self.K - self.i0
        if self.opts.flight_trace is not None:
            flight.dump_trace(Path(self.opts.flight_trace), self.a, sender.worker_id, self.started)


class ResultBatch:
    """Applies the switch's RESULTs of one window, drained in batches, to the window's state.

    A result counts if it is of this job and generation and its chunk was sent and has no result yet
    (the first copy wins; duplicates and late copies count as ``ignored``, other generations as
    ``stale``), exactly as one datagram at a time would. A STATUS is a gap report; anything else is
    ignored. Short batches are applied in a plain loop, long ones with numpy; either way the window's
    bookkeeping (round-trip samples, congestion window, RACK) is done once per batch.
    """

    VECTOR_FROM = 64  # results per batch from which numpy is faster than the loop (105 vs 115 us at 64)

    def __init__(self, sender: InaSender, seg: Segment, got: bytearray, i0: int, job: int, gen: int,
                 flight: Flight) -> None:
        self.sender, self.stats, self.seg, self.got, self.i0, self.job, self.gen = \
            sender, sender.stats, seg, got, i0, job, gen
        self.flight = flight  # send times, round-trip samples, RACK, spurious resends
        self.remaining = seg.K - i0
        self.sent = i0  # chunks [i0, sent) were sent at least once
        self.now = 0.0  # when the batch being applied was read
        self.buf = sender.rbatch
        self.view = memoryview(self.buf)
        self.progressed = False
        self.signalled: list[int] = []  # chunks the switch's loss signals name lost (docs/agent.md, "Loss signals")

    def drain(self) -> bool:
        """Take every datagram waiting; True if any chunk got its result."""
        self.progressed = False
        io, view = self.sender.io, self.view
        room = io.read_room
        while True:
            kept = io.drain(view, self._on_run)
            self.now = time.monotonic()
            if kept:
                self._apply(kept // PAYLOAD)
            if kept <= len(view) - room:
                break
        return self.progressed

    def _on_run(self, off: int, size: int, count: int) -> int:
        """Keep a RESULT at ``off``; a STATUS is a gap report; anything else is ignored."""
        buf = self.buf
        if size == PAYLOAD and buf[off] == RESULT:
            return PAYLOAD
        if size == wire.INA_HEADER_LEN and buf[off] == STATUS:
            self._status(off)
        else:
            self.stats.ignored += 1
        return 0

    def _status(self, off: int) -> None:
        """A gap report (``Flags.GAP``) of this job and generation; any other STATUS is ignored."""
        _mt, fl, jid, g, slot, _seq, _w, _last = HDR.unpack_from(self.buf, off)
        if jid != self.job or g != self.gen:
            self.stats.stale += 1
        elif fl & F_GAP:
            self._gap(slot, _last >> 1)
        else:
            self.stats.ignored += 1

    def _gap(self, count: int, revealed: int) -> None:
        """A gap report (a STATUS, or a result to this worker's frame that revealed it): the ``count`` frames this
        worker sent before the one numbered ``revealed`` (mod 128) did not reach the switch. Each one's chunk is lost
        if that frame is still its latest transmission and it has no result (the report may name frames the switch
        answered, or whose chunk went again since)."""
        flight, got, txlog = self.flight, self.got, self.sender.txlog
        self.stats.gap_reports += 1
        if not flight.numbered:
            return
        a, i0, sent = self.seg.a, self.i0, self.sent
        for k in range(1, min(count, TX_MOD - 1) + 1):
            tx = (revealed - k) % TX_MOD
            i = int(txlog[tx]) - a
            if i0 <= i < sent and not got[i] and flight.txn[i] >= 0 and flight.txn[i] % TX_MOD == tx:
                self.signalled.append(i)  # (-1, never numbered, is 127 mod 128)

    def _prev_done(self, pairs: list[tuple[int, int]]) -> None:
        """Results that carried ``Flags.PREV_DONE``: each ``(i, p)`` is a result's chunk and the low 7 bits of the
        job's completion before it. That completion's chunk without a result here lost its result on the way:
        resend it (the switch answers a completed copy's sender alone). It is looked for within half the counter
        space of ``i`` (``TX_LATE_HALF``) among the window's outstanding chunks (sent, no result), and resent only if it
        is the one chunk there with those bits (where lanes lag by 64 chunks or more, the chunks 64 below and 64 above
        ``i`` are equally plausible) and did not go again less than a one-way trip ago (that answer is on its way)."""
        flight, got = self.flight, self.got
        if not flight.signals:
            self.sender.signals_seen = flight.signals = flight.numbered
            if not flight.signals:
                return
        a, i0, sent, half = self.seg.a, self.i0, self.sent, wire.TX_LATE_HALF
        recent = self.now - 0.5 * flight.rtt.path_rtt
        sent_at = flight.sent_at
        for i, p in pairs:
            c = i - half + (p - (i - half + a)) % TX_MOD  # the lowest chunk at or above i - 64 with seq mod 128 == p
            found = [k for k in (c, c + TX_MOD) if k <= i + half and i0 <= k < sent and not got[k] and sent_at[k] > 0]
            if len(found) == 1 and sent_at[found[0]] < recent:
                self.signalled.append(found[0])

    def _apply(self, m: int) -> None:
        if m < self.VECTOR_FROM:
            self._apply_few(m)
        else:
            self._apply_many(m)

    def _apply_few(self, m: int) -> None:
        """A short batch in plain Python: each result's checks and copy, then the window's bookkeeping once for the
        batch (``Flight.delivered_few``, as ``_apply_many`` does with numpy): the per-result updates of the
        estimator and the congestion window were two thirds of a result's cost."""
        stats, got, buf, flight = self.stats, self.got, self.buf, self.flight
        job, gen, a, i0, sent = self.job, self.gen, self.seg.a, self.i0, self.sent
        values, flags, src = self.seg.res32, self.seg.flag, self.seg.src
        unpack, hdr, cb = HDR.unpack_from, wire.INA_HEADER_LEN, CHUNK_BYTES
        sel: list[int] = []
        prev: list[tuple[int, int]] = []
        gaps: list[int] = []
        for off in range(0, m * PAYLOAD, PAYLOAD):
            _mt, fl, jid, g, slot, seq, _w, last = unpack(buf, off)
            if jid != job or g != gen:
                stats.stale += 1
                continue
            i = (seq - a) & 0xFFFFFFFF
            if fl & F_PREV_DONE:
                prev.append((i, last >> 1))
            if fl & F_GAP:  # this worker's frame that the switch delivered revealed a gap: slot = lost << 7 | counter
                gaps.append(slot)
            if i >= sent or i < i0 or got[i]:
                stats.ignored += 1
                if i0 <= i < sent:
                    flight.duplicate(i)
                continue
            got[i] = 1
            sel.append(i)
            values[i * cb : i * cb + cb] = buf[off + hdr : off + PAYLOAD]
            if fl & F_OVERFLOW:
                flags[i] = 1
            src[i] = 1
        if sel:
            self.remaining -= len(sel)
            self.progressed = True
            flight.delivered_few(sel, self.now)
        for gap in gaps:
            self._gap(*wire.split_gap_slot(gap))
        if prev and flight.numbered:
            self._prev_done(prev)

    def _apply_many(self, m: int) -> None:
        stats = self.stats
        rec = np.frombuffer(self.buf, dtype=wire.PAYLOAD_DTYPE, count=m)
        ours = (rec["job_id"] == self.job) & (rec["generation"] == self.gen)
        stats.stale += m - int(np.count_nonzero(ours))
        idx = (rec["seq"].astype(np.int64) - self.seg.a) & 0xFFFFFFFF
        got = np.frombuffer(self.got, dtype=np.uint8)
        inwin = ours & (idx >= self.i0) & (idx < self.sent)
        ok = inwin.copy()
        ok[ok] = got[idx[ok]] == 0
        pos = np.flatnonzero(ok)
        if pos.size:
            _, first = np.unique(idx[pos], return_index=True)  # the first copy of a chunk in the batch wins
            if first.size != pos.size:
                pos = pos[np.sort(first)]
        stats.ignored += int(np.count_nonzero(ours)) - int(pos.size)
        prev = ours & ((rec["flags"] & F_PREV_DONE) != 0) if self.flight.numbered else None
        if int(np.count_nonzero(inwin)) != pos.size:  # duplicates of chunks in the window
            dup = inwin.copy()
            dup[pos] = False
            for i in idx[dup]:
                self.flight.duplicate(int(i))
        if pos.size:
            self._take(rec, pos, idx[pos])
        gaps = ours & ((rec["flags"] & F_GAP) != 0)
        if gaps.any():  # gaps this worker's delivered frames revealed: slot = lost << 7 | counter
            for gap in rec["slot"][gaps].tolist():
                self._gap(*wire.split_gap_slot(gap))
        if prev is not None and prev.any():
            self._prev_done(list(zip(idx[prev].tolist(), (rec["reserved_shadow"][prev] >> 1).tolist())))

    def _take(self, rec: np.ndarray, pos: np.ndarray, sel: np.ndarray) -> None:
        """The first results of chunks ``sel`` (at ``pos`` of the batch ``rec``)."""
        np.frombuffer(self.got, dtype=np.uint8)[sel] = 1
        self.remaining -= int(pos.size)
        self.progressed = True
        np.frombuffer(self.seg.res32, dtype=wire.LANES_DTYPE).reshape(-1, wire.LANES)[sel] = rec["lanes"][pos]
        over = (rec["flags"][pos] & F_OVERFLOW) != 0
        if over.any():
            np.frombuffer(self.seg.flag, dtype=np.uint8)[sel[over]] = 1
        np.frombuffer(self.seg.src, dtype=np.uint8)[sel] = 1
        self.flight.delivered_many(sel, self.now)
