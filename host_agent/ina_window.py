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

__all__ = ["InaPhase", "WindowMode", "gradient_packets"]

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
        """
        K, a = seg.K, seg.a
        S = rack.num_slots
        base = self._base
        addr = rack.address
        job, gen, wid = self.job_id, self._generation, self.worker_id
        sock, rbuf, poll = self.sock, self._rbuf, self._poll
        unpack_from = _HDR.unpack_from
        got = bytearray(K)
        got[:i0] = b"\x01" * i0
        final = mode is WindowMode.FINAL
        partial = bytearray(K * CHUNK_BYTES) if mode is WindowMode.PARTIAL else None
        pflag = bytearray(K) if mode is WindowMode.PARTIAL else None
        res32, flag, src = seg.res32, seg.flag, seg.src
        pkts = gradient_packets(seg.contrib[i0:], a + i0, base, S, job, gen, wid)
        rview = memoryview(rbuf)
        H = wire.INA_HEADER_LEN
        inflight: dict[int, int] = {}  # seq -> index of every chunk awaiting its switch result
        sent_at = [0.0] * K  # first transmission (round-trip samples)
        last_tx = [0.0] * K  # last transmission (reorder guard)
        guard = self.options.reorder_guard
        pace = self._pace_gap
        if guard:  # the first S chunks reuse the slots of the previous run's last ones
            delay = self._guard_until - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        tries: dict[int, int] = {}
        fresh: deque[tuple[float, int]] = deque()  # first sends, in deadline order
        retry: list[tuple[float, int]] = []  # heap of resends
        stats = self.stats
        nxt = i0
        remaining = K - i0
        opts = self.options
        mono = time.monotonic
        last_progress = mono()
        sent = 0
        samples = 0

        while remaining:
            if self._pending:
                raise Interrupted()
            if self._released:
                raise JobReleased("the controller released the job")
            # 1. send what the window allows: chunk i after the result of chunk i - S (and, with a
            #    reorder guard, no earlier than `guard` after the last transmission of chunk i - S)
            now = mono()
            rto = self._rto
            while nxt < K and (nxt - S < i0 or got[nxt - S]):
                if guard and nxt - S >= i0 and now < last_tx[nxt - S] + guard:
                    break
                if pace:
                    if now < self._pace_next:
                        break
                    self._pace_next = max(self._pace_next, now - 8 * pace) + pace  # bursts of <= 8 after a late wake-up
                off = (nxt - i0) * PAYLOAD
                try:
                    sock.sendto(pkts[off : off + PAYLOAD], addr)
                except (BlockingIOError, ConnectionRefusedError):
                    pass
                inflight[(a + nxt) & 0xFFFFFFFF] = nxt
                sent_at[nxt] = last_tx[nxt] = now
                fresh.append((now + rto, nxt))
                nxt += 1
                sent += 1
            # 2. take every datagram waiting
            progressed = False
            while True:
                try:
                    n = sock.recv_into(rbuf)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:
                    continue
                if n == PAYLOAD and rbuf[0] == RESULT:
                    mt, fl, jid, g, _slot, seq, _w, _last = unpack_from(rbuf, 0)
                    if jid != job or g != gen:
                        stats.stale += 1
                        continue
                    i = inflight.pop(seq, None)
                    if i is None:
                        stats.ignored += 1
                        continue
                    got[i] = 1
                    remaining -= 1
                    progressed = True
                    off = i * CHUNK_BYTES
                    if final:
                        res32[off : off + CHUNK_BYTES] = rview[H:PAYLOAD]
                        if fl & F_OVERFLOW:
                            flag[i] = 1
                        src[i] = 1
                    elif partial is not None:
                        partial[off : off + CHUNK_BYTES] = rview[H:PAYLOAD]
                        if fl & F_OVERFLOW:
                            pflag[i] = 1
                    samples += 1
                    if samples & 3 == 0 and i not in tries:  # every 4th: the RTO needs no more
                        self._update_rto(mono() - sent_at[i])
                else:
                    self._other_datagram(rbuf, n, seg, rack)
            now = mono()
            if progressed:
                last_progress = now
            # 3. retransmit what timed out (exponential backoff per chunk)
            while True:
                if fresh and fresh[0][0] <= now and (not retry or fresh[0][0] <= retry[0][0]):
                    due = fresh
                elif retry and retry[0][0] <= now:
                    due = retry
                else:
                    break
                if pace:
                    if now < self._pace_next:
                        break
                    self._pace_next = max(self._pace_next, now - 8 * pace) + pace
                _, i = due.popleft() if due is fresh else heapq.heappop(retry)
                if got[i]:
                    continue
                k = tries.get(i, 0) + 1
                tries[i] = k
                off = (i - i0) * PAYLOAD
                pkt = bytearray(pkts[off : off + PAYLOAD])
                pkt[1] = F_RETRANSMIT
                try:
                    sock.sendto(pkt, addr)
                except (BlockingIOError, ConnectionRefusedError):
                    pass
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
