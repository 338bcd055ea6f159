"""Ring all-reduce: exact sums, bit-identical floats, edge lengths, failures that raise instead of hanging."""
from __future__ import annotations

import os
import queue
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.ring import (
    MAX_PIECES,
    QueueRingLink,
    RingAllReduce,
    RingError,
    RingTimeoutError,
    chunk_bounds,
    local_queue_links,
    piece_bounds,
    ring_allreduce,
    ring_time_model,
    run_local_ring,
)
from host_agent.ring_pieces import PieceStream


def ring_order_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """The documented summation order: chunk c is ((x_c + x_{c+1}) + ...) over ranks mod n."""
    n = len(arrays)
    flat = [a.reshape(-1) for a in arrays]
    bounds = chunk_bounds(flat[0].size, n)
    out = np.empty_like(flat[0])
    for c in range(n):
        lo, hi = bounds[c], bounds[c + 1]
        acc = flat[c][lo:hi].copy()
        for k in range(1, n):
            acc = acc + flat[(c + k) % n][lo:hi]
        out[lo:hi] = acc
    return out.reshape(arrays[0].shape)


def exact_int32_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """Exact integer sum, wrapped to int32 as the ring's int32 additions wrap."""
    return np.sum(np.stack(arrays).astype(np.int64), axis=0).astype(np.int32)


