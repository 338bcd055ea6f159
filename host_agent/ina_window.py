"""The stream's INA phase: a worker's side of SwitchML's sliding window over its switch's slots.

Chunk ``g`` of the stream goes to slot ``(g - base) mod S`` and shadow copy ``((g - base) div S) mod 2`` with
``seq = g mod 2**32``, and ``g + S`` is sent only after the result of ``g``; lost packets are resent after an
RTO that follows the measured round trips (docs/agent.md, "Loss recovery"). ``InaPhase`` is a part of
``host_agent.stream.ChunkStream`` (which it is mixed into): it uses the stream's socket, generation, base,
options, stats and interrupt flags.
"""
from __future__ import annotations

import enum
import time
from collections import deque

import numpy as np

from host_agent.chunks import CHUNK_BYTES, Segment
from host_agent.errors import AgentTimeout, Interrupted, JobReleased
from host_agent.flight import Flight, QueryMode, QueryState
from host_agent.grant import Rack
from inaproto import wire

__all__ = ["InaPhase", "ResultBatch", "WindowMode", "gradient_packets", "queue_signalled"]

PAYLOAD = wire.INA_PAYLOAD_LEN
GRADIENT, RESULT = int(wire.MsgType.GRADIENT), int(wire.MsgType.RESULT)
QUERY, STATUS = int(wire.MsgType.QUERY), int(wire.MsgType.STATUS)
F_RETRANSMIT, F_OVERFLOW, F_HELD = int(wire.Flags.RETRANSMIT), int(wire.Flags.OVERFLOW), int(wire.Flags.HELD)
F_TX_COUNTED, F_GAP, F_PREV_DONE = int(wire.Flags.TX_COUNTED), int(wire.Flags.GAP), int(wire.Flags.PREV_DONE)
TX_MOD = wire.TX_COUNTER_MOD  # the transmission counter and a completion's seq travel mod 128
_RS = wire.INA_FIELD_OFFSETS["reserved_shadow"]  # byte of ``reserved`` (7 bits) and ``shadow`` (1)
QUERIES_UNANSWERED = 3  # queries timed out, none ever answered: the switch does not answer them (a chain's); stop
_HDR = wire.HEADER


class WindowMode(enum.Enum):
    """What the switch's results of a window are to the worker."""

    FINAL = "final"  # the job's sums (plain INA)
    PARTIAL = "partial"  # the rack's partial sums, for the cross-rack ring (Rina representative)
    MEMBER = "member"  # they only move the window; global sums arrive as BROADCASTs (Rina rack worker)


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


def queue_signalled(signalled: list[int], got: bytearray, queued: bytearray, named: bytearray,
                    lost: deque[tuple[int, bool]]) -> int:
    """Put the chunks the switch's loss signals named lost (``ResultBatch.signalled``, emptied) at the front of
    ``lost``, in the order named, each once (a report and a ``PREV_DONE``, or two reports, may name a chunk twice),
    and mark every named chunk without a result in ``named`` (its payload goes, never a query: the switch lacks its
    gradient or its answer). Returns how many were queued (chunks with a result or queued already are not)."""
    fresh = []
    for i in signalled:
        if not got[i]:
            named[i] = 1
            if not queued[i]:
                queued[i] = 1
                fresh.append(i)
    lost.extendleft((i, True) for i in reversed(fresh))
    signalled.clear()
    return len(fresh)


