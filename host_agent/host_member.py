"""A host member of Rina's ring: the copy of the chain a worker in a rack without INA keeps in its agent.

Where a rack's switch does not run INA (or holds no slots), each of its workers is one member of the job's
Rina ring (``inaproto.rina_ring``): it adds its own contribution to the partial sum its predecessor sends
and forwards it, and passes final sums on, exactly as a switch member does. Its copy *is* the program's
model (``softswitch.pipeline.InaPipeline``) with the entries ``inaproto.rina_ring.host_copy_entries`` gives
(the controller computes the same in ``controller.chains.plan_rina``), behind one UDP socket on the worker's
IP at ``host_copy_port(udp_port)``. The worker's own stream is plain INA towards that socket (its plan's rack
for it, ``host_agent.grant.plan_for``), so loss recovery, generations and owner resets are the switch's.

Datagrams become frames for the model: the worker's gradients enter on HOST_PORT from the worker's address
(their worker id set to the copy's local id); anything from another address (partials, passed-on final sums,
answers) on NETWORK_PORT from INA_UDP_PORT, as the copy's ingress binding expects (the copy decides who may
send: only its ring neighbours). What the model emits is sent to the frame's destination; an answer to the
sender (a resent partial meeting a copy that holds the final sum) goes back to the datagram's real source.

Between two host members the INA payloads travel bundled: up to ``BUNDLE_FRAMES`` back to back in one datagram
(0.876 of its frame is payload against 0.696 for single INA frames; ``inaproto.rina_partitions`` sizes the
partitions with that cost). A bundle goes when full or when the copy has nothing more to read, so it waits for
no timer; a copy takes any datagram that is a whole number of INA payloads from a host neighbour as a bundle.
Hops into or out of a switch stay single INA frames (the switch parses one). The frames of consecutive
datagrams from one source (a bundle's, or the worker's gradients read in one wake-up) go through the model
in one ``process_batch`` (the outputs and state of one frame after the other, numpy across the batch): a
host member's copy was most of its agent's CPU time, and the 50 % deployment is CPU-bound on the testbed.
docs/agent.md, "Rina as designed".
"""
from __future__ import annotations

import ipaddress
import logging
import select
import socket
import struct
import threading
from typing import Mapping

from host_agent.grant import Grant, Worker, chain_ring
from inaproto import wire
from inaproto.rina_partitions import BUNDLE_FRAMES
from inaproto.rina_ring import HOST_PORT, NETWORK_PORT, Ring, host_copy_entries, host_copy_port

__all__ = ["HostCopy", "is_host_member"]

log = logging.getLogger("host_agent.host_member")

_ETH_IP = bytes.fromhex("0800")
_O_WORKER = wire.INA_FIELD_OFFSETS["worker_id"]
_INA_PORT = wire.INA_UDP_PORT.to_bytes(2, "big")


def is_host_member(grant: Grant, worker_id: int) -> bool:
    """Whether ``grant``'s ring on chains makes ``worker_id`` a host member (it then keeps a copy)."""
    ring = chain_ring(grant, hosts=True)
    return ring is not None and any(not m.is_switch and m.member_id == worker_id for m in ring.members)


def _frame(src_mac: bytes, src_ip: bytes, dst_ip: bytes, sport: bytes, payload: bytes) -> bytes:
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, wire.INA_IPV4_LEN, 0, 0, 64, 17, 0, src_ip, dst_ip))
    ip[10:12] = wire.ipv4_checksum(ip).to_bytes(2, "big")
    udp = sport + _INA_PORT + wire.INA_UDP_LEN.to_bytes(2, "big") + b"\0\0"
    return b"\0" * 6 + src_mac + _ETH_IP + bytes(ip) + udp + payload


