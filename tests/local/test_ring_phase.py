"""The stream's ring phase (host_agent/ring_phases.py): a segment's ring results by range, and a move from the ring
to INA that lets the ring op in flight finish when that loses less than aborting it."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from host_agent.acceptor import Inbox
from host_agent.agent import AgentOptions
from host_agent.chunks import Segment
from host_agent.options import StreamOptions
from host_agent.ring import HELLO_MAGIC as RING_HELLO
from host_agent.ring_phases import RingOp, RingPhase
from host_agent.stats import StreamStats
from inaproto.backends import Backend
from inaproto.wire import LANES
from topologies.loopback import LoopbackCluster, exact_sum


def test_segment_takes_ring_results_by_range() -> None:
    seg = Segment(100, np.zeros((10, LANES), dtype=np.int32))
    seg.put_ring(0, np.full((4, LANES), 1, dtype=np.int32))
    assert seg.first_missing() == 4
    seg.put_ring(4, np.full((6, LANES), 2, dtype=np.int32))
    assert seg.first_missing() == -1 and list(seg.flag) == [0] * 10
    out = seg.values()
    assert out.dtype == np.int32 and out[:4].tolist() == [[1] * LANES] * 4 and (out[4:] == 2).all()
    seg.put_ring(2, np.full((2, LANES), 2**40, dtype=np.int64))  # a block redone in int64 widens the results
    assert seg.values().dtype == np.int64 and seg.values()[2, 0] == 2**40 and seg.values()[1, 0] == 1


def _inputs(n: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size) * 3).astype(np.float32) for _ in range(n)]


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

    # a higher-priority job takes the switch's whole pool (the job moves to the ring), then leaves (back to INA)
    with LoopbackCluster(["s1"] * n, slots=16, pool=16, policy="priority", options=opts) as cl:
        def controller():
            if not wait_for(lambda: "agent" in first and first["agent"].stats.chunks > 0):
                return
            agent = first["agent"]
            cl.admit("b", "s1", 16, priority=1)
            moves.append(cl.job(cl.spec.name).grant.generation)
            if not wait_for(lambda: agent.plan.kind == Backend.RING and agent.stats.ring_ops >= 1):
                return
            ops = agent.stats.ring_ops
            if not wait_for(lambda: agent.stats.ring_ops > ops) or done.wait(0.5 * op_s):  # half-way into the next op
                return
            cl.release(cl.job("b").job_id)
            moves.append(cl.job(cl.spec.name).grant.generation)

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
    ((None, 4), 0.0, True),  # its time not yet estimated
    ((1.0, 2), 0.0, True),  # two members: INA is not faster than the ring
    ((1.0, 8), 0.5, True),  # 8 members: INA 1.22x faster, finish after 18 % of the op
    ((1.0, 8), 0.1, False),
])
def test_a_ring_op_is_worth_finishing_once_its_rest_costs_less_than_its_work_so_far(op, elapsed_share, finish) -> None:
    phase = RingPhase(0, {}, Inbox(RING_HELLO), StreamOptions(), StreamStats())
    if op is not None:
        expected, n = op
        phase.op = RingOp(time.monotonic() - elapsed_share * (expected or 1.0), expected, n)
    assert phase.worth_finishing() is finish
