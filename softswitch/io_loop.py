"""The I/O loop of ``ina-switch``'s data plane: frames from the ports' sockets through the pipeline and out again.

One thread runs ``IoLoop.run``: it waits (epoll) on every port's socket, an eventfd that packet-outs and
``stop`` kick, and the link delay's timerfd. Per readable socket it reads up to ``BATCH`` frames with one
recv() each and runs them through the pipeline (``process_frames``: one lock for the socket's frames); when
the round is done every frame the pipeline returned (multicast replicas included) goes out with one send()
each, so a worker woken by its first result finds the others queued already. Frames held by the link delay
(softswitch/link_delay.py) or by fault reordering are released whenever the loop wakes up.

Everything that needs per-frame bookkeeping (pcap, fault injection, per-packet logs at debug level or
``--dump-packet-data``) takes the slow path, decided once: one frame at a time, logged in BMv2's words. With
none of them on, the per-frame path does no logging work and pcap and faults cost nothing.

The loop sees the switch's ports through ``Ports`` (softswitch/dataplane.py's ``DataPlane`` is one): their
sockets, the send of one frame to a port (the CPU port bridged to P4Runtime), pcap files and whether a
program is running.
"""
from __future__ import annotations

import collections
import logging
import os
import select
import socket
import time
from typing import Protocol

from softswitch.dataplane_stats import DataPlaneStats
from softswitch.faults import FaultInjector
from softswitch.link_delay import DeadlineTimer, DelayLine
from softswitch.port_socket import PACKET_OUTGOING

__all__ = ["BATCH", "IDLE_FLUSH", "IoLoop", "Pipeline", "Ports"]

BATCH = 64  # frames read from one socket before the next poll
RECV_SIZE = 65536  # larger than any frame a veth delivers (GSO off or on)
IDLE_FLUSH = 0.2  # seconds: pcap files are flushed when the switch has been idle this long

log = logging.getLogger("ina-switch")

Output = list[tuple[int, bytes]]


class Pipeline(Protocol):
    """What the loop runs frames through (``p4src.ina_model.InaPipeline``)."""

    def process(self, ingress_port: int, frame: bytes) -> Output: ...
    def process_frames(self, ingress_port: int, frames: list[bytes]) -> Output: ...


class Ports(Protocol):
    """The switch's ports as the loop uses them."""

    stats: DataPlaneStats
    interfaces: dict[int, str]  # port -> interface name
    sockets: dict[int, socket.socket]  # port -> its open AF_PACKET socket
    ignores_outgoing: dict[int, bool]  # port -> whether the kernel hides the socket's own sends (else: pkttype)
    pcaps: bool  # pcap files are written

    @property
    def live(self) -> bool: ...  # a program is running (else frames are dropped uncounted)
    def send(self, port: int, frame: bytes) -> None: ...  # one frame out (the CPU port: a packet-in)
    def send_all(self, frames: Output) -> None: ...  # ``send`` for each (port, frame), without pcap
    def write_pcap_in(self, port: int, frame: bytes) -> None: ...
    def flush_pcaps(self) -> None: ...


