"""A host member of Rina's ring: the copy of the chain a worker in a rack without INA keeps in its agent.

Where a rack's switch does not run INA (or holds no slots), each of its workers is one member of the job's
Rina ring (``inaproto.rina_ring``): it adds its own contribution to the partial sum its predecessor sends
and forwards it, and passes final sums on, exactly as a switch member does. Its copy *is* the program's
model (``p4src.ina_model.InaPipeline``) with the entries ``inaproto.rina_ring.host_copy_entries`` gives
(the controller computes the same in ``controller.chains.plan_rina``), behind one UDP socket on the worker's
IP at ``host_copy_port(udp_port)``. The worker's own stream is plain INA towards that socket (its plan's rack
for it, ``host_agent.grant.plan_for``), so loss recovery, generations and owner resets are the switch's.

Datagrams become frames for the model: the worker's gradients enter on HOST_PORT from the worker's address
(their worker id set to the copy's local id); anything from another address (partials, passed-on final sums,
answers) on NETWORK_PORT from INA_UDP_PORT, as the copy's ingress binding expects (the copy decides who may
send: only its ring neighbours). What the model emits is sent to the frame's destination; an answer to the
sender (a resent partial meeting a copy that holds the final sum) goes back to the datagram's real source.

Between two host members the INA payloads travel in runs (``inaproto.rina_runs``): up to ``RUN_PAYLOADS`` (11)
payloads under one 17-byte header that holds what they share, each with its slot and seq offset, in one datagram
(0.932 of its frame is payload, about a TCP ring's, against 0.696 for single INA frames; ``inaproto.rina_partitions``
sizes the partitions with that cost); a copy takes a run or a single INA payload from a host neighbour and drops
any other datagram alone. Hops into or out of a switch stay single INA frames (the switch parses one).

The 50 % deployment is CPU-bound on the testbed, so the copy moves datagrams in batches: a wake-up drains the
socket with UDP GRO (``DatagramIo.drain_sources``: one sender's datagrams per read, with its address), runs
each source's frames through the model in one ``process_frames`` (built as numpy rows under a cached header, no
per-datagram header in Python), and sends what the model emitted once per destination: single frames as one
GSO run, runs as one GSO send of the full ones and one datagram for each shorter one (no timer: a run waits for
nothing but the end of the wake-up). The copy runs in a child process of its own (no interpreter lock shared with
the agent's sender).
docs/agent.md, "Rina on chains".
"""
from __future__ import annotations

import ipaddress
import logging
import multiprocessing
import multiprocessing.connection
import select
import socket
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection

import numpy as np

from host_agent.grant import Grant, Worker, chain_ring
from host_agent.udp_io import DatagramIo
from inaproto import rina_runs, wire
from inaproto.rina_ring import HOST_PORT, NETWORK_PORT, Ring, host_copy_entries, host_copy_port

__all__ = ["HostCopy", "HostCopyFailed", "is_host_member"]

log = logging.getLogger("host_agent.host_member")

_O_WORKER = wire.INA_FIELD_OFFSETS["worker_id"]
NO_MAC = b"\0" * 6
PAYLOAD = wire.INA_PAYLOAD_LEN
_READ_BUFFER = 1 << 20  # one wake-up's reads at most (GRO: 16 reads of up to 64 KiB)


def is_host_member(grant: Grant, worker_id: int) -> bool:
    """Whether ``grant``'s ring on chains makes ``worker_id`` a host member (it then keeps a copy)."""
    ring = chain_ring(grant, hosts=True)
    return ring is not None and any(not m.is_switch and m.member_id == worker_id for m in ring.members)


