"""The stream's INA phase: a worker's side of SwitchML's sliding window over its switch's slots.

Chunk ``g`` of the stream goes to slot ``(g - base) mod S`` and shadow copy ``((g - base) div S) mod 2`` with
``seq = g mod 2**32``, and ``g + S`` is sent only after the result of ``g``; lost packets are resent after an
RTO that follows the measured round trips (docs/agent.md, "Loss recovery"). ``InaPhase`` is a part of
``host_agent.stream.ChunkStream`` (which it is mixed into): it uses the stream's socket, generation, base,
options, stats and interrupt flags.
"""
from __future__ import annotations

import enum
import heapq
import time
from collections import deque

import numpy as np

from host_agent.chunks import CHUNK_BYTES, Segment
from host_agent.errors import AgentTimeout, Interrupted, JobReleased
from host_agent.grant import Rack
from inaproto import wire

__all__ = ["InaPhase", "ResultBatch", "WindowMode", "gradient_packets"]

PAYLOAD = wire.INA_PAYLOAD_LEN
GRADIENT, RESULT = int(wire.MsgType.GRADIENT), int(wire.MsgType.RESULT)
F_RETRANSMIT, F_OVERFLOW = int(wire.Flags.RETRANSMIT), int(wire.Flags.OVERFLOW)
_HDR = wire.HEADER


class WindowMode(enum.Enum):
    """What the switch's results of a window are to the worker."""

    FINAL = "final"  # the job's sums (plain INA)
    PARTIAL = "partial"  # the rack's partial sums, for the cross-rack ring (Rina representative)
    MEMBER = "member"  # they only move the window; global sums arrive as BROADCASTs (Rina rack worker)


