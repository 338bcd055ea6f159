"""Packet I/O of ``ina-switch``: AF_PACKET sockets on the named interfaces, frames through the pipeline model.

One I/O thread polls every port socket (epoll). Two ways to move frames (``IoMode``, ``ina-switch --io``):

- ``rings`` (on request, where the kernel allows it): each socket has PACKET_MMAP rings
  (softswitch/ring_io.py), run by softswitch/ring_loop.py's ``RingsLoop``. Per wake-up, every frame ready
  in every port's receive ring is one batch: the ports' arrays joined, with a port per frame, for
  ``pipeline.process_batch(ports, frames, as_block=True)``
  (same-slot gradients of several workers are summed in one pass; ports whose frames differ in length go
  one port at a time); a ``FrameBlock`` it returns goes into the egress ports' transmit rings with one copy
  per port, other outputs frame by frame, and each ring is flushed with one send() when the wake-up is done.
- ``frames`` (the default): per readable socket, up to ``BATCH`` frames are read with one recv() each, each runs
  through ``pipeline.process(port, frame)`` and every frame it returns (multicast replicas included) is
  sent with one send() on the egress port's socket. Used where rings cannot be set up (logged once). The CPU port is bridged to the P4Runtime server: frames the
pipeline sends to it become packet-ins (``packet_in`` callback), and packet-outs handed to
``inject_packet_out`` (from the gRPC threads) are processed by the I/O thread like frames received on the
CPU port.

The per-packet path does no logging unless the level is debug or trace, and pcap writing and fault
injection cost nothing when they are off.
"""
from __future__ import annotations

import collections
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable

import numpy as np

from softswitch.dataplane_stats import DataPlaneStats, IoMode, PortStats
from softswitch.faults import FaultConfig, FaultInjector
from softswitch.link_delay import DeadlineTimer, DelayLine, LinkDelay
from softswitch.pcap import PcapWriter
from softswitch.port_socket import PACKET_OUTGOING, interface_is_up, open_port_socket
from softswitch.ring_io import PacketRing, RingUnavailable, receive_drops
from softswitch.ring_loop import RingsLoop

BATCH = 64  # frames read from one socket before the next poll
RECV_SIZE = 65536  # larger than any frame a veth delivers (GSO off or on)
IDLE_FLUSH = 0.2  # seconds: pcap files are flushed when the switch has been idle this long

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
log = logging.getLogger("ina-switch")

PacketIn = Callable[[bytes], None]