class InaPhase:
    """The SwitchML window, its loss recovery and congestion window (mixed into ChunkStream)."""

    def _ina_window(self, seg: Segment, i0: int, rack: Rack, mode: WindowMode) -> tuple[bytearray, bytearray] | None:
        """Contribute chunks ``seg[i0:]`` to ``rack``'s switch under the SwitchML window.

        Returns when every chunk has its switch result: for ``WindowMode.PARTIAL`` the rack's partial sums
        and their overflow flags (one byte per chunk), else None (see ``WindowMode``).

        Each turn: drain the results (``ResultBatch``, applied together), find lost chunks (``Flight``:
        early by RACK, else the window's timeout), resend them, then send the new chunks that the slots
        (chunk ``i`` after the result of ``i - S``), the congestion window (``CongestionWindow``), the
        reorder guard and pacing allow, as one run (``DatagramIo.send_run``: GSO batches of up to 64).
        """
        K, a = seg.K, seg.a
        S = rack.num_slots
        base = self._base
        addr = rack.address
        job, gen, wid = self.job_id, self._generation, self.worker_id
        io, poll = self._io, self._wpoll
        got = bytearray(K)  # 1: the chunk has its switch result
        got[:i0] = b"\x01" * i0
        gotv = np.frombuffer(got, dtype=np.uint8)
        final = mode is WindowMode.FINAL
        partial = bytearray(K * CHUNK_BYTES) if mode is WindowMode.PARTIAL else None
        pflag = bytearray(K) if mode is WindowMode.PARTIAL else None
        est, cwnd = self._rtt, self._cwnd
        cwnd.clamp(S)
        classes = None  # Rina on chains: each partition's results come over a chain of its own length
        if rack.chains > 1:  # one class per chain (``Rack.slot_chains``), not per slot
            classes = np.asarray(rack.slot_chains, dtype=np.int64)[np.arange(a - base, a - base + K, dtype=np.int64) % S]
        # loss signals (docs/agent.md, "Loss signals"): plain INA numbers its frames for the switch's gap reports
        counted = final and classes is None and self.options.loss_signals
        pkts = gradient_packets(seg.contrib[i0:], a + i0, base, S, job, gen, wid, F_TX_COUNTED if counted else 0)
        flight = Flight(K, i0, est, cwnd, S, self.stats, self._reorder_mult, classes, self._chain_rtts)
        flight.numbered = counted
        flight.signals = counted and self._signals_seen
        txlog = self._txlog
        if counted:
            col = np.frombuffer(pkts, dtype=np.uint8)[_RS::PAYLOAD]  # each packet's reserved:7 | shadow:1 byte

            def stamp(first: int, end: int) -> None:
                """Number chunks ``[first, end)``, about to go in this order, with the next transmission counters."""
                tx = self._txn
                if end - first == 1:
                    col[first - i0] = ((tx % TX_MOD) << 1) | (col[first - i0] & 1)
                    flight.txn[first] = tx
                    txlog[tx % TX_MOD] = a + first
                else:
                    txs = np.arange(tx, tx + end - first, dtype=np.int64)
                    c = col[first - i0 : end - i0]
                    c[:] = ((txs % TX_MOD) << 1).astype(np.uint8) | (c & 1)
                    flight.txn[first:end] = txs
                    txlog[txs % TX_MOD] = np.arange(a + first, a + end, dtype=np.int64)
                self._txn = tx + end - first

            def give_back(first: int, end: int, prev: int = -1) -> None:
                """Chunks ``[first, end)``, the last stamped, did not go (the socket refused them): their counters
                go to the next frames, so the switch sees no gap (``DatagramIo.send_run``'s ``in_order``)."""
                self._txn -= end - first
                flight.txn[first:end] = prev  # a first send: never numbered; a resend: its previous frame's
        else:
            def stamp(first: int, end: int) -> None:
                pass

            def give_back(first: int, end: int, prev: int = -1) -> None:
                pass
        qstate = flight.qstate
        # queries in place of RACK's resends (docs/agent.md, "Queries"): a single switch answers them
        qmode = self.options.queries
        queries = qmode is not QueryMode.OFF and classes is None and self._queries_unanswered < QUERIES_UNANSWERED
        query_first = qmode is QueryMode.FIRST
        results = ResultBatch(self, seg, got, i0, job, gen, rack,  # MEMBER: results only move the window
                              seg.res32 if final else partial, seg.flag if final else pflag, seg.src if final else None,
                              flight)
        last_tx = flight.sent_at  # last transmission (reorder guard)
        guard = self.options.reorder_guard
        pace = self._pace_gap
        if guard:  # the first S chunks reuse the slots of the previous run's last ones
            delay = self._guard_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        lost: deque[tuple[int, bool]] = deque()  # (chunk, found early) to resend, in order
        named = bytearray(K)  # 1: the switch's loss signals named it lost: its payload goes, never a query
        queued = bytearray(K)  # 1: in `lost`, or skipped and not sent yet (no loss detection for either)
        unsent = bytearray(K)  # 1: skipped while its slot was busy, not sent yet (in `deferred`)
        deferred: list[int] = []  # those chunks, in order
        stats = self.stats
        nxt = lo = i0  # next chunk to send; lowest chunk without a result
        opts = self.options
        mono = time.monotonic
        last_progress = started = mono()
        sent = 0
        slot, window, tail = [0.0], [0.0], [0.0]  # seconds held back by a busy slot, the window, the tail
        waits: list[float] | None = None
        wait_since = mono()
        cuts0, loss_cuts0 = cwnd.cuts, cwnd.loss_cuts

        while results.remaining:
            if self._pending:
                raise Interrupted()
            if self._released:
                raise JobReleased("the controller released the job")
            # 1. take every datagram waiting
            progressed = results.drain()
            now = mono()
            if results.missing:  # the switch does not have these chunks' gradients: resend them first
                for i in results.missing:
                    if not got[i] and not queued[i]:
                        queued[i] = 1
                        lost.appendleft((i, True))
                results.missing.clear()
            if results.signalled:  # the switch's loss signals named these chunks lost: resend them first
                fresh = queue_signalled(results.signalled, got, queued, named, lost)
                if fresh:
                    stats.signal_resends += fresh
                    cwnd.on_loss(now, est.path_rtt, est.srtt)
            if progressed:
                last_progress = now
            # 2. find lost chunks: early (RACK), else the window's timer (restarted by every new result)
            if lo < results.sent:
                lo = got.find(0, lo, results.sent)
                if lo < 0:
                    lo = results.sent
                if self._catchup is not None and a + lo >= self._catchup[3]:
                    self._caught_up()  # back where the last generation change stopped it (stats.pauses)
            if flight.rack_dirty or now >= flight.rack_timer:
                found = flight.lost(gotv, lo, results.sent, now, queued)
                if found:
                    for i in found:
                        queued[i] = 1
                        lost.append((i, True))
                    stats.early_resends += len(found)
                    cwnd.on_loss(now, est.path_rtt, est.srtt)
            # one chunk in flight (a window of 1): no tail probe in the middle of the window, the timer acts
            tail_due = rto_due = float("inf")
            if lo < results.sent and not queued[lo]:
                alone = results.sent - K + results.remaining - len(deferred) <= 1
                tail_due, rto_due = flight.tail_deadline(lo, nxt >= K and not deferred, alone), flight.rto_deadline(lo)
                if now >= min(tail_due, rto_due) and results.drain():
                    # a timer is due, but results were waiting in the socket (this worker was descheduled since the
                    # drain): merely queued, no loss; the next turn takes them into account first
                    last_progress = now = mono()
                    continue
            if tail_due <= now < rto_due:
                flight.tail_probed = True
                # one chunk, unless a probe was answered already (then the overdue tail): a worker that
                # stalls for a moment costs one packet, not a window
                probe = flight.on_timeout(gotv, lo, results.sent, now, queued, flight.tail_wait()) \
                    if flight.probe_answered else [lo]
                stats.early_resends += len(probe)
                for i in reversed(probe):
                    queued[i] = 1
                    lost.appendleft((i, False))  # a probe: its answer lets the next one resend the tail
            if lo < results.sent and not queued[lo] and now >= flight.rto_deadline(lo):
                overdue = flight.on_timeout(gotv, lo, results.sent, now, queued)
                est.expired()
                cwnd.on_timeout(now, est.path_rtt, est.srtt)
                stats.timeouts += 1
                for i in reversed(overdue):
                    queued[i] = 1
                    lost.appendleft((i, False))  # the probe, or the tail after an answered probe
            # 3. resend what is lost (paced like first sends)
            while lost:
                if pace:
                    if now < self._pace_next:
                        break
                    self._pace_next = max(self._pace_next, now - 8 * pace) + pace
                i, early = lost.popleft()
                queued[i] = 0
                signalled, named[i] = named[i], 0
                if got[i]:
                    continue
                off = (i - i0) * PAYLOAD
                if queries and early and not signalled and qstate[i] != QueryState.QUERIED \
                        and qstate[i] != QueryState.MISSING and (query_first or flight.payload_resent[i]):
                    # found by RACK (again, after a resend): ask whether the switch has the gradient (a peer's
                    # loss or lag shows the same as this worker's own; only its own needs the payload)
                    q = bytearray(pkts[off : off + wire.INA_HEADER_LEN])
                    q[0] = QUERY
                    io.send_run(memoryview(q), wire.INA_HEADER_LEN, 1, addr)
                    flight.queried(i, now)
                    stats.queries += 1
                    continue
                if queries and qstate[i] == QueryState.QUERIED and not self._queries_answered:
                    self._queries_unanswered += 1
                    if self._queries_unanswered >= QUERIES_UNANSWERED:
                        queries = False
                pkt = bytearray(pkts[off : off + PAYLOAD])
                prev_tx = int(flight.txn[i])  # its latest frame's counter, should this one be refused
                if counted:
                    stamp(i, i + 1)  # the packet's copy below carries it
                    pkt[1] = F_RETRANSMIT | F_TX_COUNTED
                    pkt[_RS] = col[i - i0]
                else:
                    pkt[1] = F_RETRANSMIT
                io.send_run(memoryview(pkt), PAYLOAD, 1, addr, in_order=counted)
                if io.unsent:  # refused (the socket's buffer full): lost as on the link, the timer resends it
                    give_back(i, i + 1, prev_tx)
                flight.resent(i, now, early)
                stats.retransmits += 1
            # 4. send what the slots, the congestion window, the reorder guard and pacing allow
            room = 0
            first = nxt
            if nxt < K or deferred:
                done = K - i0 - results.remaining
                room = cwnd.limit(S) - (results.sent - i0 - done - len(deferred) - flight.held_n)  # held: off the link
            left = room
            if deferred:
                # chunks skipped while their slot was busy go once it is free, in order, whatever the window:
                # they are older than every chunk in flight, and a window cut since the skip could fill with
                # chunks whose peers wait for these (a deadlock: 8 workers at 5 % loss stalled until timeout)
                for j in [j for j in deferred if got[j - S]]:
                    stamp(j, j + 1)
                    io.send_run(pkts[(j - i0) * PAYLOAD :], PAYLOAD, 1, addr, in_order=counted)
                    if io.unsent:  # refused (the socket's buffer full): it stays skipped, sent next turn
                        give_back(j, j + 1)
                        break
                    deferred.remove(j)
                    unsent[j] = queued[j] = 0
                    flight.sent(j, j + 1, now)
                    sent += 1
                    left -= 1
                first = nxt
            if left > 0 and nxt < K:
                if not guard and not pace:
                    # runs up to the first chunk whose slot is still busy; SwitchML's slots are independent
                    # lanes, so that chunk is skipped (sent once its slot's result comes) and the link keeps
                    # carrying the other lanes' chunks while a loss is recovered ("Loss recovery")
                    while left > 0 and nxt < K:
                        upper = min(K, nxt + left)
                        lo_s = max(nxt - S, i0)
                        busy = got.find(0, lo_s, upper - S) if upper - S > lo_s else -1
                        end = upper if busy < 0 else busy + S
                        if end > nxt:
                            stamp(nxt, end)
                            io.send_run(pkts[(nxt - i0) * PAYLOAD :], PAYLOAD, end - nxt, addr, in_order=counted)
                            refused = io.unsent  # the socket's buffer full: the rest go next turn
                            if refused:
                                give_back(end - refused, end)
                                end -= refused
                            flight.sent(nxt, end, now)
                            sent += end - nxt
                            left -= end - nxt
                            nxt = end
                            if refused:
                                break
                        if busy < 0 or left <= 0 or len(deferred) >= S:  # done, full, or a slot count of chunks skipped
                            break
                        deferred.append(nxt)
                        unsent[nxt] = queued[nxt] = 1  # queued: no loss detection for a chunk not sent yet
                        lag, j = 1, busy  # chunks of this lane now skipped (StreamStats.lane_lag_max)
                        while j >= i0 and unsent[j]:
                            lag, j = lag + 1, j - S
                        stats.lane_lag_max = max(stats.lane_lag_max, lag)
                        nxt += 1
                    results.sent = nxt
                    first = nxt  # sent already
                else:
                    upper = min(K, nxt + left)
                    while nxt < upper and (nxt - S < i0 or got[nxt - S]):
                        if guard and nxt - S >= i0 and now < last_tx[nxt - S] + guard:
                            break
                        if pace:
                            if now < self._pace_next:
                                break
                            self._pace_next = max(self._pace_next, now - 8 * pace) + pace  # bursts of <= 8 after a late wake-up
                        nxt += 1
                if nxt > first:
                    count = nxt - first
                    stamp(first, nxt)
                    io.send_run(pkts[(first - i0) * PAYLOAD :], PAYLOAD, count, addr, in_order=counted)
                    if io.unsent:  # the socket's buffer full: the rest go next turn
                        give_back(nxt - io.unsent, nxt)
                        nxt -= io.unsent
                        count = nxt - first
                    results.sent = nxt
                    flight.sent(first, nxt, now)
                    sent += count
                    left -= count
            # where the time goes (stats.*_wait_s): what holds the next chunk back until the next turn
            if waits is not None:
                waits[0] += now - wait_since
            wait_since = now
            if nxt >= K and not deferred:
                waits = tail
            elif left <= 0:
                waits = window  # the congestion window (or the grant) is full
            elif deferred or (nxt - S >= i0 and not got[nxt - S]):
                waits = slot  # room in the window, but the slot's previous chunk has no result: a hole
            else:
                waits = None
            if now - last_progress > opts.op_timeout:
                first = got.find(0)
                raise AgentTimeout(
                    f"worker {wid}: no result from switch {rack.switch} at {addr[0]}:{addr[1]} for {opts.op_timeout}s "
                    f"(job {job}, generation {gen}, chunk {a + (first if first >= 0 else K)})")
            # 5. wait for a datagram, the next timer, or the pacing/guard that holds a send back
            wake = now + 0.05  # short, so a generation change is seen quickly
            if lo < results.sent and not queued[lo]:
                alone = results.sent - K + results.remaining - len(deferred) <= 1
                wake = min(wake, flight.rto_deadline(lo), flight.tail_deadline(lo, nxt >= K and not deferred, alone))
            wake = min(wake, flight.rack_timer)
            held = bool(guard or pace) and nxt < K and left > 0 and (nxt - S < i0 or got[nxt - S])  # by pacing or the guard
            if lost or held:
                hold = self._pace_next if pace else now
                if held and not lost and guard and nxt - S >= i0:
                    hold = max(hold, last_tx[nxt - S] + guard)
                wake = min(wake, hold)
            wait = wake - now
            if wait <= 0 or progressed:
                # after progress, once more at once: at high rates the next results are there already (polling
                # instead halved the agent's rate through bench/agent_bench.py's echo, session 8), though at n = 8
                # on the loaded testbed about half of all turns are such empty ones
                continue
            poll.poll(wait * 1000.0)
        if waits is not None:
            waits[0] += mono() - wait_since
        stats.slot_wait_s += slot[0]
        stats.cwnd_wait_s += window[0]
        stats.tail_wait_s += tail[0]
        stats.window_cuts += cwnd.cuts - cuts0
        stats.loss_cuts += cwnd.loss_cuts - loss_cuts0
        self._reorder_mult = flight.reorder_mult
        if est.samples:
            stats.path_rtt_s, stats.srtt_s = est.path_rtt, est.srtt
        if guard and sent:
            self._guard_until = float(last_tx.max()) + guard
        stats.packets_sent += sent
        stats.results += K - i0
        flight.dump_trace(a, wid, started)
        return (partial, pflag) if partial is not None else None


