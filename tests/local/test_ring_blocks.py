"""The ring phase in row blocks: successive ring ops in one pipelined stream, each block's results in as it completes,
exact sums with moves off the ring at block boundaries and mid-block, and the resync point at most two blocks back."""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.agent import AgentOptions
from host_agent.chunks import CHUNK_BYTES, Segment
from host_agent.ring import RingAllReduce, RingError, local_queue_links, ring_allreduce_blocks, run_local_ring
from host_agent.ring_pieces import PieceStream
from host_agent.stream import StreamOptions
from inaproto.backends import Backend
from inaproto.wire import LANES
from tests.local.test_ring import exact_int32_sum, inputs, ring_order_sum
from topologies.loopback import LoopbackCluster, exact_sum

BLOCK_ROWS = 8
BLOCKED = AgentOptions(stream=StreamOptions(op_timeout=20.0, ring_block_bytes=BLOCK_ROWS * CHUNK_BYTES))


def _members(n: int, fn) -> list:
    out: list = [None] * n

    def member(rank: int) -> None:
        out[rank] = fn(rank)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), lengths=st.lists(st.integers(0, 30), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_blocks_give_each_block_its_own_op_result(n: int, lengths: list[int], seed: int) -> None:
    """Each block is summed exactly as ``ring_allreduce`` of it alone would (ints exact, floats bit for bit in the
    ring's order), and ``done`` reports every block once, in order, with its result."""
    blocks = [inputs(n, k, seed + i) for i, k in enumerate(lengths)]
    rings = [RingAllReduce.over(link) for link in local_queue_links(n, timeout=5)]

    def run(rank: int):
        seen: list = []
        ints = rings[rank].allreduce_blocks([b[0][rank] for b in blocks], lambda i, r: seen.append((i, r.copy())))
        floats = rings[rank].allreduce_blocks([b[1][rank] for b in blocks])
        return ints, floats, seen

    for ints, floats, seen in _members(n, run):
        assert [i for i, _ in seen] == list(range(len(blocks)))
        for (i, got), res, want_f, b in zip(seen, ints, floats, blocks):
            np.testing.assert_array_equal(res, exact_int32_sum(b[0]))
            np.testing.assert_array_equal(got, res)
            assert want_f.tobytes() == ring_order_sum(b[1]).tobytes()


@pytest.mark.parametrize("piece_bytes", [8, 4096])
def test_blocks_over_tcp(piece_bytes: int) -> None:
    n = 3
    blocks = [inputs(n, k, 7)[0] for k in (5, 0, 64, 33)]

    def work(ring: RingAllReduce):
        seen: list = []
        out = ring.allreduce_blocks([b[ring.rank] for b in blocks], lambda i, r: seen.append(i))
        return out, seen, ring.allreduce(np.ones(2, dtype=np.int32))  # the op numbering continues after the blocks

    for out, seen, after in run_local_ring(n, work, piece_bytes=piece_bytes):
        assert seen == [0, 1, 2, 3]
        for got, b in zip(out, blocks):
            np.testing.assert_array_equal(got, exact_int32_sum(b))
        np.testing.assert_array_equal(after, [n, n])


def test_the_next_block_leaves_before_the_last_step_of_the_one_before_arrived() -> None:
    """Blocks pipeline into each other: once a block's last sends are released, the next block's first step
    follows at once, without waiting for the block's last step to arrive; its ``done`` comes when it has."""
    reported: list[int] = []

    class Recorder:
        rank, size = 0, 2

        def run(self, steps):
            stream = PieceStream(steps, piece_bytes=4)
            # block 0: step 0's header and its 3 pieces at once; step 1's header; step 1's pieces wait for step 0's
            assert [b.nbytes for b in stream.pending] == [28, 4, 4, 4, 28]
            stream.sent(40 + 28)
            stream.received(28)
            for j in range(3):  # block 0's step 0 arrives: its step 1, then all of block 1's step 0 are released
                stream.receive_buffer[:4] = np.int32(j).tobytes()
                stream.received(4)
            assert [b.nbytes for b in stream.pending] == [4, 4, 4, 28, 4, 4, 28]
            assert reported == []
            stream.received(28)  # block 0's step 1 (the all-gather) arrives: block 0 is done
            for j in range(3):
                stream.receive_buffer[:4] = np.int32(j).tobytes()
                stream.received(4)
            assert reported == [0]
            raise RingError("stop here")

        def close(self):
            pass

    with pytest.raises(RingError, match="stop here"):
        ring_allreduce_blocks([np.arange(6, dtype=np.int32), np.arange(4, dtype=np.int32)], Recorder(),
                              done=lambda i, r: reported.append(i))


def test_segment_takes_ring_results_by_range() -> None:
    seg = Segment(100, np.zeros((10, LANES), dtype=np.int32))
    seg.put_ring(0, np.full((4, LANES), 1, dtype=np.int32), None)
    assert seg.first_missing() == 4
    seg.put_ring(4, np.full((6, LANES), 2, dtype=np.int32), np.array([0, 1, 0, 0, 0, 0]))
    assert seg.first_missing() == -1 and list(seg.flag) == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    out = seg.values()
    assert out.dtype == np.int32 and out[:4].tolist() == [[1] * LANES] * 4 and (out[4:] == 2).all()
    seg.put_ring(2, np.full((2, LANES), 2**40, dtype=np.int64), None)  # a block redone in int64 widens the results
    assert seg.values().dtype == np.int64 and seg.values()[2, 0] == 2**40 and seg.values()[1, 0] == 1


def _inputs(n: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * 3).astype(np.float32) for _ in range(n)]