class DataPlane(RingsLoop):
    """Moves frames between interfaces and the pipeline on one I/O thread.

    Args:
        pipeline: an object with ``process(ingress_port, frame) -> [(egress_port, frame)]``.
        interfaces: switch port -> interface name.
        cpu_port: the P4Runtime packet-in/packet-out port, or None (frames to it are then dropped).
        packet_in: called with each frame (packet_in header included) the pipeline sends to the CPU port.
        faults: fault injection for INA packets, or None.
        pcap_dir: write ``<iface>_in.pcap`` and ``<iface>_out.pcap`` there, or None.
        live: whether a pipeline is configured, or a function that tells (asked per packet until it says
            yes); frames received while not live are dropped uncounted, as BMv2 does before it has a program.
        dump_packet_data: log this many bytes of every frame received and sent, at info level.
        io: the I/O wanted; RINGS falls back to FRAMES (with a log line) where the kernel refuses rings.
            ``self.io`` says which one runs once the ports are open.
        link_delay: propagation delay per port, held on ingress and again on egress (softswitch/link_delay.py),
            or None.
    """

    def __init__(
        self,
        pipeline,
        interfaces: dict[int, str],
        *,
        cpu_port: int | None = None,
        packet_in: PacketIn | None = None,
        faults: FaultConfig | None = None,
        pcap_dir: str | None = None,
        live: bool | Callable[[], bool] = True,
        dump_packet_data: int = 0,
        io: IoMode = IoMode.FRAMES,
        link_delay: LinkDelay | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.interfaces = dict(interfaces)
        self.cpu_port = cpu_port
        self.packet_in = packet_in
        self._live = False
        self._live_fn: Callable[[], bool] | None = None
        self.set_live(live)
        self.dump_packet_data = dump_packet_data
        self.stats = DataPlaneStats(ports={p: PortStats() for p in self.interfaces})
        self.faults = FaultInjector(faults) if faults is not None and faults.active else None
        self._pcap_dir = pcap_dir
        self._sockets: dict[int, socket.socket] = {}
        self._ignores_outgoing: dict[int, bool] = {}
        self._pcap_in: dict[int, PcapWriter] = {}
        self._pcap_out: dict[int, PcapWriter] = {}
        self._packet_outs: collections.deque[bytes] = collections.deque()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._packet_id = 0
        self.io_requested = IoMode(io)
        self.io = IoMode.FRAMES
        self._rings: dict[int, PacketRing] = {}
        self._flush_order: dict[int, None] = {}  # ports by their last queued frame (see _flush_rings)
        self.delay = DelayLine(link_delay) if link_delay is not None and link_delay.active else None
        self._timer: DeadlineTimer | None = None
        self._process_batch = None  # the rings loop's batch entry point (held frames are released in batches)
        self._block_out = False  # whether it can return FrameBlocks (as_block)
        # while the loop runs frames released from the link delay through the pipeline: when their outputs count
        # as emitted (DelayLine.emission_time: the switch's own time is spent inside the delay); None: now
        self._emitted_at: float | None = None

    # --- life cycle -------------------------------------------------------------------------------
    def open(self) -> None:
        """Open every port (DataPlaneError names the first that fails) and the pcap files."""
        try:
            for port, iface in self.interfaces.items():
                self._sockets[port], self._ignores_outgoing[port] = open_port_socket(iface)
                log.info("Adding interface %s as port %d", iface, port)
                if not interface_is_up(self._sockets[port], iface):
                    log.warning("interface %s (port %d) is down: frames sent to it are lost until it is up", iface, port)
            self._open_rings()
            if self._pcap_dir is not None:
                for port, iface in self.interfaces.items():
                    self._pcap_in[port] = PcapWriter(os.path.join(self._pcap_dir, f"{iface}_in.pcap"))
                    self._pcap_out[port] = PcapWriter(os.path.join(self._pcap_dir, f"{iface}_out.pcap"))
        except BaseException:
            self.close()
            raise

    def _open_rings(self) -> None:
        """Rings on every port, or on none (the sockets are then reopened plain: a half-set-up ring would
        swallow frames that recv() never sees)."""
        if self.io_requested is not IoMode.RINGS or not self._sockets:
            self.io = IoMode.FRAMES
            if self._sockets:
                log.info("Packet I/O: one recv()/send() per frame (--io frames)")
            return
        try:
            if not all(self._ignores_outgoing.values()):
                raise RingUnavailable("PACKET_IGNORE_OUTGOING is missing (Linux < 4.20): a ring would see outgoing frames")
            for port, sock in self._sockets.items():
                self._rings[port] = PacketRing(sock)
        except RingUnavailable as e:
            for ring in self._rings.values():
                ring.close()
            self._rings.clear()
            for port, iface in self.interfaces.items():
                self._sockets.pop(port).close()
                self._sockets[port], self._ignores_outgoing[port] = open_port_socket(iface)
            self.io = IoMode.FRAMES
            log.warning("Packet I/O: one recv()/send() per frame: packet rings unavailable (%s)", e.strerror or e)
            return
        self.io = IoMode.RINGS
        log.info("Packet I/O: PACKET_MMAP rings (TPACKET_V2), %d KiB per port, batches through the pipeline",
                 next(iter(self._rings.values())).mapped_bytes >> 10)

    def start(self) -> None:
        """Open the ports if needed and start the I/O thread."""
        if not self._sockets and self.interfaces:
            self.open()
        self._thread = threading.Thread(target=self._run, name="dataplane", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the I/O thread, close the sockets, flush and close the pcap files."""
        self._stopping = True
        self._kick()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        for port, ring in self._rings.items():  # losses inside the rings, at warning level (experiments log warnings)
            lost = (ring.truncated, ring.receive_drops(), ring.tx_dropped)
            if any(lost):
                log.warning("port %d: rings lost %d frames longer than a slot, %d to a full receive ring (kernel), "
                            "%d in failed transmit flushes (full qdisc, link down)", port, *lost)
            ring.close()
        for port, sock in self._sockets.items():
            lost = 0 if port in self._rings else receive_drops(sock)
            if lost:
                log.warning("port %d: %d frames lost to a full receive buffer (kernel)", port, lost)
        self._rings.clear()
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        for w in (*self._pcap_in.values(), *self._pcap_out.values()):
            w.close()
        if self._wake >= 0 and (self._thread is None or not self._thread.is_alive()):
            os.close(self._wake)
            self._wake = -1

    def set_live(self, live: bool | Callable[[], bool]) -> None:
        """Whether a forwarding pipeline config is set: a value, or a function the I/O thread asks."""
        if callable(live):
            self._live, self._live_fn = False, live
        else:
            self._live, self._live_fn = bool(live), None

    @property
    def live(self) -> bool:
        if not self._live and self._live_fn is not None and self._live_fn():
            self._live = True
        return self._live

    def inject_packet_out(self, frame: bytes) -> None:
        """A packet-out (packet_out header included) from the P4Runtime server; thread-safe."""
        self._packet_outs.append(bytes(frame))
        self._kick()

    def _kick(self) -> None:
        if self._wake >= 0:
            try:
                os.eventfd_write(self._wake, 1)
            except OSError:
                pass

    # --- the I/O loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        profile = os.environ.get("INA_SWITCH_PROFILE")  # a diagnosis aid: cProfile of the I/O thread
        try:
            if profile:
                import cProfile

                profiler = cProfile.Profile()
                try:
                    profiler.runcall(self._loop)
                finally:
                    profiler.dump_stats(f"{profile}.{self.io.value}.{os.getpid()}")
            else:
                self._loop()
        except Exception:  # never die silently: the process keeps serving gRPC, so say why packets stopped
            log.exception("data plane stopped by an unexpected error")

    def _loop(self) -> None:
        if self._rings:
            self._loop_rings()
            return
        ep = select.epoll()
        recvs = {}
        for port, sock in self._sockets.items():
            ep.register(sock.fileno(), select.EPOLLIN)
            recvs[sock.fileno()] = (port, sock.recv, self._ignores_outgoing[port], sock)
        ep.register(self._wake, select.EPOLLIN)
        timer_fd = self._open_timer(ep)
        sends = {port: sock.send for port, sock in self._sockets.items()}
        self._sends = sends
        process = self.pipeline.process
        port_stats = self.stats.ports
        dontwait = socket.MSG_DONTWAIT
        monotonic = time.monotonic
        pcaps = bool(self._pcap_in)
        dirty = False  # pcap data written since the last flush
        batch = BATCH
        delay = self.delay
        # Everything that needs per-packet bookkeeping takes the slow path; decided once.
        fast = not (pcaps or self.faults is not None or log.isEnabledFor(logging.DEBUG)
                    or (self.dump_packet_data and log.isEnabledFor(logging.INFO)))
        live = self.live
        outq: list[tuple[int, bytes]] = []
        try:
            while not self._stopping:
                events = ep.poll(self._poll_timeout(dirty))
                if not events:
                    if dirty:
                        self._flush_pcaps()
                        dirty = False
                    self._release_held(outq, fast)
                    continue
                for fd, _ev in events:
                    if self._control_event(fd, timer_fd):
                        continue
                    port, recv, ignores_outgoing, sock = recvs[fd]
                    stats = port_stats[port]
                    got: list[bytes] = []
                    for _ in range(batch):
                        try:
                            if ignores_outgoing:
                                frame = recv(RECV_SIZE, dontwait)
                            else:
                                frame, addr = sock.recvfrom(RECV_SIZE, dontwait)
                                if addr[2] == PACKET_OUTGOING:
                                    continue
                        except BlockingIOError:
                            break
                        except OSError as e:  # ENETDOWN once when the interface goes down; it resumes when up
                            log.warning("port %d (%s): %s", port, self.interfaces[port], e.strerror or e)
                            break
                        stats.rx += 1
                        if not live:
                            live = self.live
                            if not live:
                                self.stats.not_live += 1
                                continue
                        if not fast:
                            self._ingress(port, frame)
                            dirty = pcaps
                        elif delay is None:
                            outq += process(port, frame)
                        else:
                            got.append(frame)
                    if got:  # held from after the read: never less than the delay since the frame arrived
                        now = monotonic()
                        for frame in got:
                            if not delay.hold_in(port, frame, now):
                                outq += process(port, frame)
                # Outputs leave after the round's inputs: a worker woken by its first result finds the others
                # queued already (fewer wake-ups); per egress port the order is the processing order.
                self._release_held(outq, fast)
        finally:
            ep.close()
            self._close_timer()
            self._flush_pcaps()

    def _control_event(self, fd: int, timer_fd: int) -> bool:
        """Serve a wake-up that is not a port's: packet-outs queued (the eventfd) or the link-delay timer.
        False for a port's socket."""
        if fd == self._wake:
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass
            while self._packet_outs:
                self._packet_out(self._packet_outs.popleft())
            return True
        if fd == timer_fd:
            self._timer.clear()
            return True
        return False

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

    def _close_timer(self) -> None:
        if self._timer is not None:
            self._timer.close()

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

    def _release_held(self, outq: list[tuple[int, bytes]], fast: bool) -> None:
        """Send what the round produced (``outq``, emptied) and everything held whose time has come; re-arm."""
        if self.faults is not None and self.faults.holding:
            self._release_due(time.monotonic())
        delay = self.delay
        if delay is None:
            self._send_all(outq)
        else:
            self._hold_out(outq)  # the round's own outputs (ports without delay, packet-outs): emitted now
            now = time.monotonic()
            # outputs of frames released from the delay count as emitted at their emission time; reset however
            # the processing ends (an exception must not leave later outputs timed from this release)
            if fast and self._block_out:  # rings: every port's due batches as one, output blocks held per port
                due = list(delay.due_in_batches(now).items())
                self._emitted_at = delay.emission_time(now)
                try:
                    self._process_union(due, outq)
                    self._hold_out(outq)
                finally:
                    self._emitted_at = None
                self._send_all(delay.due_out(time.monotonic()))
            elif fast:
                process, process_batch = self.pipeline.process, self._process_batch
                due = delay.due_in(now)
                self._emitted_at = delay.emission_time(now)
                try:
                    for port, frames in due.items():
                        if process_batch is not None:
                            outq += process_batch(port, frames)
                        else:
                            for frame in frames:
                                outq += process(port, frame)
                    self._hold_out(outq)
                finally:
                    self._emitted_at = None
                self._send_all(delay.due_out(time.monotonic()))
            else:
                due = delay.due_in(now)
                self._emitted_at = delay.emission_time(now)
                try:
                    for port, frames in due.items():
                        for frame in frames:
                            self._enter(port, frame)
                finally:
                    self._emitted_at = None
                for eport, out in delay.due_out(time.monotonic()):
                    self._transmit(self._packet_id, 0, eport, out)
            self._timer.arm(delay.next_deadline(), time.monotonic())

    def _hold_out(self, outq: list[tuple[int, bytes]]) -> None:
        """Hold (link delay) or send the frames of ``outq`` (emptied): held from when they count as emitted."""
        if outq:
            now = self._emitted_at if self._emitted_at is not None else time.monotonic()
            hold_out = self.delay.hold_out
            outq[:] = [(eport, out) for eport, out in outq if not hold_out(eport, out, now)]
            self._send_all(outq)

    def _send_all(self, outq: list[tuple[int, bytes | np.ndarray]]) -> None:
        """Send every frame of ``outq`` (emptied); an array entry is rows held by the link delay."""
        if not outq:
            return
        sends, port_stats = self._sends, self.stats.ports
        for eport, out in outq:
            if isinstance(out, np.ndarray):
                self._send_rows({eport: out})
                continue
            send = sends.get(eport)
            if send is None:
                self._unsendable(eport, out)
                continue
            try:
                send(out)
                port_stats[eport].tx += 1
            except OSError as e:
                self._send_error(eport, e)
        if self._rings:
            order = self._flush_order
            for eport, _ in outq:  # a port moves to the end with each frame: ordered by its last frame
                order.pop(eport, None)
                order[eport] = None
        outq.clear()

    # --- the slow path: pcap, faults, per-packet logs ---------------------------------------------
    def _ingress(self, port: int, frame: bytes) -> None:
        pcap = self._pcap_in.get(port)
        if pcap is not None:
            pcap.write(frame, time.time())
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
        if self.faults is not None and eport in self._sockets:
            frames = self.faults.egress(eport, out, time.monotonic())
            if not frames and log.isEnabledFor(logging.DEBUG):
                log.debug("[%d.%d] [cxt 0] Fault injection dropped packet for port %d", pid, copy_id, eport)
        else:
            frames = (out,)
        for f in frames:
            emitted = self._emitted_at if self._emitted_at is not None else time.monotonic()
            if self.delay is not None and eport in self._sockets and self.delay.hold_out(eport, f, emitted):
                continue
            self._transmit(pid, copy_id, eport, f)

    def _transmit(self, pid: int, copy_id: int, eport: int, frame: bytes) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("[%d.%d] [cxt 0] Transmitting packet of size %d out of port %d", pid, copy_id, len(frame), eport)
        if self.dump_packet_data and log.isEnabledFor(logging.INFO):
            log.info("[%d.%d] [cxt 0] Packet data: %s", pid, copy_id, frame[: self.dump_packet_data].hex(" "))
        send = self._sends.get(eport)
        if send is None:
            self._unsendable(eport, frame)
            return
        pcap = self._pcap_out.get(eport)
        if pcap is not None:
            pcap.write(frame)
        try:
            send(frame)
            self.stats.ports[eport].tx += 1
        except OSError as e:
            self._send_error(eport, e)
        if self._rings:
            self._flush_order.pop(eport, None)
            self._flush_order[eport] = None

    def _release_due(self, now: float) -> None:
        for direction, port, frame in self.faults.due(now):
            if direction == "in":
                self._pipeline(port, frame)
            elif self.delay is None or not self.delay.hold_out(port, frame, time.monotonic()):
                self._transmit(self._packet_id, 0, port, frame)

    # --- the CPU port -----------------------------------------------------------------------------
    def _packet_out(self, frame: bytes) -> None:
        self.stats.packet_out += 1
        if self.cpu_port is None:
            log.warning("packet-out ignored: no --cpu-port")
            return
        if not self.live:
            self.stats.not_live += 1
            return
        self._pipeline(self.cpu_port, frame)

    def _unsendable(self, eport: int, frame: bytes) -> None:
        if eport == self.cpu_port and self.packet_in is not None:
            self.stats.packet_in += 1
            try:
                self.packet_in(frame)
            except Exception:
                log.exception("packet-in to the P4Runtime server failed")
            return
        self.stats.no_port += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("no interface for port %d: packet dropped", eport)

    def _send_error(self, eport: int, error: OSError) -> None:
        self.stats.ports[eport].tx_errors += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("transmit on port %d failed: %s", eport, error)

    def _flush_pcaps(self) -> None:
        for w in (*self._pcap_in.values(), *self._pcap_out.values()):
            w.flush()