class ResultBatch:
    """Applies the switch's RESULTs of one window, drained in batches, to the window's state.

    A result counts if it is of this job and generation and its chunk was sent and has no result yet
    (the first copy wins; duplicates and late copies count as ``ignored``, other generations as
    ``stale``), exactly as one datagram at a time would. Anything else is a Rina datagram
    (``_other_datagram``). Short batches are applied in a plain loop, long ones with numpy; either way the
    window's bookkeeping (round-trip samples, congestion window, RACK) is done once per batch.
    """

    VECTOR_FROM = 64  # results per batch from which numpy is faster than the loop (cpu8: 105 vs 115 us at 64)

    def __init__(self, stream, seg: Segment, got: bytearray, i0: int, job: int, gen: int, rack: Rack,
                 values: bytearray | None, flags: bytearray | None, src: bytearray | None, flight: Flight) -> None:
        self.stream, self.seg, self.got, self.i0, self.job, self.gen, self.rack = stream, seg, got, i0, job, gen, rack
        self.values, self.flags, self.src = values, flags, src
        self.flight = flight  # send times, round-trip samples, RACK, spurious resends
        self.remaining = seg.K - i0
        self.sent = i0  # chunks [i0, sent) were sent at least once
        self.now = 0.0  # when the batch being applied was read
        self.buf = stream._rbatch
        self.view = memoryview(self.buf)
        self.progressed = False
        self.missing: list[int] = []  # chunks the switch's status says it lacks (their payload goes next)
        self.signalled: list[int] = []  # chunks the switch's loss signals name lost (docs/agent.md, "Loss signals")

    def drain(self) -> bool:
        """Take every datagram waiting; True if any chunk got its result."""
        self.progressed = False
        io, view, room = self.stream._io, self.view, self.stream._io.read_room
        while True:
            kept = io.drain(view, self._on_run)
            self.now = time.monotonic()
            if kept:
                self._apply(kept // PAYLOAD)
            if kept <= len(view) - room:
                break
        return self.progressed

    def _on_run(self, off: int, size: int, count: int) -> int:
        """Keep RESULTs at ``off`` (compacted), hand anything else to the Rina phases."""
        buf = self.buf
        if size == PAYLOAD:
            if count == 1:
                if buf[off] == RESULT:
                    return PAYLOAD
            elif buf[off : off + size * count : size].count(RESULT) == count:
                return size * count
        keep = off
        for j in range(count):
            p = off + j * size
            if size == PAYLOAD and buf[p] == RESULT:
                if p != keep:
                    buf[keep : keep + PAYLOAD] = buf[p : p + PAYLOAD]
                keep += PAYLOAD
            elif size == wire.INA_HEADER_LEN and buf[p] == STATUS:
                self._status(p)
            else:
                self.stream._other_datagram(bytearray(buf[p : p + size]), size, self.seg, self.rack)
        return keep - off

    def _status(self, off: int) -> None:
        """The switch's answer to a query: HELD (a peer's recovery completes the copy) or not (resend); or a gap
        report (``Flags.GAP``)."""
        stats = self.stream.stats
        _mt, fl, jid, g, _slot, seq, _w, _last = _HDR.unpack_from(self.buf, off)
        if jid != self.job or g != self.gen:
            stats.stale += 1
            return
        if fl & F_GAP:
            self._gap(_slot, _last >> 1)
            return
        i = (seq - self.seg.a) & 0xFFFFFFFF
        if i >= self.sent or i < self.i0 or self.got[i]:
            stats.ignored += 1
            return
        self.stream._queries_answered = True
        held = bool(fl & F_HELD)
        if held:
            stats.queries_held += 1
        if self.flight.status(i, held, time.monotonic()):
            self.missing.append(i)

    def _gap(self, count: int, revealed: int) -> None:
        """A gap report (a STATUS, or a result to this worker's frame that revealed it): the ``count`` frames this worker sent before the one numbered ``revealed`` (mod 128) did not
        reach the switch. Each one's chunk is lost if that frame is still its latest transmission and it has no
        result (the report may name frames the switch answered, or whose chunk went again since)."""
        flight, got, txlog = self.flight, self.got, self.stream._txlog
        self.stream.stats.gap_reports += 1
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
            self.stream._signals_seen = flight.signals = flight.numbered
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
        stats, got, buf, flight = self.stream.stats, self.got, self.buf, self.flight
        job, gen, a, i0, sent = self.job, self.gen, self.seg.a, self.i0, self.sent
        values, flags, src = self.values, self.flags, self.src
        unpack, hdr, cb = _HDR.unpack_from, wire.INA_HEADER_LEN, CHUNK_BYTES
        sel: list[int] = []
        prev: list[tuple[int, int]] = []
        gaps: list[int] = []
        for off in range(0, m * PAYLOAD, PAYLOAD):
            _mt, fl, jid, g, _slot, seq, _w, _last = unpack(buf, off)
            if jid != job or g != gen:
                stats.stale += 1
                continue
            i = (seq - a) & 0xFFFFFFFF
            if fl & F_PREV_DONE:
                prev.append((i, _last >> 1))
            if fl & F_GAP:  # this worker's frame that the switch delivered revealed a gap: slot = lost << 7 | counter
                gaps.append(_slot)
            if i >= sent or i < i0 or got[i]:
                stats.ignored += 1
                if i0 <= i < sent:
                    flight.duplicate(i)
                continue
            got[i] = 1
            sel.append(i)
            if values is not None:
                values[i * cb : i * cb + cb] = buf[off + hdr : off + PAYLOAD]
                if fl & F_OVERFLOW:
                    flags[i] = 1
            if src is not None:
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
        stats = self.stream.stats
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
        if self.values is not None:
            np.frombuffer(self.values, dtype=wire.LANES_DTYPE).reshape(-1, wire.LANES)[sel] = rec["lanes"][pos]
            over = (rec["flags"][pos] & F_OVERFLOW) != 0
            if over.any():
                np.frombuffer(self.flags, dtype=np.uint8)[sel[over]] = 1
        if self.src is not None:
            np.frombuffer(self.src, dtype=np.uint8)[sel] = 1
        self.flight.delivered_many(sel, self.now)