class _Copy:
    """The copy itself, in the child process ``HostCopy`` starts: its socket, the model of the current grant's
    generation, and the loop serving them and the agent's requests (``serve``)."""

    def __init__(self, me: Worker, workers: tuple[Worker, ...], switch_addresses: Mapping[str, tuple[str, int]]) -> None:
        self.me = me
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
        self._me_mac = bytes.fromhex(me.mac.replace(":", "")) if me.mac else NO_MAC
        self._own = (me.ip, me.udp_port)
        self._key: tuple | None = None
        self._pipe = None  # p4src.ina_model.InaPipeline of the current generation, or None
        self._local = 0  # the copy's id for this worker's gradients
        self._neighbours: set[str] = set()  # IPs chain packets may come from
        self._hosts: frozenset[tuple[str, int]] = frozenset()  # neighbours' copies: bundles go there
        self._io = DatagramIo(self.sock, batched=True, name=f"worker {me.worker_id}'s host-member copy")
        self._rbuf = bytearray(_READ_BUFFER)
        self._routes: dict[bytes, tuple[str, int]] = {}  # a frame's destination IPv4 address and UDP port
        self._headers: dict[tuple[str, int], np.ndarray] = {}  # the model's frame headers per source
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.frames = 0  # INA payloads processed (diagnostics)
        self.bundles_sent = 0  # datagrams to neighbours' copies (diagnostics)
        self.bundled = 0  # INA payloads in them
        self.cpu_seconds = 0.0  # CPU time of the serving thread (or process) so far

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
        from p4src.ina_model import InaPipeline  # the program's model: the copy is what a switch runs

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

    def serve(self, control: Connection) -> None:
        """Serve the socket and the agent's requests on ``control`` until ``stop``."""
        cpu_start = time.process_time()
        self.sock.setblocking(False)
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        poll.register(control.fileno(), select.POLLIN)
        view = memoryview(self._rbuf)
        full = len(view) - self._io.read_room
        while not self._stop.is_set():
            if not poll.poll(50):
                continue
            if control.poll():
                _answer(self, control)
                continue
            while True:  # until the socket is empty: a drain that filled the buffer leaves more to read
                reads: dict[tuple[str, int], list[tuple[int, int, int]]] = {}  # per source, in order of arrival
                try:
                    got = self._io.drain_sources(view, lambda off, n, seg, src, reads=reads: reads.setdefault(src, []).append((off, n, seg)))
                except OSError as exc:  # what was read is served; the socket is polled again (a lost frame is resent)
                    if self._stop.is_set():
                        return
                    log.warning("worker %d: host-member copy: receive failed: %s", self.me.worker_id, exc)
                    got = 0
                if reads:
                    self._wake(reads)
                if got <= full or self._stop.is_set():
                    break
            self.cpu_seconds = time.process_time() - cpu_start

    def report(self) -> dict[str, float | int]:
        """The copy's counters and the CPU seconds it served with so far."""
        return {"frames": self.frames, "bundles_sent": self.bundles_sent, "bundled": self.bundled,
                "cpu_seconds": self.cpu_seconds}

    def _wake(self, reads: dict[tuple[str, int], list[tuple[int, int, int]]]) -> None:
        """One wake-up's datagrams, one batch per source, through the model; what it emits sent per destination
        (runs of INA frames in GSO sends, runs under one header towards a neighbour's copy)."""
        with self._lock:
            pipe, hosts = self._pipe, self._hosts
        if pipe is None:
            return
        out: dict[tuple[str, int], list[bytes]] = {}  # INA payloads per destination, in emission order
        for src, runs in reads.items():
            batch = self._rows(src, runs, hosts)
            if batch is None:
                continue
            port, rows = batch
            self.frames += len(rows)
            emitted = pipe.process_frames(port, rows)
            for _out_port, frame in emitted:
                dst = self._routes.get(frame[30:38])
                if dst is None:
                    dst = self._routes[frame[30:38]] = (str(ipaddress.IPv4Address(frame[30:34])),
                                                        int.from_bytes(frame[36:38], "big"))
                if port == NETWORK_PORT and dst[1] == wire.INA_UDP_PORT and dst[0] == src[0]:
                    dst = src  # an answer to the sender: back to the datagram's real source
                if len(frame) != wire.INA_FRAME_LEN:  # not a whole INA payload: on its own, never in a run
                    self._send_run(memoryview(frame[wire.INA_OFFSET:]), len(frame) - wire.INA_OFFSET, 1, dst)
                    continue
                out.setdefault(dst, []).append(frame[wire.INA_OFFSET:])
        for dst, payloads in out.items():
            k = len(payloads)
            if dst in hosts:  # runs of up to RUN_PAYLOADS payloads under one header
                # the full runs leave in one GSO send, then the shorter ones: a wake-up's payloads may leave out of
                # their order (each cell of a copy is independent; nothing downstream depends on the order)
                full, whole, rest = rina_runs.encode(payloads)
                self._send_run(memoryview(full), len(full) // whole if whole else 0, whole, dst)
                for run in rest:
                    self._send_run(memoryview(run), len(run), 1, dst)
                self.bundles_sent += whole + len(rest)
                self.bundled += k
                continue
            self._send_run(memoryview(b"".join(payloads)), PAYLOAD, k, dst)  # single INA payloads to a switch

    def _rows(self, src: tuple[str, int], runs: list[tuple[int, int, int]], hosts: frozenset
              ) -> tuple[int, np.ndarray] | None:
        """The port and the model's frames (rows) of one source's reads, or None if the copy drops them all.

        The worker's gradients and frames from a switch are single INA payloads per datagram; a neighbour's
        copy sends runs (``inaproto.rina_runs``) or single INA payloads. Other datagrams are dropped."""
        if src == self._own:
            port, bundles = HOST_PORT, False
        elif src[0] in self._neighbours:
            port, bundles = NETWORK_PORT, src in hosts
        else:
            return None
        view = memoryview(self._rbuf)
        if bundles:
            return self._run_rows(src, runs, view)
        keep: list[memoryview] = []
        for off, n, seg in runs:
            tail = n % seg
            if seg != PAYLOAD:
                continue  # every datagram of the read has the segment's size but the last
            good = n if tail in (0, PAYLOAD) else n - tail
            if good:
                keep.append(view[off : off + good])
        if not keep:
            return None
        payloads = np.frombuffer(keep[0] if len(keep) == 1 else b"".join(keep), np.uint8).reshape(-1, PAYLOAD)
        return port, self._frames(src, port, payloads)

    def _run_rows(self, src: tuple[str, int], runs: list[tuple[int, int, int]], view: memoryview
                  ) -> tuple[int, np.ndarray] | None:
        """The model's frames of a neighbour copy's reads: each datagram a run or a single INA payload
        (``inaproto.rina_runs``); a datagram that is neither is dropped alone."""
        parts: list[bytes] = []
        for off, n, seg in runs:
            for start in range(off, off + n, seg):
                got = rina_runs.decode(view[start : min(start + seg, off + n)])
                if got is not None:
                    parts.append(got)
        if not parts:
            return None
        payloads = np.frombuffer(parts[0] if len(parts) == 1 else b"".join(parts), np.uint8).reshape(-1, PAYLOAD)
        return NETWORK_PORT, self._frames(src, NETWORK_PORT, payloads)

    def _frames(self, src: tuple[str, int], port: int, payloads: np.ndarray) -> np.ndarray:
        """Whole INA payloads as the model's frames, under the cached header of ``src``."""
        rows = np.empty((len(payloads), wire.INA_FRAME_LEN), np.uint8)
        rows[:, : wire.INA_OFFSET] = self._header(src, port)
        rows[:, wire.INA_OFFSET :] = payloads
        if port == HOST_PORT:
            rows[:, wire.INA_OFFSET + _O_WORKER] = self._local
        return rows

    def _header(self, src: tuple[str, int], port: int) -> np.ndarray:
        """The Ethernet, IPv4 and UDP headers the model sees on frames from ``src`` (the same on all of them)."""
        h = self._headers.get(src)
        if h is None:
            if port == HOST_PORT:
                mac, ip, sport = self._me_mac, self._me_ip, src[1]
            else:
                mac, ip, sport = NO_MAC, ipaddress.IPv4Address(src[0]).packed, wire.INA_UDP_PORT
            frame = wire.udp_frame(mac, NO_MAC, ip, self._me_ip, sport, wire.INA_UDP_PORT, bytes(PAYLOAD))
            h = self._headers[src] = np.frombuffer(frame[: wire.INA_OFFSET], np.uint8)
        return h

    def _send_run(self, data: memoryview, size: int, count: int, dst: tuple[str, int]) -> None:
        """``count`` datagrams of ``size`` bytes to ``dst`` (GSO where the kernel has it); one the socket cannot
        take is lost like a dropped frame and recovered end to end."""
        try:
            self._io.send_run(data, size, count, dst)
        except OSError:
            pass

    def stop(self) -> None:
        self._stop.set()


class HostCopyFailed(RuntimeError):
    """The copy's child process failed (the agent's call cannot complete without it)."""


class HostCopy:
    """The host-member copy of one worker, following the job's grants, in a child process of its own.

    ``follow(grant)`` before the stream sees a grant: where the grant makes this worker a host member of a ring
    on chains the copy (re)starts with that generation's entries, else it drops everything it gets. The copy runs
    in a child (``sys.executable``, spawned: its own interpreter, no lock shared with the agent's stream), binds its
    socket there and answers each ``follow`` before it returns, so the order holds across the two processes; if the
    child dies, ``follow`` and ``report`` raise ``HostCopyFailed`` and the agent's log says so at once.
    """

    def __init__(self, me: Worker, workers: tuple[Worker, ...],
                 switch_addresses: Mapping[str, tuple[str, int]] | None = None) -> None:
        self.me = me
        self.address = (me.ip, host_copy_port(me.udp_port))
        self._last: dict[str, float | int] = {"frames": 0, "bundles_sent": 0, "bundled": 0, "cpu_seconds": 0.0}
        self._closed = self._stopping = False
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter from sys.executable: no forked threads
        self._conn, child = ctx.Pipe()
        self._lock = threading.Lock()  # one request at a time on the pipe
        self._proc = ctx.Process(target=_child_main, args=(child, me, tuple(workers), dict(switch_addresses or {})),
                                 name=f"host-copy-w{me.worker_id}", daemon=True)
        self._proc.start()
        child.close()
        kind, value = self._reply(_START_TIMEOUT)
        if kind != "ready":  # a child still starting must not keep the copy's port once the agent gave up
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(timeout=5)
            self._conn.close()
            raise OSError(value)
        self._watch = threading.Thread(target=self._watch_child, name=f"host-copy-w{me.worker_id}-watch", daemon=True)
        self._watch.start()

    def follow(self, grant: Grant) -> None:
        """Take the grant's ring: this worker's copy for its generation, or none."""
        self._request("follow", grant)

    def report(self) -> dict[str, float | int]:
        """frames (INA payloads processed), bundles_sent and bundled (datagrams to neighbours' copies, payloads
        in them), cpu_seconds (the child process's)."""
        if self._closed:
            return dict(self._last)
        return self._request("report")

    @property
    def frames(self) -> int:
        return int(self.report()["frames"])

    @property
    def bundles_sent(self) -> int:
        return int(self.report()["bundles_sent"])

    @property
    def bundled(self) -> int:
        return int(self.report()["bundled"])

    def cpu_report(self) -> dict[str, float | int]:
        """The copy's CPU seconds and INA payloads (``Agent.cpu_report``: the child's CPU is not in the agent's
        process time, so the agent adds it)."""
        r = self.report()
        return {"host_copy_cpu_seconds": r["cpu_seconds"], "host_copy_frames": r["frames"]}

    def _request(self, kind: str, value: object = None) -> object:
        with self._lock:
            if not self._proc.is_alive():
                raise HostCopyFailed(f"worker {self.me.worker_id}: its host-member copy's process exited "
                                     f"(code {self._proc.exitcode})")
            try:
                self._conn.send((kind, value))
            except (OSError, ValueError) as exc:
                raise HostCopyFailed(f"worker {self.me.worker_id}: its host-member copy's process is gone: {exc}") from exc
            answer, result = self._reply(_REQUEST_TIMEOUT)
        if answer != "ok":
            raise HostCopyFailed(f"worker {self.me.worker_id}: its host-member copy failed: {result}")
        return result

    def _reply(self, timeout: float) -> tuple[str, object]:
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            pass
        return "error", (f"worker {self.me.worker_id}: its host-member copy's process did not answer "
                         f"(exit code {self._proc.exitcode})")

    def _watch_child(self) -> None:
        """Log at once when the child ends before ``close``: the agent's calls then time out or fail."""
        multiprocessing.connection.wait([self._proc.sentinel])
        if not self._stopping:
            log.error("worker %d: its host-member copy's process exited (code %s)", self.me.worker_id,
                      self._proc.exitcode)

    def close(self) -> None:
        if self._closed:
            return
        self._stopping = True  # the child's end is expected from here on
        try:
            self._last = dict(self._request("stop"))
        except HostCopyFailed as exc:
            self._last["error"] = str(exc)
        self._closed = True
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=5)
        self._conn.close()


