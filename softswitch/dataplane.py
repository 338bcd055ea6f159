"""The data plane of ``ina-switch``: the ports (AF_PACKET sockets on the named interfaces) and the I/O thread.

``DataPlane`` opens a raw socket per interface (softswitch/port_socket.py) and the pcap files, and runs the
I/O loop (softswitch/io_loop.py) on a thread of its own. It is the loop's ``Ports``: a frame the pipeline sends
to a port goes out of that port's socket with one send(); the CPU port is bridged to the P4Runtime server:
frames the pipeline sends to it become packet-ins (``packet_in`` callback), and packet-outs handed to
``inject_packet_out`` (from the gRPC threads) run through the pipeline on the I/O thread, as frames received
on the CPU port.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from softswitch.dataplane_stats import DataPlaneStats, PortStats
from softswitch.faults import FaultConfig, FaultInjector
from softswitch.io_loop import IoLoop, Pipeline
from softswitch.link_delay import DelayLine, LinkDelay
from softswitch.pcap import PcapWriter
from softswitch.port_socket import interface_is_up, open_port_socket, receive_drops

__all__ = ["TRACE", "DataPlane", "PacketIn"]

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
log = logging.getLogger("ina-switch")

PacketIn = Callable[[bytes], None]


class DataPlane:
    """Moves frames between interfaces and the pipeline on one I/O thread.

    Args:
        pipeline: ``process(ingress_port, frame)`` and ``process_frames(ingress_port, frames)`` -> [(egress_port,
            frame)] (``p4src.ina_model.InaPipeline``).
        interfaces: switch port -> interface name.
        cpu_port: the P4Runtime packet-in/packet-out port, or None (frames to it are then dropped).
        packet_in: called with each frame (packet_in header included) the pipeline sends to the CPU port.
        faults: fault injection for INA packets, or None.
        pcap_dir: write ``<iface>_in.pcap`` and ``<iface>_out.pcap`` there, or None.
        live: whether a pipeline is configured, or a function that tells (asked until it says yes); frames
            received while not live are dropped uncounted, as BMv2 does before it has a program.
        dump_packet_data: log this many bytes of every frame received and sent, at info level.
        link_delay: propagation delay per port, held on ingress and again on egress (softswitch/link_delay.py),
            or None.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        interfaces: dict[int, str],
        *,
        cpu_port: int | None = None,
        packet_in: PacketIn | None = None,
        faults: FaultConfig | None = None,
        pcap_dir: str | None = None,
        live: bool | Callable[[], bool] = True,
        dump_packet_data: int = 0,
        link_delay: LinkDelay | None = None,
    ) -> None:
        self.interfaces = dict(interfaces)
        self.cpu_port = cpu_port
        self.packet_in = packet_in
        self.stats = DataPlaneStats(ports={p: PortStats() for p in self.interfaces})
        self.sockets: dict[int, socket.socket] = {}
        self.ignores_outgoing: dict[int, bool] = {}
        self._pcap_dir = pcap_dir
        self._pcap_in: dict[int, PcapWriter] = {}
        self._pcap_out: dict[int, PcapWriter] = {}
        self._live = False
        self._live_fn: Callable[[], bool] | None = None
        self.set_live(live)
        self.faults = FaultInjector(faults) if faults is not None and faults.active else None
        self.delay = DelayLine(link_delay) if link_delay is not None and link_delay.active else None
        self.loop = IoLoop(self, pipeline, cpu_port=cpu_port, faults=self.faults, delay=self.delay,
                           dump_packet_data=dump_packet_data)
        self._thread: threading.Thread | None = None

    # --- life cycle -------------------------------------------------------------------------------
    def open(self) -> None:
        """Open every port (DataPlaneError names the first that fails) and the pcap files."""
        try:
            for port, iface in self.interfaces.items():
                self.sockets[port], self.ignores_outgoing[port] = open_port_socket(iface)
                log.info("Adding interface %s as port %d", iface, port)
                if not interface_is_up(self.sockets[port], iface):
                    log.warning("interface %s (port %d) is down: frames sent to it are lost until it is up", iface, port)
            if self._pcap_dir is not None:
                for port, iface in self.interfaces.items():
                    self._pcap_in[port] = PcapWriter(os.path.join(self._pcap_dir, f"{iface}_in.pcap"))
                    self._pcap_out[port] = PcapWriter(os.path.join(self._pcap_dir, f"{iface}_out.pcap"))
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Open the ports if needed and start the I/O thread."""
        if not self.sockets and self.interfaces:
            self.open()
        self._thread = threading.Thread(target=self.loop.run, name="dataplane", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the I/O thread, close the sockets, flush and close the pcap files."""
        self.loop.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        """Close the sockets (naming the frames each lost to a full receive buffer) and the pcap files."""
        for port, sock in self.sockets.items():
            lost = receive_drops(sock)
            if lost:  # at warning level: experiments log warnings only
                log.warning("port %d: %d frames lost to a full receive buffer (kernel)", port, lost)
            sock.close()
        self.sockets.clear()
        for w in (*self._pcap_in.values(), *self._pcap_out.values()):
            w.close()
        if self._thread is None or not self._thread.is_alive():
            self.loop.close()

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
        self.loop.inject_packet_out(frame)

    # --- the loop's Ports ---------------------------------------------------------------------------
    @property
    def pcaps(self) -> bool:
        return bool(self._pcap_in)

    def send(self, port: int, frame: bytes) -> None:
        """One frame out of ``port`` (pcap'd); to the CPU port it is a packet-in; to a port without an interface
        it is dropped."""
        sock = self.sockets.get(port)
        if sock is None:
            self._unsendable(port, frame)
            return
        pcap = self._pcap_out.get(port)
        if pcap is not None:
            pcap.write(frame)
        try:
            sock.send(frame)
            self.stats.ports[port].tx += 1
        except OSError as e:
            self._send_error(port, e)

    def send_all(self, frames: list[tuple[int, bytes]]) -> None:
        """``send`` for each (port, frame) in turn, without pcap (the loop's path when no pcap is written)."""
        sockets, port_stats = self.sockets, self.stats.ports
        for port, frame in frames:
            sock = sockets.get(port)
            if sock is None:
                self._unsendable(port, frame)
                continue
            try:
                sock.send(frame)
                port_stats[port].tx += 1
            except OSError as e:
                self._send_error(port, e)

    def write_pcap_in(self, port: int, frame: bytes) -> None:
        pcap = self._pcap_in.get(port)
        if pcap is not None:
            pcap.write(frame, time.time())

    def flush_pcaps(self) -> None:
        for w in (*self._pcap_in.values(), *self._pcap_out.values()):
            w.flush()

    def _unsendable(self, port: int, frame: bytes) -> None:
        if port == self.cpu_port and self.packet_in is not None:
            self.stats.packet_in += 1
            try:
                self.packet_in(frame)
            except Exception:
                log.exception("packet-in to the P4Runtime server failed")
            return
        self.stats.no_port += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("no interface for port %d: packet dropped", port)

    def _send_error(self, port: int, error: OSError) -> None:
        self.stats.ports[port].tx_errors += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("transmit on port %d failed: %s", port, error)