def test_ring_phase_runs_in_blocks_exactly() -> None:
    n, size = 4, 3000  # 94 chunks: 12 blocks of 8 (the last of 6)
    data = _inputs(n, size, 1)
    with LoopbackCluster(["s1"] * n, backend="ring", options=BLOCKED) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(data[agent.rank]) for _ in range(2)], agent.stats), controller=False)
    want = exact_sum(data)
    for outs, stats in out:
        assert all(o.tobytes() == want.tobytes() for o in outs)
        assert stats.ring_ops == 2 * 12 and stats.ring_redo_int64 == 0


def test_overflow_redoes_only_its_block_in_int64() -> None:
    n = 4
    data = [np.concatenate([np.full(BLOCK_ROWS * LANES, 30000.0 + i, dtype=np.float32),
                            np.linspace(-1, 1, 2000, dtype=np.float32)]) for i in range(n)]
    with LoopbackCluster(["s1"] * n, backend="ring", options=BLOCKED) as cl:
        out = cl.run(lambda agent: (agent.allreduce(data[agent.rank]), agent.stats), controller=False)
    want = exact_sum(data)
    blocks = math.ceil(math.ceil(data[0].size / LANES) / BLOCK_ROWS)
    for got, stats in out:
        assert got.tobytes() == want.tobytes()
        assert stats.ring_redo_int64 == 1 and stats.ring_ops == blocks + 1


def _to_ring(cl: LoopbackCluster) -> int:
    """A higher-priority job takes the whole pool: the job's slots are revoked (the ring); its new generation."""
    cl.admit("b", "s1", 16, priority=1)
    return cl.job(cl.spec.name).grant.generation


def _back_to_ina(cl: LoopbackCluster) -> int:
    """That job leaves: the job gets its slots back (INA); its new generation."""
    cl.release(cl.job("b").job_id)
    return cl.job(cl.spec.name).grant.generation


