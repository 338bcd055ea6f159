"""The ``rings`` I/O loop of ``ina-switch``'s data plane: per wake-up, every port's ready frames as one batch.

``RingsLoop`` is a part of ``softswitch.dataplane.DataPlane`` (mixed into it), used when every port has
PACKET_MMAP rings (softswitch/ring_io.py, ``--io rings``): the ports' receive rings are read once per
wake-up, their frames joined (a port per frame) for ``pipeline.process_batch(ports, frames, as_block=True)``,
the ``FrameBlock`` it returns copied into the egress ports' transmit rings, and each ring flushed with one
send() when the wake-up is done. The per-frame loop, held frames (link delay, faults), pcap and the CPU port
stay in ``DataPlane``; this module owns only what the batch path does differently.
"""
from __future__ import annotations

import inspect
import logging
import select
import time

import numpy as np

from softswitch.pipeline_batch import FrameBlock
from softswitch.pipeline_batch import rows_as_bytes as _rows_as_bytes

RING_BATCH = 512  # frames taken from one port's receive ring before the next port (whole blocks)

log = logging.getLogger("ina-switch")


class RingsLoop:
    """The I/O loop on packet rings and its batch output path (a mixin of ``DataPlane``: its state is the
    data plane's)."""

    def _loop_rings(self) -> None:
        """The I/O loop on packet rings: per wake-up every port's ready frames as one batch, then one flush per
        transmit ring."""
        ep = select.epoll()
        receivers = []
        for port, sock in self._sockets.items():
            ep.register(sock.fileno(), select.EPOLLIN)
            receivers.append((port, self._rings[port].receive_batch))
        ep.register(self._wake, select.EPOLLIN)
        timer_fd = self._open_timer(ep)
        sends = {port: ring.send for port, ring in self._rings.items()}
        self._sends = sends
        process_batch = getattr(self.pipeline, "process_batch", None)
        # a batch entry point that can hand back its outputs as a FrameBlock (InaPipeline's can)
        block_out = process_batch is not None and "as_block" in inspect.signature(process_batch).parameters
        if process_batch is None:  # a pipeline without a batch entry point: one frame at a time
            process = self.pipeline.process
            process_batch = lambda port, frames: [out for f in frames for out in process(port, f)]
        self._process_batch = process_batch
        self._block_out = block_out
        pcaps = bool(self._pcap_in)
        dirty = False
        fast = not (pcaps or self.faults is not None or log.isEnabledFor(logging.DEBUG)
                    or (self.dump_packet_data and log.isEnabledFor(logging.INFO)))
        outq: list[tuple[int, bytes]] = []
        try:
            while not self._stopping:
                events = ep.poll(self._poll_timeout(dirty))
                if not events:
                    if dirty:
                        self._flush_pcaps()
                        dirty = False
                    self._release_held(outq, fast)
                    self._flush_rings()
                    continue
                ring_event = False
                for fd, _ev in events:
                    if self._control_event(fd, timer_fd):
                        continue
                    ring_event = True
                if ring_event:
                    dirty = self._rings_wake_up(receivers, outq, fast, pcaps) or dirty
                self._release_held(outq, fast)
                self._flush_rings()
        finally:
            ep.close()
            self._close_timer()
            self._flush_pcaps()

    def _rings_wake_up(self, receivers: list, outq: list[tuple[int, bytes]], fast: bool, pcaps: bool) -> bool:
        """Every port's receive ring, once per wake-up (a ring with nothing ready costs one status read), through
        the pipeline: as one union batch on the fast path (``_process_union``), else port by port. Returns
        whether pcap data was written."""
        batches = []
        port_stats = self.stats.ports
        for port, receive in receivers:
            frames = receive(RING_BATCH)
            if not len(frames):
                continue
            port_stats[port].rx += len(frames)
            if not self.live:
                self.stats.not_live += len(frames)
                continue
            batches.append((port, frames))
        delay = self.delay
        if fast and self._block_out:
            if delay is not None:  # each port's batch is held as one entry (processed in _release_held)
                now = time.monotonic()
                batches = [(port, frames) for port, frames in batches if not delay.hold_in_batch(port, frames, now)]
            self._process_union(batches, outq)
            return False
        process_batch = self._process_batch
        for port, frames in batches:
            self.stats.batches += 1
            if isinstance(frames, np.ndarray):
                frames = _rows_as_bytes(frames)
            if not fast:
                for frame in frames:
                    self._ingress(port, frame)
            elif delay is None:
                outq += process_batch(port, frames)
            else:
                now = time.monotonic()
                if delay.seconds(port) > 0:
                    for frame in frames:
                        delay.hold_in(port, frame, now)
                else:
                    outq += process_batch(port, frames)
        return pcaps and bool(batches) and not fast

    def _process_union(self, batches: list[tuple[int, np.ndarray | list[bytes]]], outq: list[tuple[int, bytes]]) -> None:
        """The batches of one wake-up (port, frames), in that order, through the pipeline as one batch with a
        port per frame when they are all arrays of one frame length (the rings' common case): same-slot
        gradients of several workers are then summed in one pass (softswitch/pipeline_batch.py); else port by port."""
        if not batches:
            return
        self.stats.batches += 1
        process_batch = self._process_batch
        if len(batches) == 1:
            port, frames = batches[0]
            self._emit(process_batch(port, frames, as_block=True), outq)
            return
        width = batches[0][1].shape[1] if isinstance(batches[0][1], np.ndarray) else -1
        if width < 0 or any(not isinstance(f, np.ndarray) or f.shape[1] != width for _, f in batches):
            for port, frames in batches:
                self._emit(process_batch(port, frames, as_block=True), outq)
            return
        frames = np.concatenate([f for _, f in batches])
        ports = np.repeat(np.array([p for p, _ in batches], np.int64), [len(f) for _, f in batches])
        self._emit(process_batch(ports, frames, as_block=True), outq)

    def _emit(self, out: list[tuple[int, bytes]] | FrameBlock, outq: list[tuple[int, bytes]]) -> None:
        """A batch's outputs (rings): a list joins ``outq``; a FrameBlock's rows go out per egress port, or are
        held per egress port with link delay, after what earlier batches emitted (``outq``)."""
        if not isinstance(out, FrameBlock):
            outq += out
            return
        if not out.ports.size:
            return
        rows = out.by_port()
        if self.delay is not None:
            self._hold_out(outq)  # earlier outputs first, so each port keeps the emission order
            now = self._emitted_at if self._emitted_at is not None else time.monotonic()
            hold = self.delay.hold_out_rows
            rows = {eport: r for eport, r in rows.items() if not hold(eport, r, now)}
        else:
            self._send_all(outq)  # what earlier batches emitted leaves first
        self._send_rows(rows)

    def _send_rows(self, by_port: dict[int, np.ndarray]) -> None:
        """Queue each egress port's rows (of a batch's output block) into its transmit ring with one copy."""
        order, port_stats = self._flush_order, self.stats.ports
        for eport, rows in by_port.items():
            ring = self._rings.get(eport)
            if ring is None:
                for row in rows:
                    self._unsendable(eport, row.tobytes())
                continue
            try:
                ring.send_rows(rows)
                port_stats[eport].tx += len(rows)
            except OSError as e:
                port_stats[eport].tx_errors += len(rows)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("transmit on port %d failed: %s", eport, e)
            order.pop(eport, None)
            order[eport] = None

    def _flush_rings(self) -> None:
        """One send() per transmit ring with queued frames; frames a failed flush drops are send errors.

        Rings go out in the order of their last queued frame: the last frame of a batch (e.g. the barrier a
        test sends behind its gradients) leaves after everything emitted before it on other ports (e.g. the
        partial those gradients sent onward), as it does when frames go out one at a time.
        """
        order = [port for port in self._flush_order if port in self._rings]
        order += [port for port in self._rings if port not in self._flush_order]
        self._flush_order.clear()
        for port in order:
            ring = self._rings[port]
            dropped = ring.tx_dropped
            try:
                ring.flush()
            except OSError as e:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("transmit on port %d failed: %s", port, e)
            lost = ring.tx_dropped - dropped
            if lost:
                st = self.stats.ports[port]
                st.tx -= lost
                st.tx_errors += lost