def inputs(n: int, length: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng([seed, n, length])
    ints = [rng.integers(-(2**31), 2**31 - 1, size=length, dtype=np.int32) for _ in range(n)]
    floats = [(rng.standard_normal(length) * 10.0 ** rng.integers(-3, 4, size=length)).astype(np.float32) for _ in range(n)]
    return ints, floats


def open_fds() -> set[tuple[str, str]]:
    """This process's open descriptors as (number, what it refers to)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            pass
    return out


@pytest.fixture
def no_leaks():
    """No thread or file descriptor the test opened survives it (what earlier tests release meanwhile is theirs:
    counting all of them made the check fail whenever another test's channel closed during this one)."""
    threads, fds = set(threading.enumerate()), open_fds()
    yield
    assert [t for t in threading.enumerate() if t not in threads] == []
    assert open_fds() - fds == set()


LENGTHS = (0, 1, 2, 3, 7, 8, 9, 1000)


@pytest.mark.parametrize("n", range(2, 9))
def test_tcp_ring_sums_exactly_and_identically(n: int, no_leaks) -> None:
    cases = [inputs(n, length, seed=1) for length in LENGTHS]

    def work(ring: RingAllReduce) -> list[np.ndarray]:
        out = []
        for ints, floats in cases:
            out.append(ring.allreduce(ints[ring.rank]))
            out.append(ring.allreduce(floats[ring.rank]))
        return out

    results = run_local_ring(n, work, timeout=10)
    for i, (ints, floats) in enumerate(cases):
        want_int, want_float = exact_int32_sum(ints), ring_order_sum(floats)
        for rank in range(n):
            got_int, got_float = results[rank][2 * i], results[rank][2 * i + 1]
            assert got_int.dtype == np.int32 and got_float.dtype == np.float32
            np.testing.assert_array_equal(got_int, want_int)
            # bit-identical across workers and equal to the documented order
            assert got_float.tobytes() == results[0][2 * i + 1].tobytes()
            assert got_float.tobytes() == want_float.tobytes()
        np.testing.assert_allclose(want_float, np.sum(np.stack(floats).astype(np.float64), axis=0), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_tcp_ring_large_array(n: int, no_leaks) -> None:
    rng = np.random.default_rng(n)
    arrays = [rng.standard_normal(1_000_000).astype(np.float32) for _ in range(n)]
    results = run_local_ring(n, lambda ring: ring.allreduce(arrays[ring.rank]), timeout=20)
    want = ring_order_sum(arrays)
    for res in results:
        assert res.tobytes() == want.tobytes()


def test_shape_preserved_input_untouched_float64_int64() -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    b = np.arange(12, dtype=np.int64).reshape(3, 4)
    keep = a.copy()

    def work(ring: RingAllReduce):
        return ring.allreduce(a), ring.allreduce(b)

    for ra, rb in run_local_ring(3, work):
        assert ra.shape == (3, 4) and rb.dtype == np.int64
        np.testing.assert_array_equal(ra, 3 * keep)
        np.testing.assert_array_equal(rb, 3 * b)
    np.testing.assert_array_equal(a, keep)


def test_allgather_is_exact() -> None:
    speeds = [1 / 3, 2.5e-7, 12345.678, 0.1]
    results = run_local_ring(4, lambda ring: ring.allgather(np.array([speeds[ring.rank]])))
    for res in results:
        assert res[:, 0].tolist() == speeds


def test_single_member_ring_needs_no_peers() -> None:
    with RingAllReduce(0, [("127.0.0.1", 0)]) as ring:
        x = np.arange(5, dtype=np.int32)
        np.testing.assert_array_equal(ring.allreduce(x), x)


def test_unsupported_dtype_is_refused_without_breaking_the_ring() -> None:
    def work(ring: RingAllReduce):
        with pytest.raises(TypeError, match="supports"):
            ring.allreduce(np.zeros(3, dtype=np.float16))
        return ring.allreduce(np.ones(3, dtype=np.int32))

    for res in run_local_ring(2, work):
        np.testing.assert_array_equal(res, [2, 2, 2])


def _assert_rings_match_reference(rings: list, ints: list, floats: list) -> None:
    """Every member's all-reduce of ``ints`` and ``floats`` (one thread each): the exact int32 sum, and the floats
    bit for bit in the ring's order of addition."""
    n = len(rings)
    results: list = [None] * n

    def member(rank: int) -> None:
        results[rank] = (rings[rank].allreduce(ints[rank]), rings[rank].allreduce(floats[rank]))

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got_int, got_float in results:
        np.testing.assert_array_equal(got_int, exact_int32_sum(ints))
        assert got_float.tobytes() == ring_order_sum(floats).tobytes()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), length=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_queue_transport_matches_reference(n: int, length: int, seed: int) -> None:
    ints, floats = inputs(n, length, seed)
    rings = [RingAllReduce.over(link) for link in local_queue_links(n, timeout=5)]
    _assert_rings_match_reference(rings, ints, floats)


def test_dead_peer_raises_naming_it(no_leaks) -> None:
    timeout = 2.0

    def work(ring: RingAllReduce):
        if ring.rank == 2:
            ring.close()  # dies before the first all-reduce
            return "dead"
        start = time.monotonic()
        with pytest.raises(RingError) as info:
            ring.allreduce(np.ones(100_000, dtype=np.float32))
        return info.value, time.monotonic() - start

    results = run_local_ring(4, work, timeout=timeout)
    assert results[2] == "dead"
    for rank in (0, 1, 3):
        _err, elapsed = results[rank]
        assert elapsed < timeout + 1.0
    err3 = results[3][0]  # its left neighbour is the dead one
    assert err3.peer_rank == 2 and "rank 2" in str(err3) and "closed" in str(err3)


def test_silent_peer_times_out_naming_it(no_leaks) -> None:
    timeout = 0.5
    survivors_done = threading.Barrier(3)  # ranks 0, 1 and the silent rank 2

    def work(ring: RingAllReduce):
        if ring.rank == 2:  # alive but never joins the all-reduce
            survivors_done.wait(timeout=30)
            return None
        start = time.monotonic()
        try:
            with pytest.raises(RingError) as info:
                ring.allreduce(np.ones(10, dtype=np.int32))
        finally:
            survivors_done.wait(timeout=30)
        return info.value, time.monotonic() - start

    results = run_local_ring(3, work, timeout=timeout)
    err0, elapsed0 = results[0]  # rank 0 waits on data from rank 2
    assert isinstance(err0, RingTimeoutError) and isinstance(err0, TimeoutError)
    assert err0.peer_rank == 2 and "rank 2" in str(err0)
    assert timeout <= elapsed0 < timeout + 1.0
    assert isinstance(results[1][0], RingError)
    assert results[1][1] < 2 * timeout + 1.0


def test_broken_ring_refuses_further_calls() -> None:
    def work(ring: RingAllReduce):
        if ring.rank == 1:
            ring.close()
            return None
        with pytest.raises(RingError):
            ring.allreduce(np.ones(4, dtype=np.int32))
        with pytest.raises(RingError, match="broken"):
            ring.allreduce(np.ones(4, dtype=np.int32))
        return "ok"

    assert run_local_ring(2, work, timeout=2)[0] == "ok"


def test_mismatched_lengths_raise_instead_of_mixing(no_leaks) -> None:
    def work(ring: RingAllReduce):
        with pytest.raises(RingError):
            ring.allreduce(np.ones(10 + ring.rank, dtype=np.int32))
        return True

    assert run_local_ring(3, work, timeout=2) == [True, True, True]


def test_late_peer_is_retried_until_it_listens(no_leaks) -> None:
    listeners = [socket.socket() for _ in range(2)]
    for s in listeners:
        s.bind(("127.0.0.1", 0))
        s.listen()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    late_addr = probe.getsockname()
    probe.close()  # nobody listens there until rank 2 starts: rank 1's connects are refused
    peers = [s.getsockname() for s in listeners] + [late_addr]
    results: list = [None] * 3

    def member(rank: int) -> None:
        try:
            listen = listeners[rank] if rank < 2 else None
            with RingAllReduce(rank, peers, listen, timeout=5, connect_timeout=10) as ring:
                results[rank] = ring.allreduce(np.full(5, rank + 1, dtype=np.int32))
        except BaseException as exc:  # noqa: BLE001
            results[rank] = exc

    threads = [threading.Thread(target=member, args=(r,)) for r in range(3)]
    threads[0].start()
    threads[1].start()
    time.sleep(0.3)  # the scenario itself (a peer that starts late), not a synchronisation
    threads[2].start()
    for t in threads:
        t.join()
    for res in results:
        np.testing.assert_array_equal(res, np.full(5, 6, dtype=np.int32))


def test_absent_peer_fails_at_the_connect_deadline(no_leaks) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    absent = probe.getsockname()
    probe.close()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    start = time.monotonic()
    with pytest.raises(RingTimeoutError) as info:
        RingAllReduce(0, [listener.getsockname(), absent], listener, connect_timeout=0.5)
    assert time.monotonic() - start < 2.0
    assert info.value.peer_rank == 1 and f"{absent[1]}" in str(info.value)
    assert listener.fileno() == -1  # ownership passed to the ring, which closed it


def test_stray_connection_is_rejected_and_ring_still_forms(no_leaks) -> None:
    listeners = [socket.socket() for _ in range(2)]
    for s in listeners:
        s.bind(("127.0.0.1", 0))
        s.listen()
    peers = [s.getsockname() for s in listeners]
    stray = socket.create_connection(peers[0])
    stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
    results: list = [None] * 2

    def member(rank: int) -> None:
        with RingAllReduce(rank, peers, listeners[rank], timeout=5, connect_timeout=5) as ring:
            results[rank] = ring.allreduce(np.ones(3, dtype=np.int32))

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stray.close()
    for res in results:
        np.testing.assert_array_equal(res, [2, 2, 2])


def test_bad_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 3"):
        RingAllReduce(3, [("127.0.0.1", 1), ("127.0.0.1", 2)])


def test_chunk_bounds() -> None:
    assert chunk_bounds(10, 3) == (0, 4, 7, 10)
    assert chunk_bounds(2, 4) == (0, 1, 2, 2, 2)
    assert chunk_bounds(0, 3) == (0, 0, 0, 0)


def test_ring_time_model() -> None:
    assert ring_time_model(1, 1e6, 1e9, 1e-3) == 0.0
    # n=4, 1 MB at 1 MB/s, 1 ms latency: 2*3/4 * 1 s + 6 ms
    assert ring_time_model(4, 1e6, 1e6, 1e-3) == pytest.approx(1.5 + 0.006)
    with pytest.raises(ValueError):
        ring_time_model(2, 1.0, 0.0, 0.0)


# --------------------------------------------------------------------------- pipelined steps (pieces)


def test_piece_bounds_cut_chunks_into_pieces_of_about_piece_bytes() -> None:
    assert piece_bounds(0, 4) == (0, 0)
    assert piece_bounds(1000, 4) == (0, 1000)  # under PIECE_BYTES: one piece
    assert piece_bounds(8192, 4) == chunk_bounds(8192, 8)
    assert len(piece_bounds(10**7, 4)) == MAX_PIECES + 1
    assert piece_bounds(7, 4, piece_bytes=4) == tuple(range(8))


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("piece_bytes", [4, 12])
def test_tcp_ring_with_small_pieces_is_exact_for_odd_sizes(n: int, piece_bytes: int, no_leaks) -> None:
    """Pieces of one to three elements: the pipelining's bookkeeping on every chunk and step boundary."""
    cases = [inputs(n, length, seed=2) for length in (0, 1, n - 1, n + 1, 97, 1001)]

    def work(ring: RingAllReduce) -> list[np.ndarray]:
        return [x for ints, floats in cases for x in (ring.allreduce(ints[ring.rank]), ring.allreduce(floats[ring.rank]))]

    results = run_local_ring(n, work, timeout=10, piece_bytes=piece_bytes)
    for i, (ints, floats) in enumerate(cases):
        for rank in range(n):
            np.testing.assert_array_equal(results[rank][2 * i], exact_int32_sum(ints))
            assert results[rank][2 * i + 1].tobytes() == ring_order_sum(floats).tobytes()


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 8), length=st.integers(0, 60), piece_bytes=st.sampled_from([4, 8, 20, 4096]),
       seed=st.integers(0, 2**16))
