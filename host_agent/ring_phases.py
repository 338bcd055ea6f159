"""The stream's ring phases: a TCP ring of some of the job's workers all-reduces a run of chunks exactly.

``RingPhases`` is a part of ``host_agent.stream.ChunkStream`` (which it is mixed into): it uses the stream's
workers, listener, options, stats, rings and interrupt flags. Plain ring jobs, Rina's cross-rack ring and
the overflow guard live here; the ring itself is ``host_agent.ring``.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Sequence

import numpy as np

from host_agent.chunks import LANES, Segment
from host_agent.errors import AgentError, Interrupted, JobReleased
from host_agent.ring import RingAllReduce, RingError, RingStep, TcpRingLink
from host_agent.ring_pieces import WHOLE_CHUNKS

__all__ = ["RingPhases"]

_BOUND_SHIFT = 6  # ring overflow guard: each member adds ceil(max|x| / 64); see _ring_segment
_BOUND_LIMIT = 1 << (31 - _BOUND_SHIFT)


class _PacedLink:
    """A ring link whose every op lasts at least its bytes on the wire over ``bps`` (link emulation).

    Steps are pipelined, so the op (not each step) is paced: its steps' larger side each, plus a header."""

    FRAMING = 1514 / 1448  # Ethernet + IPv4 + TCP (timestamps) headers per full segment

    def __init__(self, link: TcpRingLink, bps: float) -> None:
        self.link, self.bps = link, bps
        self.rank, self.size = link.rank, link.size

    def run(self, steps: Sequence[RingStep]) -> None:
        start = time.monotonic()
        self.link.run(steps)
        nbytes = sum(max(s.send.nbytes, s.recv.nbytes) + 40 for s in steps)
        left = start + nbytes * self.FRAMING * 8 / self.bps - time.monotonic()
        if left > 0:
            time.sleep(left)

    def abort(self) -> None:
        self.link.abort()

    def close(self) -> None:
        self.link.close()


class RingPhases:
    """Ring set-up, failure handling and the exact ring all-reduce of a segment (mixed into ChunkStream)."""

    def _ring(self, members: tuple[int, ...]) -> RingAllReduce:
        ring = self._rings.get(members)
        if ring is not None:
            return ring
        rank = members.index(self.worker_id)
        peers = [self.workers[w].address for w in members]
        failed: BaseException | None = None
        self._rings_building = True  # before the check: a notify after it shuts the listener down
        try:
            self._check_interrupt()
            link = TcpRingLink(rank, peers, self._listener.dup(), timeout=self.options.op_timeout,
                               connect_timeout=self.options.connect_timeout,
                               piece_bytes=self.options.ring_piece_bytes or WHOLE_CHUNKS)
            ring = RingAllReduce.over(_PacedLink(link, self.options.link_bps) if self.options.link_bps else link)
        except (RingError, OSError) as exc:
            failed = exc
        finally:
            self._rings_building = False
        if failed is not None:
            self._renew_listener()
            self._ring_failed(failed)
        if self._pending:  # the listener may have been shut down while connecting
            ring.close()
            self._renew_listener()
            raise Interrupted()
        self._rings[members] = ring
        return ring

    def _renew_listener(self) -> None:
        """A listener shut down to interrupt a ring set-up is replaced by a fresh one on the same address."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(self._listen_addr)
            probe.listen()
        except OSError:
            probe.close()
            return  # the old listener still holds the address: it was not shut down
        self._listener.close()
        self._listener = probe

    def _ring_failed(self, exc: BaseException):
        deadline = time.monotonic() + self.options.ring_grace
        while time.monotonic() < deadline:
            if self._pending:
                raise Interrupted() from exc
            if self._released:
                raise JobReleased("the controller released the job") from exc
            time.sleep(0.005)
        raise AgentError(f"worker {self.worker_id}: ring all-reduce failed: {exc}") from exc

    def _ring_segment(self, seg: Segment, i0: int, members: tuple[int, ...], data: np.ndarray,
                      chunk_flags: np.ndarray | None, *, rina: bool) -> None:
        """All-reduce ``data`` (this member's int32 rows for seg[i0:]) over the ring of ``members``.

        The ring adds int32. Each member appends ceil(max|x| / 64); if those add up to 2**25 or more
        an int32 sum might have wrapped, and every member (seeing the same total) redoes the op in int64.
        Rina ops also carry per-chunk overflow counts of the racks' partial sums. Results are exact.
        """
        self._check_interrupt()
        ring = self._ring(members)
        K = data.shape[0]
        flat = data.reshape(-1)
        extra = (K if rina else 0) + 1
        payload = np.empty(flat.size + extra, dtype=np.int32)
        payload[: flat.size] = flat
        if rina:
            payload[flat.size : flat.size + K] = chunk_flags
        if flat.size:
            peak = max(int(flat.max()), -int(flat.min()))
        else:
            peak = 0
        payload[-1] = -(-peak >> _BOUND_SHIFT) if peak else 0
        since = time.monotonic()
        try:
            out = ring.allreduce(payload)
            self.stats.ring_ops += 1
            sums = out[: flat.size]  # int32: exact unless the bound says a sum might have wrapped
            if int(out[-1]) >= _BOUND_LIMIT:
                sums = ring.allreduce(flat.astype(np.int64))
                self.stats.ring_redo_int64 += 1
                self.stats.ring_ops += 1
        except RingError as exc:
            self._ring_lost = time.monotonic() - since  # an aborted op's work is lost (stats.pauses)
            self._ring_failed(exc)
        sums = sums.reshape(K, LANES)
        flags = None
        if rina:
            flags = (out[flat.size : flat.size + K] > 0) | ((sums > 2**31 - 1) | (sums < -(2**31))).any(axis=1)
        seg.put_ring(i0, sums, flags)