@pytest.mark.parametrize("where", ["boundary", "mid-block"])
def test_moves_off_the_ring_lose_at_most_the_block_in_flight(where: str) -> None:
    """Slots revoked (the ring takes over mid-call) and restored while the ring phase is in its blocks, once right
    after worker 0 completed a block, once part-way into the next: every sum exact, every worker resuming at the
    same chunk, and no worker more than two blocks ahead of the resume point (one block in flight, and the last
    step of the one before still on its way to a neighbour)."""
    n, size, calls = 4, 3000, 10
    data = _inputs(n, size, 2)
    rng = np.random.default_rng(3)
    opts = AgentOptions(stream=StreamOptions(op_timeout=20.0, ring_block_bytes=BLOCK_ROWS * CHUNK_BYTES, link_bps=2e6))
    block_s = BLOCK_ROWS * CHUNK_BYTES * 2 * (n - 1) / n * 8 / 2e6
    first: dict = {}
    done = threading.Event()
    moves: list[int] = []

    def work(agent):
        if agent.rank == 0:
            first["agent"] = agent
        outs = [agent.allreduce(data[agent.rank]) for _ in range(calls)]
        if agent.rank == 0:
            done.set()
        return outs, agent.stats

    def wait_for(cond) -> bool:
        while not cond():
            if done.wait(0.0005):
                return False
        return True

    with LoopbackCluster(["s1"] * n, slots=16, pool=16, policy="priority", options=opts) as cl:
        def controller():
            for _ in range(3):
                if not wait_for(lambda: "agent" in first and first["agent"].stats.chunks > 0):
                    return
                agent = first["agent"]
                moves.append(_to_ring(cl))
                if not wait_for(lambda agent=agent: agent.plan.kind == Backend.RING and agent.stats.ring_ops >= 2):
                    return
                ops = agent.stats.ring_ops
                if not wait_for(lambda agent=agent, ops=ops: agent.stats.ring_ops > ops):  # worker 0 just completed a block
                    return
                if where == "mid-block" and done.wait(float(rng.uniform(0.2, 0.8)) * block_s):
                    return
                moves.append(_back_to_ina(cl))
                if not wait_for(lambda agent=agent: agent.plan.kind == Backend.INA):
                    return

        t = threading.Thread(target=controller)
        t.start()
        try:
            out = cl.run(work, timeout=120)
        finally:
            done.set()
            t.join(10)
    want = exact_sum(data)
    for outs, _ in out:
        assert all(o.tobytes() == want.tobytes() for o in outs)
    assert len(moves) >= 2, "no move off the ring happened before the run ended"
    histories = {tuple(st.generation_history) for _, st in out}
    assert len(histories) == 1, f"every worker resumed at the same chunk in every generation: {histories}"
    kinds = [k for _, k, _ in histories.pop()]
    for _, stats in out:
        for j, pause in enumerate(stats.pauses):
            if j + 2 <= len(kinds) and kinds[j] == Backend.RING:
                assert pause[3] <= 2 * BLOCK_ROWS, f"{pause[3]} chunks replayed after a move off the ring"


def test_block_size_follows_the_seconds_of_wire_time_and_the_agreed_rate() -> None:
    """With an emulated link a block is ``ring_block_seconds`` at its rate; without one, the first phase uses
    ``FIRST_BLOCK_PIECES`` pieces per member and the members then agree on one measured rate (the same number on every member)."""
    n, size = 4, 3000  # 94 chunks
    data = _inputs(n, size, 4)
    paced = AgentOptions(stream=StreamOptions(op_timeout=20.0, link_bps=2e6, ring_block_seconds=0.05))
    with LoopbackCluster(["s1"] * n, backend="ring", options=paced) as cl:  # 0.05 s at 2 Mbit/s: 62 chunks
        out = cl.run(lambda agent: (agent.allreduce(data[agent.rank]), agent.stats.ring_ops), controller=False)
    assert {ops for _, ops in out} == {2}
    plain = AgentOptions(stream=StreamOptions(op_timeout=20.0, ring_block_seconds=1.0))
    with LoopbackCluster(["s1"] * n, backend="ring", options=plain) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(data[agent.rank]) for _ in range(3)], agent.stream._ring_rate),
                     controller=False)
    want = exact_sum(data)
    assert all(o.tobytes() == want.tobytes() for outs, _ in out for o in outs)
    rates = {rate for _, rate in out}
    assert len(rates) == 1 and rates.pop() > 0


def test_agent_options_ring_blocks(monkeypatch) -> None:
    """``--ring-block-seconds`` / ``--ring-block-bytes`` (defaults from $INA_RING_BLOCK_SECONDS / _BYTES)."""
    from host_agent.cli import RING_BLOCK_BYTES_ENV, RING_BLOCK_SECONDS_ENV, build_parser
    from inaproto.cli import UsageError

    base = ["allreduce", "--workers", "127.0.0.1:5000,127.0.0.1:5001", "--worker-id", "0"]
    monkeypatch.delenv(RING_BLOCK_SECONDS_ENV, raising=False)
    monkeypatch.delenv(RING_BLOCK_BYTES_ENV, raising=False)
    args = build_parser().parse_args(base)
    assert (args.ring_block_seconds, args.ring_block_bytes) == (0.0, 0)
    monkeypatch.setenv(RING_BLOCK_SECONDS_ENV, "1")
    assert build_parser().parse_args(base).ring_block_seconds == 1
    assert build_parser().parse_args([*base, "--ring-block-bytes", "65536"]).ring_block_bytes == 65536
    with pytest.raises(UsageError, match="ring-block-bytes"):
        build_parser().parse_args([*base, "--ring-block-bytes", "-1"])
    with pytest.raises(ValueError, match="ring_block"):
        StreamOptions(ring_block_seconds=-1)