def gradient_packets(contrib: np.ndarray, first: int, base: int, num_slots: int, job_id: int, generation: int,
                     worker_id: int) -> memoryview:
    """The GRADIENT payloads of chunks ``first, first + 1, ...`` (the rows of ``contrib``), back to back, in one pass."""
    rel = np.arange(first - base, first - base + contrib.shape[0], dtype=np.int64)
    rec = np.empty(contrib.shape[0], dtype=wire.PAYLOAD_DTYPE)
    rec["msg_type"], rec["flags"], rec["job_id"], rec["generation"] = GRADIENT, 0, job_id, generation
    rec["slot"] = rel % num_slots
    rec["seq"] = (rel + base) & 0xFFFFFFFF
    rec["worker_id"] = worker_id
    rec["reserved_shadow"] = (rel // num_slots) & 1
    rec["lanes"] = contrib
    return memoryview(rec.tobytes())


class InaPhase:
    """The SwitchML window and its retransmission timer (mixed into ChunkStream)."""

    def _update_rto(self, sample: float) -> None:
        """RTO = 4 x the shortest of the last 32 round trips of chunks sent once (within the bounds).

        A chunk's round trip includes waiting for the slowest worker, and for that worker's own
        retransmissions: averages of it track the other workers' RTOs and inflate without bound under
        loss. The shortest recent round trip is what the worker that completes a chunk sees: the path
        and its queueing. A spurious retransmission costs one packet that the switch drops.
        """
        buf = self._rtt_samples
        buf[self._rtt_next] = sample
        self._rtt_next = (self._rtt_next + 1) % len(buf)
        o = self.options
        self._rto = min(max(4 * min(buf), o.rto_min), o.rto_max)

    def _ina_window(self, seg: Segment, i0: int, rack: Rack, mode: WindowMode) -> tuple[bytearray, bytearray] | None:
        """Contribute chunks ``seg[i0:]`` to ``rack``'s switch under the SwitchML window.

        Returns when every chunk has its switch result: for ``WindowMode.PARTIAL`` the rack's partial sums
        and their overflow flags (one byte per chunk), else None (see ``WindowMode``).

        I/O (docs/agent.md, "I/O"): the chunks the window allows go to the kernel as one run
        (``DatagramIo.send_run``: GSO batches of up to 64 packets); results are drained in batches into
        ``self._rbatch`` and applied together (``ResultBatch``), in arrival order.
        """
        K, a = seg.K, seg.a
        S = rack.num_slots
        base = self._base
        addr = rack.address
        job, gen, wid = self.job_id, self._generation, self.worker_id
        io, poll = self._io, self._poll
        got = bytearray(K)  # 1: the chunk has its switch result
        got[:i0] = b"\x01" * i0
        final = mode is WindowMode.FINAL
        partial = bytearray(K * CHUNK_BYTES) if mode is WindowMode.PARTIAL else None
        pflag = bytearray(K) if mode is WindowMode.PARTIAL else None
        pkts = gradient_packets(seg.contrib[i0:], a + i0, base, S, job, gen, wid)
        results = ResultBatch(self, seg, got, i0, job, gen, rack,  # MEMBER: results only move the window
                              seg.res32 if final else partial, seg.flag if final else pflag, seg.src if final else None)
        sent_at = [0.0] * K  # first transmission (round-trip samples)
        last_tx = [0.0] * K  # last transmission (reorder guard)
        guard = self.options.reorder_guard
        pace = self._pace_gap
        if guard:  # the first S chunks reuse the slots of the previous run's last ones
            delay = self._guard_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        tries: dict[int, int] = {}
        fresh: deque[tuple[float, int, int]] = deque()  # runs [start, end) of first sends, in deadline order
        retry: list[tuple[float, int]] = []  # heap of resends
        stats = self.stats
        results.tries = tries
        results.sent_at = sent_at
        nxt = i0
        opts = self.options
        mono = time.monotonic
        last_progress = mono()
        sent = 0

        while results.remaining:
            if self._pending:
                raise Interrupted()
            if self._released:
                raise JobReleased("the controller released the job")
            # 1. send what the window allows: chunk i after the result of chunk i - S (and, with a
            #    reorder guard, no earlier than `guard` after the last transmission of chunk i - S)
            now = mono()
            if nxt < K:
                first = nxt
                if not guard and not pace:  # the run up to the first chunk whose slot is still busy
                    busy = got.find(0, max(nxt - S, i0), K - S) if K > S else -1
                    nxt = K if busy < 0 else busy + S
                else:
                    while nxt < K and (nxt - S < i0 or got[nxt - S]):
                        if guard and nxt - S >= i0 and now < last_tx[nxt - S] + guard:
                            break
                        if pace:
                            if now < self._pace_next:
                                break
                            self._pace_next = max(self._pace_next, now - 8 * pace) + pace  # bursts of <= 8 after a late wake-up
                        nxt += 1
                if nxt > first:
                    count = nxt - first
                    io.send_run(pkts[(first - i0) * PAYLOAD :], PAYLOAD, count, addr)
                    results.sent = nxt
                    sent_at[first:nxt] = last_tx[first:nxt] = [now] * count
                    fresh.append((now + self._rto, first, nxt))
                    sent += count
            # 2. take every datagram waiting
            progressed = results.drain()
            now = mono()
            if progressed:
                last_progress = now
            # 3. retransmit what timed out (exponential backoff per chunk)
            while True:
                if fresh and fresh[0][0] <= now and (not retry or fresh[0][0] <= retry[0][0]):
                    deadline, start, end = fresh[0]
                    i = got.find(0, start, end)
                    if i < 0:
                        fresh.popleft()
                        continue
                    if pace:
                        if now < self._pace_next:
                            break
                        self._pace_next = max(self._pace_next, now - 8 * pace) + pace
                    if i + 1 < end:
                        fresh[0] = (deadline, i + 1, end)
                    else:
                        fresh.popleft()
                elif retry and retry[0][0] <= now:
                    if pace:
                        if now < self._pace_next:
                            break
                        self._pace_next = max(self._pace_next, now - 8 * pace) + pace
                    _, i = heapq.heappop(retry)
                    if got[i]:
                        continue
                else:
                    break
                k = tries.get(i, 0) + 1
                tries[i] = k
                off = (i - i0) * PAYLOAD
                pkt = bytearray(pkts[off : off + PAYLOAD])
                pkt[1] = F_RETRANSMIT
                io.send_run(memoryview(pkt), PAYLOAD, 1, addr)
                last_tx[i] = now
                stats.retransmits += 1
                heapq.heappush(retry, (now + min(self._rto * (1 << min(k, 3)), opts.rto_max), i))
            if now - last_progress > opts.op_timeout:
                first = got.find(0)
                raise AgentTimeout(
                    f"worker {wid}: no result from switch {rack.switch} at {addr[0]}:{addr[1]} for {opts.op_timeout}s "
                    f"(job {job}, generation {gen}, chunk {a + (first if first >= 0 else K)})")
            wait = 0.05
            if nxt < K and (nxt - S < i0 or got[nxt - S]):
                if not guard or nxt - S < i0:
                    wait = self._pace_next - now if pace else 0.0
                else:
                    wait = max(last_tx[nxt - S] + guard, self._pace_next if pace else 0.0) - now
                if wait <= 0:
                    continue
            if progressed:
                continue
            # 4. wait for a datagram or the next timer (short, so a generation change is seen quickly)
            timers = [t[0][0] for t in (fresh, retry) if t]
            if timers:
                wait = min(wait, max(min(timers) - now, self._pace_next - now if pace else 0.0))
            poll.poll(wait * 1000.0)
        if guard and sent:
            self._guard_until = max(last_tx) + guard
        stats.packets_sent += sent
        stats.results += K - i0
        return (partial, pflag) if partial is not None else None


class ResultBatch:
    """Applies the switch's RESULTs of one window, drained in batches, to the window's state.

    A result counts if it is of this job and generation and its chunk was sent and has no result yet
    (the first copy wins; duplicates and late copies count as ``ignored``, other generations as
    ``stale``), exactly as one datagram at a time would. Anything else is a Rina datagram
    (``_other_datagram``). Small batches are applied one by one, large ones with numpy.
    """

    VECTOR_FROM = 16  # results per batch from which numpy is faster than a loop

    def __init__(self, stream, seg: Segment, got: bytearray, i0: int, job: int, gen: int, rack: Rack,
                 values: bytearray | None, flags: bytearray | None, src: bytearray | None) -> None:
        self.stream, self.seg, self.got, self.i0, self.job, self.gen, self.rack = stream, seg, got, i0, job, gen, rack
        self.values, self.flags, self.src = values, flags, src
        self.remaining = seg.K - i0
        self.sent = i0  # chunks [i0, sent) were sent at least once
        self.samples = 0
        self.tries: dict[int, int] = {}
        self.sent_at: list[float] = []
        self.buf = stream._rbatch
        self.view = memoryview(self.buf)
        self.progressed = False

    def drain(self) -> bool:
        """Take every datagram waiting; True if any chunk got its result."""
        self.progressed = False
        io, view, room = self.stream._io, self.view, self.stream._io.read_room
        while True:
            kept = io.drain(view, self._on_run)
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
            else:
                self.stream._other_datagram(bytearray(buf[p : p + size]), size, self.seg, self.rack)
        return keep - off

    def _apply(self, m: int) -> None:
        if m < self.VECTOR_FROM:
            for j in range(m):
                self._apply_one(j * PAYLOAD)
        else:
            self._apply_many(m)

    def _apply_one(self, off: int) -> None:
        stream, got, stats = self.stream, self.got, self.stream.stats
        _mt, fl, jid, g, _slot, seq, _w, _last = _HDR.unpack_from(self.buf, off)
        if jid != self.job or g != self.gen:
            stats.stale += 1
            return
        i = (seq - self.seg.a) & 0xFFFFFFFF
        if i >= self.sent or i < self.i0 or got[i]:
            stats.ignored += 1
            return
        got[i] = 1
        self.remaining -= 1
        self.progressed = True
        if self.values is not None:
            o = i * CHUNK_BYTES
            self.values[o : o + CHUNK_BYTES] = self.buf[off + wire.INA_HEADER_LEN : off + PAYLOAD]
            if fl & F_OVERFLOW:
                self.flags[i] = 1
        if self.src is not None:
            self.src[i] = 1
        self.samples += 1
        if self.samples & 3 == 0 and i not in self.tries:  # every 4th: the RTO needs no more
            stream._update_rto(time.monotonic() - self.sent_at[i])

    def _apply_many(self, m: int) -> None:
        stats = self.stream.stats
        rec = np.frombuffer(self.buf, dtype=wire.PAYLOAD_DTYPE, count=m)
        ours = (rec["job_id"] == self.job) & (rec["generation"] == self.gen)
        stats.stale += m - int(np.count_nonzero(ours))
        idx = (rec["seq"].astype(np.int64) - self.seg.a) & 0xFFFFFFFF
        got = np.frombuffer(self.got, dtype=np.uint8)
        ok = ours & (idx >= self.i0) & (idx < self.sent)
        ok[ok] = got[idx[ok]] == 0
        pos = np.flatnonzero(ok)
        if pos.size:
            _, first = np.unique(idx[pos], return_index=True)  # the first copy of a chunk in the batch wins
            if first.size != pos.size:
                pos = pos[np.sort(first)]
        stats.ignored += int(np.count_nonzero(ours)) - int(pos.size)
        if not pos.size:
            return
        sel = idx[pos]
        got[sel] = 1
        self.remaining -= int(pos.size)
        self.progressed = True
        if self.values is not None:
            np.frombuffer(self.values, dtype=wire.LANES_DTYPE).reshape(-1, wire.LANES)[sel] = rec["lanes"][pos]
            over = (rec["flags"][pos] & F_OVERFLOW) != 0
            if over.any():
                np.frombuffer(self.flags, dtype=np.uint8)[sel[over]] = 1
        if self.src is not None:
            np.frombuffer(self.src, dtype=np.uint8)[sel] = 1
        # round-trip samples: every 4th result, in arrival order, of chunks sent once
        s0 = self.samples
        self.samples += int(pos.size)
        now = time.monotonic()
        tries, sent_at, update = self.tries, self.sent_at, self.stream._update_rto
        for j in range((-s0 - 1) % 4, int(pos.size), 4):
            i = int(sel[j])
            if i not in tries:
                update(now - sent_at[i])
