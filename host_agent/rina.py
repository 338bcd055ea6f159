"""The stream's Rina phases: a representative broadcasts the global sums into its rack, rack workers wait
for them, acknowledge, and ask for what they miss with repair messages (``inaproto.rina_repair``).

``RinaPhases`` is a part of ``host_agent.stream.ChunkStream`` (which it is mixed into): it uses the stream's
socket, plan, generation, options and stats. docs/agent.md ("Rina") describes the exchange.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from host_agent.chunks import CHUNK_BYTES, Segment
from host_agent.errors import AgentTimeout
from host_agent.grant import Rack
from inaproto import wire
from inaproto.rina_repair import NACK as _NACK
from inaproto.rina_repair import NACK_BITS as _NACK_BITS
from inaproto.rina_repair import NACK_MAGIC as _NACK_MAGIC

__all__ = ["RinaPhases", "broadcast_packets"]

PAYLOAD = wire.INA_PAYLOAD_LEN
RESULT, BROADCAST = int(wire.MsgType.RESULT), int(wire.MsgType.BROADCAST)
F_OVERFLOW = int(wire.Flags.OVERFLOW)
_HDR = wire.HEADER


def broadcast_packets(sums: np.ndarray, overflow: bytearray, first: int, job_id: int, generation: int,
                      worker_id: int) -> bytes:
    """The BROADCAST payloads of chunks ``first, first + 1, ...`` (global sums, wrapped to int32), back to back."""
    rec = np.zeros(sums.shape[0], dtype=wire.PAYLOAD_DTYPE)
    rec["msg_type"], rec["job_id"], rec["generation"], rec["worker_id"] = BROADCAST, job_id, generation, worker_id
    rec["flags"] = np.where(np.frombuffer(overflow, dtype=np.uint8, count=sums.shape[0]) != 0, F_OVERFLOW, 0)
    rec["seq"] = (np.arange(first, first + sums.shape[0], dtype=np.int64)) & 0xFFFFFFFF
    rec["lanes"] = sums.astype(np.int32)
    return rec.tobytes()


class RinaPhases:
    """Broadcast, acknowledgement and repair of Rina's global sums within a rack (mixed into ChunkStream)."""

    def _other_datagram(self, rbuf: bytearray, n: int, seg: Segment | None, rack: Rack | None) -> None:
        """Anything but a RESULT: Rina broadcasts (rack workers) and repair requests (representatives)."""
        if n == PAYLOAD and rbuf[0] == BROADCAST:
            _mt, fl, jid, g, _slot, seq, _w, _last = _HDR.unpack_from(rbuf, 0)
            if jid != self.job_id or g != self._generation:
                self.stats.stale += 1
                return
            if seg is None or self._plan.is_representative(self.worker_id):
                self.stats.ignored += 1
                return
            i = (seq - seg.a) & 0xFFFFFFFF
            if i >= seg.K or seg.src[i]:
                self.stats.ignored += 1
                return
            off = i * CHUNK_BYTES
            seg.res32[off : off + CHUNK_BYTES] = rbuf[wire.INA_HEADER_LEN : PAYLOAD]
            seg.flag[i] = 1 if fl & F_OVERFLOW else 0
            seg.src[i] = 1
            return
        if n >= _NACK.size and rbuf[:4] == _NACK_MAGIC:
            self._on_nack(rbuf, n)
            return
        self.stats.ignored += 1

    def _drain_each(self, handle: Callable[[bytearray, int], None]) -> None:
        """Every datagram waiting, one ``handle(datagram, length)`` each (GRO-coalesced reads split)."""
        buf, view = self._rbatch, memoryview(self._rbatch)

        def on_run(off: int, size: int, count: int) -> int:
            for j in range(count):
                p = off + j * size
                handle(buf[p : p + size], size)
            return 0

        self._io.drain(view, on_run)  # on_run keeps nothing: the buffer never fills

    def _drain_idle(self) -> None:
        def handle(dgram: bytearray, n: int) -> None:
            if n >= _NACK.size and dgram[:4] == _NACK_MAGIC:
                self._on_nack(dgram, n)
            else:
                self.stats.ignored += 1

        self._drain_each(handle)

    def _broadcast(self, seg: Segment, i0: int, rack: Rack) -> None:
        """Representative: send the global sums of seg[i0:] into the rack (BROADCAST), paced by the rack's acks."""
        members = rack.worker_ids[1:]
        if not members:
            return
        K, a = seg.K, seg.a
        pkts = broadcast_packets(seg.resr[i0:], seg.flag[i0:], a + i0, self.job_id, self._generation, self.worker_id)
        wid = self.worker_id
        window = self.options.broadcast_window
        nxt = i0
        deadline = time.monotonic() + self.options.op_timeout
        while nxt < K:
            self._check_interrupt()
            low = min(self._acks.get(w, 0) for w in members)
            burst = max(0, min(K, low + window - a) - nxt)
            if burst:
                for j in range(nxt, nxt + burst):  # kept for repair requests
                    off = (j - i0) * PAYLOAD
                    self._bstore[a + j] = pkts[off : off + PAYLOAD]
                self._io.send_run(memoryview(pkts)[(nxt - i0) * PAYLOAD :], PAYLOAD, burst, rack.address)
                self.stats.broadcasts_sent += burst
                nxt += burst
            if nxt >= K:
                break
            if burst:
                deadline = time.monotonic() + self.options.op_timeout
            elif time.monotonic() > deadline:
                raise AgentTimeout(f"worker {wid}: rack workers {list(members)} acknowledged nothing for "
                                   f"{self.options.op_timeout}s")
            if self._poll.poll(20):
                self._drain_idle()

    def _on_nack(self, rbuf: bytearray, n: int) -> None:
        _magic, job, gen, worker, cum = _NACK.unpack_from(rbuf, 0)
        if job != self.job_id or gen != self._generation:
            self.stats.stale += 1
            return
        if cum > self._acks.get(worker, 0):
            self._acks[worker] = cum
        bits = rbuf[_NACK.size : n]
        rack = self._plan.rack_of(self.worker_id)
        if rack is None:
            return
        if bits:
            self.stats.nacks_served += 1
            for byte_i, byte in enumerate(bits):
                if not byte:
                    continue
                for bit in range(8):
                    if byte >> bit & 1:
                        pkt = self._bstore.get(cum + byte_i * 8 + bit)
                        if pkt is not None:
                            try:
                                self.sock.sendto(pkt, rack.address)
                            except (BlockingIOError, ConnectionRefusedError):
                                pass
        low = min((self._acks.get(w, 0) for w in rack.worker_ids[1:]), default=0)
        if self._bstore and min(self._bstore) < low:
            for c in [c for c in self._bstore if c < low]:
                del self._bstore[c]

    def _send_nack(self, rack: Rack, cum: int, missing: bytes = b"") -> None:
        pkt = _NACK.pack(_NACK_MAGIC, self.job_id, self._generation, self.worker_id, cum) + missing
        try:
            self.sock.sendto(pkt, self.workers[rack.representative].address)
        except (BlockingIOError, ConnectionRefusedError):
            pass

    def _await_globals(self, seg: Segment, i0: int, rack: Rack) -> None:
        """Rack worker: wait for the representative's BROADCASTs of seg[i0:]; ack progress, ask for gaps."""
        opts = self.options
        K, a = seg.K, seg.a
        ack_every = max(1, opts.broadcast_window // 4)
        acked = a + i0
        wait = self._rto
        mono = time.monotonic
        last_progress = mono()
        next_nack = last_progress + wait
        while True:
            first = seg.first_missing(i0)
            if first < 0:
                for _ in range(2):  # unreliable; a later ack or request covers a lost one
                    self._send_nack(rack, a + K)
                return
            if a + first - acked >= ack_every:
                acked = a + first
                self._send_nack(rack, acked)
            self._check_interrupt()
            now = mono()
            if now >= next_nack:
                bitmap = np.frombuffer(seg.src, dtype=np.uint8)[first : first + _NACK_BITS] == 0
                self._send_nack(rack, a + first, np.packbits(bitmap, bitorder="little").tobytes())
                self.stats.nacks_sent += 1
                wait = min(wait * 2, opts.rto_max)
                next_nack = now + wait
            if now - last_progress > opts.op_timeout:
                raise AgentTimeout(f"worker {self.worker_id}: no global result from representative "
                                   f"{rack.representative} for {opts.op_timeout}s (chunk {a + first})")
            if self._poll.poll(max(min(next_nack - now, 0.05), 0) * 1000.0):
                before = first

                def handle(dgram: bytearray, n: int) -> None:
                    if n == PAYLOAD and dgram[0] == RESULT:
                        self.stats.ignored += 1
                    else:
                        self._other_datagram(dgram, n, seg, rack)

                self._drain_each(handle)
                if seg.first_missing(i0) != before:
                    last_progress = mono()
                    wait = self._rto
                    next_nack = last_progress + wait