def test_a_move_from_the_ring_to_ina_lets_the_ring_op_in_flight_finish() -> None:
    """Slots revoked, then restored part-way into a ring op (one op per call, links emulated at 2 Mbit/s): the op
    is not aborted (no ring work lost, none replayed beyond it), the stream moves to INA right after it, and every
    sum is exact with every worker resuming at the same chunk."""
    n, size, calls = 4, 3000, 8
    data = _inputs(n, size, 5)
    opts = AgentOptions(stream=StreamOptions(op_timeout=20.0, link_bps=2e6))
    op_s = size * 4 * 2 * (n - 1) / n * 8 / 2e6
    first: dict = {}
    done = threading.Event()
    moves: list[int] = []

    def work(agent):
        if agent.rank == 0:
            first["agent"] = agent
        outs = [agent.allreduce(data[agent.rank]) for _ in range(calls)]
        if agent.rank == 0:
            done.set()
        return outs, agent.stats

    def wait_for(cond) -> bool:
        while not cond():
            if done.wait(0.0005):
                return False
        return True

    with LoopbackCluster(["s1"] * n, slots=16, pool=16, policy="priority", options=opts) as cl:
        def controller():
            if not wait_for(lambda: "agent" in first and first["agent"].stats.chunks > 0):
                return
            agent = first["agent"]
            moves.append(_to_ring(cl))
            if not wait_for(lambda: agent.plan.kind == Backend.RING and agent.stats.ring_ops >= 1):
                return
            ops = agent.stats.ring_ops
            if not wait_for(lambda: agent.stats.ring_ops > ops) or done.wait(0.5 * op_s):  # half-way into the next op
                return
            moves.append(_back_to_ina(cl))

        t = threading.Thread(target=controller)
        t.start()
        try:
            out = cl.run(work, timeout=120)
        finally:
            done.set()
            t.join(10)
    want = exact_sum(data)
    for outs, _ in out:
        assert all(o.tobytes() == want.tobytes() for o in outs)
    assert len(moves) == 2, "the run ended before the ring op to finish"
    histories = {tuple(st.generation_history) for _, st in out}
    assert len(histories) == 1, f"every worker resumed at the same chunk in every generation: {histories}"
    history = histories.pop()
    assert [k for _, k, _ in history][-2:] == [Backend.RING, Backend.INA]
    for _, stats in out:
        back_to_ina = stats.pauses[-1]
        assert back_to_ina[4] == 0.0 and back_to_ina[3] == 0, f"ring work lost or replayed: {back_to_ina}"
        assert back_to_ina[5:] == [history[-1][0], "ina"], "a pause record names its move's generation and plan"


@pytest.mark.parametrize("op, elapsed_share, finish", [
    (None, 0.0, False),  # no op in flight: an abort loses nothing
    ((None, 4, False), 0.0, True),  # its time not yet estimated
    ((1.0, 2, False), 0.0, True),  # two members: INA is not faster than the ring
    ((1.0, 8, False), 0.5, True),  # 8 members: INA 1.22x faster, finish after 18 % of the op
    ((1.0, 8, False), 0.1, False),
    ((1.0, 4, True), 0.9, False),  # Rina's cross-rack ring: aborted as before
    ((1.0, 8, False, 4), 0.5, False),  # in row blocks: an abort loses only the block in flight
])
def test_a_ring_op_is_worth_finishing_once_its_rest_costs_less_than_its_work_so_far(op, elapsed_share, finish) -> None:
    import time

    from host_agent.ring_phases import RingPhases

    phases = RingPhases()
    if op is not None:
        expected, n, rina, *blocks = op
        phases._ring_op = (time.monotonic() - elapsed_share * (expected or 1.0), expected, n, rina, blocks[0] if blocks else 1)
    assert phases.ring_op_worth_finishing() is finish
