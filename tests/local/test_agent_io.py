"""The agent's UDP I/O (host_agent.udp_io: per packet, and batched for a host member's copy) and batched result
handling (host_agent.ina_window.ResultBatch).

Exact datagrams out of GSO sends (and of the per-packet fallback), GRO reads split back into datagrams, the
fallback when the kernel refuses a segmented send, results applied in batches exactly as one at a time, and
whole windows through an echo that answers in GSO runs (coalesced reads on the agent's side).
"""
from __future__ import annotations

import errno
import logging
import select
import socket
import threading

import numpy as np
import pytest

from host_agent.acceptor import Acceptor
from host_agent.agent import bind_worker_sockets
from host_agent.congestion import CongestionWindow
from host_agent.flight import Flight
from host_agent.grant import Grant, SwitchGrant, Worker
from host_agent.ina_window import TX_MOD, ResultBatch, gradient_packets
from host_agent.options import StreamOptions
from host_agent.ring import HELLO_MAGIC as RING_HELLO
from host_agent.rtt import RttEstimator
from host_agent.stats import StreamStats
from host_agent.stream import ChunkStream
from host_agent.udp_io import GSO_MAX_SEGMENTS, DatagramIo, gso_supported
from inaproto import wire

P = wire.INA_PAYLOAD_LEN


def _probe() -> tuple[bool, bool]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        io = DatagramIo(s, batched=True)
        return io.gso, io.gro
    finally:
        s.close()


HAS_GSO, HAS_GRO = _probe()
needs_gso = pytest.mark.skipif(not HAS_GSO, reason="the kernel has no UDP_SEGMENT (GSO): only the fallback is tested")
needs_gro = pytest.mark.skipif(not (HAS_GSO and HAS_GRO), reason="the kernel lacks UDP_SEGMENT or UDP_GRO")


def _sink() -> socket.socket:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    r.bind(("127.0.0.1", 0))
    return r


def _read_all(sock: socket.socket, count: int) -> list[bytes]:
    out = []
    while len(out) < count:
        assert select.select([sock], [], [], 5)[0], f"only {len(out)} of {count} datagrams arrived"
        out.append(sock.recv(65536))
    return out