def test_queue_transport_with_pieces_matches_reference(n: int, length: int, piece_bytes: int, seed: int) -> None:
    ints, floats = inputs(n, length, seed)
    rings = [RingAllReduce.over(link) for link in local_queue_links(n, timeout=5, piece_bytes=piece_bytes)]
    _assert_rings_match_reference(rings, ints, floats)


def test_members_may_cut_pieces_differently() -> None:
    """Pieces are local: the wire carries each step's header and chunk bytes whatever the pieces."""
    n, length = 4, 1003
    ints, _ = inputs(n, length, seed=3)
    links = [QueueRingLink(r, inboxes, 5, piece_bytes=4 * (r + 1) ** 3)
             for inboxes in [[queue.Queue() for _ in range(n)]] for r in range(n)]
    results: list = [None] * n

    def member(rank: int) -> None:
        results[rank] = RingAllReduce.over(links[rank]).allreduce(ints[rank])

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        np.testing.assert_array_equal(got, exact_int32_sum(ints))


def test_piece_j_of_a_step_waits_for_piece_j_of_the_step_before() -> None:
    """A member sends the next step's piece as soon as the matching piece arrived, not the whole step."""
    recorded: list[tuple[str, int]] = []

    class Recorder:
        rank, size = 0, 2

        def run(self, steps):
            stream = PieceStream(steps, piece_bytes=4)
            # step 0's header and 3 pieces, and step 1's header, are ready at once; step 1's pieces wait
            assert [b.nbytes for b in stream.pending] == [28, 4, 4, 4, 28]
            stream.sent(40 + 28)
            stream.received(28)  # step 0's header
            stream.receive_buffer[:4] = np.int32(5).tobytes()
            stream.received(4)  # step 0, piece 0 arrives (and is added): step 1's piece 0 may leave
            assert [bytes(b) for b in stream.pending] == [np.int32(5 + 3).tobytes()]
            recorded.append(("after one piece", sum(b.nbytes for b in stream.pending)))
            raise RingError("stop here")

        def close(self):
            pass

    with pytest.raises(RingError, match="stop here"):
        ring_allreduce(np.arange(6, dtype=np.int32), Recorder())
    assert recorded == [("after one piece", 4)]