_START_TIMEOUT = 60.0  # a spawned interpreter importing numpy and the model, on a loaded machine
_REQUEST_TIMEOUT = 30.0


def _answer(copy: _Copy, control: Connection) -> None:
    """One request from the agent, in the child: follow a grant, report, or stop (reporting a last time)."""
    try:
        kind, value = control.recv()
    except (EOFError, OSError):  # the agent is gone
        copy.stop()
        return
    if kind == "follow":
        copy.follow(value)
        control.send(("ok", None))
    elif kind == "report":
        control.send(("ok", copy.report()))
    elif kind == "stop":
        copy.stop()
        control.send(("ok", copy.report()))
    else:
        control.send(("error", f"unknown request {kind!r}"))


def _child_main(control: Connection, me: Worker, workers: tuple[Worker, ...],
                switch_addresses: dict[str, tuple[str, int]]) -> None:
    """The copy's child process: bind, say ready (or why not), serve until told to stop."""
    logging.basicConfig(level=logging.WARNING, format=f"host-copy-w{me.worker_id}: %(levelname)s %(message)s")
    try:
        copy = _Copy(me, workers, switch_addresses)
    except OSError as exc:
        control.send(("error", str(exc)))
        return
    control.send(("ready", None))
    try:
        copy.serve(control)
    except BaseException as exc:  # reported to the agent (its next request fails with this), then exit non-zero
        log.exception("worker %d: host-member copy failed", me.worker_id)
        try:
            control.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise SystemExit(1) from exc
    finally:
        copy.sock.close()