def _packets(count: int) -> bytes:
    contrib = np.arange(count * wire.LANES, dtype=np.int32).reshape(count, wire.LANES)
    return bytes(gradient_packets(contrib, 5, 0, 16, 3, 1, 2))


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("count", [1, 63, 64, 65, 200])
def test_send_run_delivers_exactly_the_packets_in_order(batched: bool, count: int) -> None:
    if batched and not HAS_GSO:
        pytest.skip("no UDP_SEGMENT here")
    rx, tx = _sink(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        io = DatagramIo(tx, batched=batched)
        buf = _packets(count)
        calls = io.send_run(memoryview(buf), P, count, rx.getsockname())
        got = _read_all(rx, count)
        assert got == [buf[j * P : (j + 1) * P] for j in range(count)]
        # GSO: one system call per 64 packets (UDP_MAX_SEGMENTS); per packet: one each
        assert calls == (-(-count // GSO_MAX_SEGMENTS) if batched else count)
    finally:
        rx.close()
        tx.close()


def test_per_packet_io_uses_neither_gso_nor_gro() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        io = DatagramIo(s, batched=False)
        assert not io.gso and not io.gro and io.read_room == 2048
    finally:
        s.close()


class _RefusingSocket:
    """A socket whose segmented sends fail as on a kernel without GSO for the route (EIO)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def sendmsg(self, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


@needs_gso
def test_refused_gso_send_falls_back_to_per_packet_once_and_logs(caplog) -> None:
    rx, tx = _sink(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        io = DatagramIo(_RefusingSocket(tx), batched=True, name="w0")
        assert io.gso
        buf = _packets(100)
        with caplog.at_level(logging.WARNING, logger="host_agent.udp_io"):
            io.send_run(memoryview(buf), P, 100, rx.getsockname())
            io.send_run(memoryview(buf), P, 100, rx.getsockname())
        assert not io.gso
        assert len([r for r in caplog.records if "per packet from now on" in r.getMessage()]) == 1
        assert _read_all(rx, 200) == [buf[j * P : (j + 1) * P] for j in range(100)] * 2
    finally:
        rx.close()
        tx.close()


class _FullSocket:
    """A socket whose buffer is full from its ``full_from``-th send call on (EAGAIN, or ENOBUFS)."""

    def __init__(self, sock: socket.socket, full_from: int, error: OSError) -> None:
        self._sock, self.full_from, self.error, self.calls = sock, full_from, error, 0

    def _call(self) -> None:
        self.calls += 1
        if self.calls >= self.full_from:
            raise self.error

    def sendmsg(self, *args, **kwargs):
        self._call()
        return self._sock.sendmsg(*args, **kwargs)

    def sendto(self, *args, **kwargs):
        self._call()
        return self._sock.sendto(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("error", [BlockingIOError(errno.EAGAIN, "full"), OSError(errno.ENOBUFS, "no buffer space")])
def test_a_send_the_socket_refuses_is_dropped_and_in_order_says_how_many_did_not_go(batched: bool, error) -> None:
    """A full buffer drops datagrams (the caller's recovery resends them); ``in_order`` stops at the first refused one
    and counts it and the rest in ``unsent``, so a caller that numbers its datagrams can give those numbers back."""
    if batched and not HAS_GSO:
        pytest.skip("no UDP_SEGMENT here")
    rx, tx = _sink(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        buf = _packets(150)
        full_from = 2 if batched else 65  # the second GSO call, or the 65th datagram
        io = DatagramIo(_FullSocket(tx, full_from, error), batched=batched)
        io.send_run(memoryview(buf), P, 150, rx.getsockname(), in_order=True)
        assert io.unsent == 150 - 64 and io.gso == batched
        assert _read_all(rx, 64) == [buf[j * P : (j + 1) * P] for j in range(64)]
        io.sock.full_from = 10**9
        io.send_run(memoryview(buf), P, 150, rx.getsockname(), in_order=True)
        assert io.unsent == 0 and len(_read_all(rx, 150)) == 150
        io.sock.full_from, io.sock.calls = 1, 0
        io.send_run(memoryview(buf), P, 150, rx.getsockname())  # without in_order: every call tried, all dropped
        assert io.unsent == 0 and io.sock.calls == (3 if batched else 150)
        assert not select.select([rx], [], [], 0.0)[0]
    finally:
        rx.close()
        tx.close()


@needs_gro
def test_gro_drain_splits_coalesced_reads_into_datagrams() -> None:
    """A GSO send on loopback reaches a GRO socket as one read; the drain hands over every datagram,
    and a shorter last segment as a run of its own."""
    rx, tx = _sink(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        io = DatagramIo(rx, batched=True)
        rx.setblocking(False)
        body = _packets(10) + b"\x07" * 100  # 10 datagrams of 180 bytes, then one of 100
        tx.sendmsg([body], [(17, 103, (P).to_bytes(2, "little"))], 0, rx.getsockname())
        select.select([rx], [], [], 5)
        buf = bytearray(1 << 18)
        runs = []

        def on_run(off: int, size: int, count: int) -> int:
            runs.append((size, count))
            return size * count

        kept = io.drain(memoryview(buf), on_run)
        assert kept == len(body) and bytes(buf[:kept]) == body
        assert runs == [(P, 10), (100, 1)]
    finally:
        rx.close()
        tx.close()


class _SenderStub:
    """What ResultBatch uses of an InaSender: stats, the drain buffer, the loss signals' counter log."""

    def __init__(self) -> None:
        self.stats = StreamStats()
        self.rbatch = bytearray(1 << 16)
        self.txlog = np.full(TX_MOD, -1, dtype=np.int64)
        self.signals_seen = False


def _result(seq: int, job: int = 3, gen: int = 1, flags: int = 0, value: int = 0) -> bytes:
    h = wire.InaHeader(int(wire.MsgType.RESULT), flags, job, gen, seq % 16, seq & 0xFFFFFFFF, 0, 0)
    return wire.encode_payload(h, np.full(wire.LANES, value, dtype=np.int32))


def _batch_state(vector: bool, results: list[bytes]) -> tuple:
    from host_agent.chunks import Segment

    stub = _SenderStub()
    K, i0, a = 40, 2, (1 << 32) - 10  # seq numbers wrap inside the segment
    seg = Segment(a, np.zeros((K, wire.LANES), dtype=np.int32))
    got = bytearray(K)
    got[:i0] = b"\x01" * i0
    est = RttEstimator(0.05, 0.01, 1.0)
    est.sample(0.004)  # path round trip 4 ms
    flight = Flight(K, i0, est, CongestionWindow(), 16, stub.stats)
    rb = ResultBatch(stub, seg, got, i0, 3, 1, flight)
    rb.sent = 30
    flight.sent(i0, 30, 0.0)
    flight.resent(7, 0.999, early=True)  # resent 1 ms before the results: any result of 7 answers the original
    rb.now = 1.0
    rb.VECTOR_FROM = 0 if vector else 10**9
    data = b"".join(results)
    rb.buf[: len(data)] = data
    rb._apply(len(results))
    st = stub.stats
    return (bytes(got), bytes(seg.res32), bytes(seg.flag), bytes(seg.src), rb.remaining, rb.progressed,
            st.stale, st.ignored, st.spurious_resends, flight.rack_i, flight.rack_xmit, _window_state(flight))


def _window_state(flight: Flight) -> tuple:
    """Everything a batch of results changes in the window's bookkeeping (estimator, congestion window, RACK)."""
    est, cw = flight.rtt, flight.cwnd
    return (flight.last_new, flight.tail_probed, flight.probe_answered, flight.reorder_mult,
            flight.rack_dirty, tuple(flight._xmit), tuple(flight._idx), tuple(flight._rtt),
            est.srtt, est.rttvar, est.min_rtt, est.samples, est.backoff, est.rto, tuple(est._recent),
            tuple(sorted((k, repr(v)) for k, v in vars(cw).items())), bytes(flight.counted), flight.stats.spurious_resends,
            tuple(tuple(d) for d in flight.class_rtts or ()))


def test_short_batches_update_the_window_exactly_as_numpy_does() -> None:
    """``Flight.delivered_few`` (the short-batch loop) leaves every bit of state as ``delivered_many`` does: resent
    chunks answered early (spurious) and late, path classes with ties in send times, 1..40 results."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        K = 48
        classes = (np.arange(K) % 3) if trial % 2 else None
        flights = []
        for _ in range(2):
            est = RttEstimator(0.05, 0.01, 1.0)
            est.sample(0.004)
            f = Flight(K, 0, est, CongestionWindow(), 16, StreamStats(), 1, classes, [] if classes is not None else None)
            for lo in range(0, K, 8):  # runs of 8 sent at one instant
                f.sent(lo, lo + 8, 0.001 * lo)
            flights.append(f)
        resent = rng.choice(K, size=int(rng.integers(0, 6)), replace=False)
        now = 0.06 + float(rng.random()) * 0.01
        for f in flights:
            for i in resent:
                f.resent(int(i), now - float(rng.random()) * 0.01 if i % 2 else 0.01, early=bool(i % 3))
        rng2 = np.random.default_rng(trial)
        resent_times = {int(i): now - float(rng2.random()) * 0.01 for i in resent}
        for f in flights:
            for i, t in resent_times.items():
                f.sent_at[i] = t
        sel = rng.choice(K, size=int(rng.integers(1, 41)), replace=False)
        if trial % 4 == 0 and resent.size:  # only resent chunks: the probe's answer
            sel = resent
        flights[0].delivered_few([int(i) for i in sel], now)
        flights[1].delivered_many(sel.astype(np.int64), now)
        assert _window_state(flights[0]) == _window_state(flights[1]), trial


def test_results_applied_in_batches_exactly_as_one_at_a_time() -> None:
    a = (1 << 32) - 10
    rng = np.random.default_rng(1)
    results = []
    for i in rng.permutation(45):  # 40 chunks and a few beyond; sent are [2, 30)
        results.append(_result(a + int(i), flags=int(wire.Flags.OVERFLOW) if i % 5 == 0 else 0, value=int(i) + 1))
        if i % 7 == 0:
            results.append(_result(a + int(i), value=-1))  # a duplicate: the first copy wins
    results += [_result(a + 3, gen=2), _result(a + 4, job=9), _result(a + 1), _result(a + 35)]
    one, many = _batch_state(False, results), _batch_state(True, results)
    assert one == many
    got = one[0]
    assert got[:30] == b"\x01" * 30 and got[30:] == bytes(10)
    assert one[6] == 2  # stale: another generation, another job
    assert one[8] == 1  # chunk 7's resend was spurious
    assert np.frombuffer(one[1], dtype=wire.LANES_DTYPE).reshape(40, wire.LANES)[29, 0] == 30


class _GsoEcho:
    """A one-worker switch on loopback that answers every GRADIENT with its RESULT, in GSO runs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()
        self.io = DatagramIo(self.sock, batched=True, name="echo")
        self.peer: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = bytearray(1 << 18)
        view = memoryview(buf)
        while not self._stop.is_set():
            if not select.select([self.sock], [], [], 0.05)[0]:
                continue
            n = self.io.drain(view, lambda off, size, count: size * count if size == P else 0)
            if n:
                buf[0:n:P] = bytes([int(wire.MsgType.RESULT)]) * (n // P)
                self.io.send_run(view[:n], P, n // P, self.peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_window_through_an_echo_answering_in_gso_runs() -> None:
    """The stream reads one datagram per call; a switch's answers in GSO runs arrive as separate datagrams."""
    if not HAS_GSO:
        pytest.skip("no UDP_SEGMENT here: the echo cannot answer in runs")
    echo = _GsoEcho()
    udp, tcp = bind_worker_sockets("127.0.0.1")
    echo.peer = udp.getsockname()
    try:
        me = Worker(0, "127.0.0.1", udp.getsockname()[1])
        grant = Grant(1, 0, "ina", (SwitchGrant("echo", echo.address[0], num_slots=128, worker_ids=(0,)),),
                      ina_port=echo.address[1])
        acceptor = Acceptor(tcp, (RING_HELLO,))
        stream = ChunkStream(worker_id=0, workers=(me,), sock=udp, ring_inbox=acceptor.inbox(RING_HELLO), grant=grant,
                             backend="ina", options=StreamOptions(op_timeout=20.0))
        chunks = np.random.default_rng(0).integers(-1000, 1000, size=(3000, wire.LANES), dtype=np.int32)
        assert np.array_equal(stream.reduce(chunks), chunks)
        assert stream.stats.results == 3000 and stream.stats.stale == 0
        stream.close()
        acceptor.close()
    finally:
        udp.close()
        echo.close()


def test_gso_supported_reports_the_kernel_option() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert gso_supported(s) == HAS_GSO
    finally:
        s.close()