class HostCopy:
    """The host-member copy of one worker (a thread with its socket), following the job's grants.

    ``follow(grant)`` before the stream sees a grant: where the grant makes this worker a host member of a ring
    on chains the copy (re)starts with that generation's entries, else it drops everything it gets.
    """

    def __init__(self, me: Worker, workers: tuple[Worker, ...],
                 switch_addresses: Mapping[str, tuple[str, int]] | None = None, *,
                 bundle_frames: int = BUNDLE_FRAMES) -> None:
        if not 1 <= bundle_frames <= BUNDLE_FRAMES:
            raise ValueError(f"bundle_frames must be in 1..{BUNDLE_FRAMES}, got {bundle_frames}")
        self.me = me
        self.bundle_frames = bundle_frames  # INA payloads per datagram to a neighbour's copy (1: no bundles)
        self.workers = {w.worker_id: w for w in workers}
        self.switch_addresses = dict(switch_addresses or {})
        self.address = (me.ip, host_copy_port(me.udp_port))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind(self.address)
        except OSError as exc:
            self.sock.close()
            raise OSError(f"worker {me.worker_id}: cannot bind its host-member copy on {self.address}: {exc}") from exc
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
            except OSError:
                pass
        self._me_ip = ipaddress.IPv4Address(me.ip).packed
        self._me_mac = bytes.fromhex(me.mac.replace(":", "")) if me.mac else b"\0" * 6
        self._own = (me.ip, me.udp_port)
        self._key: tuple | None = None
        self._pipe = None  # softswitch.pipeline.InaPipeline of the current generation, or None
        self._local = 0  # the copy's id for this worker's gradients
        self._neighbours: set[str] = set()  # IPs chain packets may come from
        self._hosts: frozenset[tuple[str, int]] = frozenset()  # neighbours' copies: bundles go there
        self._bundles: dict[tuple[str, int], list[bytes]] = {}  # payloads waiting for their bundle, per copy
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.frames = 0  # INA payloads processed (diagnostics)
        self.bundles_sent = 0  # datagrams to neighbours' copies (diagnostics)
        self.bundled = 0  # INA payloads in them
        self._thread = threading.Thread(target=self._serve, name=f"host-copy-w{me.worker_id}", daemon=True)
        self._thread.start()

    def follow(self, grant: Grant) -> None:
        """Take the grant's ring: this worker's copy for its generation, or none."""
        ring = chain_ring(grant, hosts=True)
        member = None if ring is None else next((m for m in ring.members
                                                 if not m.is_switch and m.member_id == self.me.worker_id), None)
        key = None if member is None else (grant.job_id, grant.generation, ring)
        if key == self._key:
            return
        pipe, hosts = None, frozenset()
        if member is not None:
            pipe, hosts = self._pipeline(grant, ring)
        with self._lock:
            self._key, self._pipe, self._hosts = key, pipe, hosts
        log.info("worker %d: host-member copy %s", self.me.worker_id,
                 f"for generation {grant.generation}" if pipe is not None else "off")

    def _address_of(self, grant: Grant, ring: Ring, i: int) -> tuple[str, int]:
        m = ring.members[i % len(ring.members)]
        if not m.is_switch:
            w = self.workers[m.member_id]
            return (w.ip, host_copy_port(w.udp_port))
        sg = next(s for s in grant.switches if s.switch == m.switch)
        return self.switch_addresses.get(sg.switch, (sg.switch_ip, grant.ina_port))

    def _pipeline(self, grant: Grant, ring: Ring):
        from softswitch.pipeline import InaPipeline  # the program's model: the copy is what a switch runs

        i = ring.index(self.me.worker_id)
        nxt, prv = self._address_of(grant, ring, i + 1), self._address_of(grant, ring, i - 1)
        own, chain = host_copy_entries(ring, self.me.worker_id, grant.job_id, grant.generation,
                                       (self.me.mac, self.me.ip, self.me.udp_port), nxt)
        pipe = InaPipeline()
        own.insert_into(pipe)
        chain.insert_into(pipe)
        self._local = own.workers[0].worker_id
        self._neighbours = {nxt[0], prv[0]}
        r = len(ring.members)
        hosts = frozenset(a for a, k in ((nxt, i + 1), (prv, i - 1)) if not ring.members[k % r].is_switch)
        return pipe, hosts

    def _serve(self) -> None:
        self.sock.setblocking(False)
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        buf = bytearray(2048)
        while not self._stop.is_set():
            if not poll.poll(50):
                continue
            run: list[bytes] = []  # frames of consecutive datagrams from one source, for one batch
            run_key: tuple | None = None
            while True:
                try:
                    n, src = self.sock.recvfrom_into(buf)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    if self._stop.is_set():
                        return
                    break
                got = self._frames(bytes(buf[:n]), src)
                if got is None:
                    continue
                key = (got[0], src)
                if key != run_key and run:
                    self._process(run_key[0], run, run_key[1])
                    run = []
                run_key = key
                run += got[1]
                if len(run) >= 4 * BUNDLE_FRAMES:
                    self._process(key[0], run, src)
                    run = []
            if run:
                self._process(run_key[0], run, run_key[1])
            self._flush()

    def _frames(self, payload: bytes, src: tuple[str, int]) -> tuple[int, list[bytes]] | None:
        """The port and the model's frames of one datagram (a bundle: several), or None if the copy drops it."""
        with self._lock:
            pipe = self._pipe
        n = len(payload)
        if pipe is None or n == 0 or n % wire.INA_PAYLOAD_LEN:
            return None
        if src == self._own:
            if n != wire.INA_PAYLOAD_LEN:
                return None
            p = bytearray(payload)
            p[_O_WORKER] = self._local
            return HOST_PORT, [_frame(self._me_mac, self._me_ip, self._me_ip, src[1].to_bytes(2, "big"), bytes(p))]
        if src[0] in self._neighbours:
            if n > wire.INA_PAYLOAD_LEN and src not in self._hosts:
                return None  # bundles only from a neighbour's copy
            ip = ipaddress.IPv4Address(src[0]).packed
            return NETWORK_PORT, [_frame(b"\0" * 6, ip, self._me_ip, _INA_PORT, payload[off : off + wire.INA_PAYLOAD_LEN])
                                  for off in range(0, n, wire.INA_PAYLOAD_LEN)]
        return None

    def _process(self, port: int, frames: list[bytes], src: tuple[str, int]) -> None:
        """Frames of datagrams from ``src`` through the model in one batch (``process_batch``: the outputs and
        state of processing them one by one), what it emits to its destinations."""
        with self._lock:
            pipe = self._pipe
        if pipe is None:
            return
        self.frames += len(frames)
        outs = pipe.process_batch(port, frames) if len(frames) > 1 else pipe.process(port, frames[0])
        for _out_port, out in outs:
            dst = (str(ipaddress.IPv4Address(out[30:34])), int.from_bytes(out[36:38], "big"))
            if port == NETWORK_PORT and dst == (src[0], wire.INA_UDP_PORT):
                dst = src  # an answer to the sender: back to the datagram's real source
            if dst in self._hosts:
                bundle = self._bundles.setdefault(dst, [])
                bundle.append(out[wire.INA_OFFSET:])
                if len(bundle) >= self.bundle_frames:
                    self._send(b"".join(bundle), dst)
                    bundle.clear()
            else:
                self._send(out[wire.INA_OFFSET:], dst)

    def _flush(self) -> None:
        """Send every bundle waiting: the copy has read everything there was."""
        for dst, bundle in self._bundles.items():
            if bundle:
                self._send(b"".join(bundle), dst)
                bundle.clear()

    def _send(self, datagram: bytes, dst: tuple[str, int]) -> None:
        if dst in self._hosts:
            self.bundles_sent += 1
            self.bundled += len(datagram) // wire.INA_PAYLOAD_LEN
        try:
            self.sock.sendto(datagram, dst)
        except (BlockingIOError, ConnectionRefusedError, OSError):
            pass  # lost like dropped frames; recovered end to end

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