class IoLoop:
    """The data plane's I/O thread: ``run`` until ``stop``; ``inject_packet_out`` from any thread.

    Args:
        ports: the sockets and where frames go (``Ports``).
        pipeline: runs frames (``Pipeline``).
        cpu_port: the port packet-outs enter on, or None (they are then ignored).
        faults: fault injection for INA packets, or None.
        delay: the links' propagation delay, or None.
        dump_packet_data: log this many bytes of every frame received and sent, at info level.
    """

    def __init__(self, ports: Ports, pipeline: Pipeline, *, cpu_port: int | None = None,
                 faults: FaultInjector | None = None, delay: DelayLine | None = None, dump_packet_data: int = 0) -> None:
        self.ports, self.pipeline, self.cpu_port = ports, pipeline, cpu_port
        self.faults, self.delay, self.dump_packet_data = faults, delay, dump_packet_data
        self._packet_outs: collections.deque[bytes] = collections.deque()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stopping = False
        self._timer: DeadlineTimer | None = None
        self._packet_id = 0
        # while frames released from the link delay run through the pipeline: when their outputs count as emitted
        # (DelayLine.emission_time: the switch's own time is spent inside the delay); None: now
        self.emitted_at: float | None = None

    # --- the interface ----------------------------------------------------------------------------
    def inject_packet_out(self, frame: bytes) -> None:
        """A packet-out (packet_out header included) from the P4Runtime server; thread-safe."""
        self._packet_outs.append(bytes(frame))
        self._kick()

    def stop(self) -> None:
        """Make ``run`` return (from any thread)."""
        self._stopping = True
        self._kick()

    def close(self) -> None:
        """Release the eventfd (after ``run`` returned)."""
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1

    def run(self) -> None:
        """Serve the ports until ``stop``; an unexpected error is logged (the process keeps serving gRPC, so it
        says why frames stopped)."""
        try:
            self._loop()
        except Exception:
            log.exception("data plane stopped by an unexpected error")

    def _kick(self) -> None:
        if self._wake >= 0:
            try:
                os.eventfd_write(self._wake, 1)
            except OSError:
                pass

    # --- the loop ---------------------------------------------------------------------------------
    @property
    def slow(self) -> bool:
        """Whether every frame needs bookkeeping of its own: pcap, faults, per-packet logs."""
        return (self.ports.pcaps or self.faults is not None or log.isEnabledFor(logging.DEBUG)
                or bool(self.dump_packet_data and log.isEnabledFor(logging.INFO)))

    def _loop(self) -> None:
        ep = select.epoll()
        readers = {}
        for port, sock in self.ports.sockets.items():
            ep.register(sock.fileno(), select.EPOLLIN)
            readers[sock.fileno()] = (port, sock)
        ep.register(self._wake, select.EPOLLIN)
        timer_fd = self._open_timer(ep)
        slow = self.slow
        dirty = False  # pcap data written since the last flush
        outq: Output = []
        try:
            while not self._stopping:
                events = ep.poll(self._poll_timeout(dirty))
                if not events and dirty:
                    self.ports.flush_pcaps()
                    dirty = False
                for fd, _ev in events:
                    if fd == self._wake:
                        self._serve_packet_outs()
                    elif fd == timer_fd:
                        self._timer.clear()
                    else:
                        port, sock = readers[fd]
                        frames = self._read(port, sock)
                        if frames:
                            self._enter_all(port, frames, outq, slow)
                            dirty = dirty or self.ports.pcaps
                self.release_held(outq, slow)
        finally:
            ep.close()
            if self._timer is not None:
                self._timer.close()
            self.ports.flush_pcaps()

    def _read(self, port: int, sock: socket.socket) -> list[bytes]:
        """Up to BATCH frames of one port's socket (none while no program runs: counted as not live)."""
        stats = self.ports.stats
        recv, ignores_outgoing = sock.recv, self.ports.ignores_outgoing[port]
        frames: list[bytes] = []
        append, dontwait = frames.append, socket.MSG_DONTWAIT
        for _ in range(BATCH):
            try:
                if ignores_outgoing:
                    append(recv(RECV_SIZE, dontwait))
                else:
                    frame, addr = sock.recvfrom(RECV_SIZE, dontwait)
                    if addr[2] != PACKET_OUTGOING:
                        append(frame)
            except BlockingIOError:
                break
            except OSError as e:  # ENETDOWN once when the interface goes down; it resumes when up
                log.warning("port %d (%s): %s", port, self.ports.interfaces[port], e.strerror or e)
                break
        stats.ports[port].rx += len(frames)
        if frames and not self.ports.live:
            stats.not_live += len(frames)
            return []
        return frames

    def _enter_all(self, port: int, frames: list[bytes], outq: Output, slow: bool) -> None:
        """A port's frames just read: into the pipeline now, or held by the port's link delay."""
        if slow:
            for frame in frames:
                self._ingress(port, frame)
            return
        delay = self.delay
        if delay is not None:  # held from after the read: never less than the delay since the frame arrived
            now = time.monotonic()
            frames = [f for f in frames if not delay.hold_in(port, f, now)]
        if frames:
            outq += self.pipeline.process_frames(port, frames)

    def _serve_packet_outs(self) -> None:
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass
        while self._packet_outs:
            self._packet_out(self._packet_outs.popleft())

    # --- held frames: link delay and fault reordering ---------------------------------------------
    def _open_timer(self, ep: select.epoll) -> int:
        """The link-delay timer's fd in ``ep`` (-1 without delay or without timerfd)."""
        if self.delay is None:
            return -1
        self._timer = DeadlineTimer()
        if self._timer.fd >= 0:
            ep.register(self._timer.fd, select.EPOLLIN)
        log.info("Link delay: %s", self.delay.delays.describe())
        return self._timer.fd

    def _poll_timeout(self, dirty: bool) -> float:
        """Seconds the loop may sleep: until the pcap flush, a fault's held frame, a delayed frame (-1: no end)."""
        timeout = IDLE_FLUSH if dirty else -1.0
        deadlines = []
        if self.faults is not None and self.faults.holding:
            deadlines.append(self.faults.next_deadline())
        if self.delay is not None and self._timer is not None and self._timer.fd < 0:
            deadline = self.delay.next_deadline()
            if deadline is not None:
                deadlines.append(deadline)
        if deadlines:
            rest = max(0.0, min(deadlines) - time.monotonic())
            timeout = rest if timeout < 0 else min(timeout, rest)
        return timeout

    def release_held(self, outq: Output, slow: bool) -> None:
        """Send what the round produced (``outq``, emptied) and everything held whose time has come; re-arm."""
        if self.faults is not None and self.faults.holding:
            self._release_faults(time.monotonic())
        delay = self.delay
        if delay is None:
            self._send_all(outq)
            return
        self._hold_out(outq)  # the round's own outputs (ports without delay, packet-outs): emitted now
        now = time.monotonic()
        due = delay.due_in(now)
        # outputs of frames released from the delay count as emitted at their emission time; reset however the
        # processing ends (an exception must not leave later outputs timed from this release)
        self.emitted_at = delay.emission_time(now)
        try:
            for port, frames in due.items():
                if slow:
                    for frame in frames:
                        self._enter(port, frame)
                else:
                    outq += self.pipeline.process_frames(port, frames)
            self._hold_out(outq)
        finally:
            self.emitted_at = None
        if slow:
            for eport, out in delay.due_out(time.monotonic()):
                self._transmit(self._packet_id, 0, eport, out)
        else:
            self._send_all(delay.due_out(time.monotonic()))
        self._timer.arm(delay.next_deadline(), time.monotonic())

    def _hold_out(self, outq: Output) -> None:
        """Hold (link delay) or send the frames of ``outq`` (emptied): held from when they count as emitted."""
        if outq:
            now = self.emitted_at if self.emitted_at is not None else time.monotonic()
            hold_out = self.delay.hold_out
            outq[:] = [(eport, out) for eport, out in outq if not hold_out(eport, out, now)]
            self._send_all(outq)

    def _send_all(self, outq: Output) -> None:
        """Send every frame of ``outq`` (emptied)."""
        if outq:
            self.ports.send_all(outq)
            outq.clear()

    def _release_faults(self, now: float) -> None:
        for direction, port, frame in self.faults.due(now):
            if direction == "in":
                self._pipeline(port, frame)
            elif self.delay is None or not self.delay.hold_out(port, frame, time.monotonic()):
                self._transmit(self._packet_id, 0, port, frame)

    # --- the slow path: pcap, faults, per-packet logs ---------------------------------------------
    def _ingress(self, port: int, frame: bytes) -> None:
        self.ports.write_pcap_in(port, frame)
        if self.delay is not None and self.delay.hold_in(port, frame, time.monotonic()):
            return
        self._enter(port, frame)

    def _enter(self, port: int, frame: bytes) -> None:
        """A received frame, its link delay over, meets the faults and the pipeline."""
        if self.faults is not None:
            frames = self.faults.ingress(port, frame, time.monotonic())
            if not frames:
                self._packet_id += 1
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("[%d.0] [cxt 0] Fault injection dropped packet received on port %d", self._packet_id, port)
        else:
            frames = (frame,)
        for f in frames:
            self._pipeline(port, f)

    def _pipeline(self, port: int, frame: bytes) -> None:
        self._packet_id += 1
        pid = self._packet_id
        debug = log.isEnabledFor(logging.DEBUG)
        if debug:
            log.debug("[%d.0] [cxt 0] Processing packet received on port %d", pid, port)
        if self.dump_packet_data and log.isEnabledFor(logging.INFO):
            log.info("[%d.0] [cxt 0] Packet data: %s", pid, frame[: self.dump_packet_data].hex(" "))
        outs = self.pipeline.process(port, frame)
        if debug:
            if not outs:
                log.debug("[%d.0] [cxt 0] Dropping packet at the end of ingress", pid)
            elif len(outs) > 1:
                log.debug("[%d.0] [cxt 0] Multicast: %d replicas", pid, len(outs))
        for copy_id, (eport, out) in enumerate(outs):
            self._egress(pid, copy_id, eport, out)

    def _egress(self, pid: int, copy_id: int, eport: int, out: bytes) -> None:
        to_port = eport in self.ports.sockets
        if self.faults is not None and to_port:
            frames = self.faults.egress(eport, out, time.monotonic())
            if not frames and log.isEnabledFor(logging.DEBUG):
                log.debug("[%d.%d] [cxt 0] Fault injection dropped packet for port %d", pid, copy_id, eport)
        else:
            frames = (out,)
        for f in frames:
            emitted = self.emitted_at if self.emitted_at is not None else time.monotonic()
            if self.delay is not None and to_port and self.delay.hold_out(eport, f, emitted):
                continue
            self._transmit(pid, copy_id, eport, f)

    def _transmit(self, pid: int, copy_id: int, eport: int, frame: bytes) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("[%d.%d] [cxt 0] Transmitting packet of size %d out of port %d", pid, copy_id, len(frame), eport)
        if self.dump_packet_data and log.isEnabledFor(logging.INFO):
            log.info("[%d.%d] [cxt 0] Packet data: %s", pid, copy_id, frame[: self.dump_packet_data].hex(" "))
        self.ports.send(eport, frame)

    # --- the CPU port -----------------------------------------------------------------------------
    def _packet_out(self, frame: bytes) -> None:
        self.ports.stats.packet_out += 1
        if self.cpu_port is None:
            log.warning("packet-out ignored: no --cpu-port")
            return
        if not self.ports.live:
            self.ports.stats.not_live += 1
            return
        self._pipeline(self.cpu_port, frame)

