"""The stream's ring phase (host_agent/ring_phases.py): a segment's ring results by range, and a move from the ring
to INA that lets the ring op in flight finish when that loses less than aborting it."""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from host_agent.acceptor import Acceptor, Inbox
from host_agent.agent import AgentOptions, bind_worker_sockets
from host_agent.chunks import Segment
from host_agent.errors import AgentTimeout, StaleGeneration
from host_agent.grant import Grant, SwitchGrant, Worker
from host_agent.options import StreamOptions
from host_agent.ring import HELLO_MAGIC as RING_HELLO
from host_agent.ring_phases import RingOp, RingPhase
from host_agent.stats import StreamStats
from host_agent.stream import ChunkStream
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


class _Barrier:
    """The controller's generation barrier for streams driven by hand: each worker's report, the minimum once all
    have reported (``controller/barrier.py``), a StaleGeneration once a newer generation was announced."""

    def __init__(self, workers: int) -> None:
        self.workers, self.cv = workers, threading.Condition()
        self.reports: dict[int, dict[int, int]] = {}
        self.latest = 0

    def announce(self, generation: int) -> None:
        with self.cv:
            self.latest = max(self.latest, generation)
            self.cv.notify_all()

    def sync(self, worker: int, generation: int, first_missing: int) -> int:
        with self.cv:
            self.reports.setdefault(generation, {})[worker] = first_missing
            self.cv.notify_all()
            if not self.cv.wait_for(lambda: len(self.reports[generation]) == self.workers or self.latest > generation,
                                    timeout=60):
                raise AgentTimeout(f"generation {generation}: not every worker reported")
            if len(self.reports[generation]) < self.workers:
                raise StaleGeneration(f"generation {generation} was replaced")
            return min(self.reports[generation].values())

    def complete(self, generation: int) -> bool:
        with self.cv:
            return len(self.reports.get(generation, {})) == self.workers


def test_a_worker_stopping_for_a_generation_leaves_its_rings_so_a_peer_in_an_op_it_will_not_join_resyncs() -> None:
    """Worker 0 (its ring link emulated slow) is still in a call's ring op when the move to INA reaches it, and
    finishes the op (two members: INA is no faster than the ring); worker 1, done with that op, has started the
    next call's, and sees the move only then (its op, in flight, looks worth finishing too). Worker 0 leaves its
    rings before it waits at the barrier, so worker 1's op fails and worker 1 resyncs, instead of the two waiting
    on each other until their timeouts; a move back to the ring finishes the calls, exactly."""
    n = 2
    socks = [bind_worker_sockets("127.0.0.1") for _ in range(n)]
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the INA switch's address: nothing answers there
    sink.bind(("127.0.0.1", 0))
    workers = tuple(Worker(i, "127.0.0.1", s[0].getsockname()[1], "", f"h{i}") for i, s in enumerate(socks))
    ring1 = Grant(job_id=1, generation=1, backend=Backend.RING)
    ina2 = Grant(job_id=1, generation=2, backend=Backend.INA, ina_port=sink.getsockname()[1],
                 switches=(SwitchGrant("s1", "127.0.0.1", num_slots=4, worker_ids=(0, 1)),))
    ring3 = Grant(job_id=1, generation=3, backend=Backend.RING)
    barrier = _Barrier(n)
    options = [StreamOptions(op_timeout=60.0, ring_grace=60.0, link_bps=30e3),  # an op of 40 chunks: about 1.5 s
               StreamOptions(op_timeout=60.0, ring_grace=60.0)]
    acceptors = [Acceptor(listener, (RING_HELLO,)) for _, listener in socks]
    streams = [ChunkStream(worker_id=i, workers=workers, sock=socks[i][0], ring_inbox=acceptors[i].inbox(RING_HELLO),
                           grant=ring1, sync=lambda g, m, i=i: barrier.sync(i, g, m), options=options[i])
               for i in range(n)]
    data = [np.full((40, LANES), i + 1, dtype=np.int32) for i in range(n)]
    results: dict[int, list] = {0: [], 1: []}

    def calls(i: int, count: int) -> None:
        for _ in range(count):
            results[i].append(streams[i].reduce(data[i]))

    def within(cond, seconds: float = 20.0) -> bool:
        deadline = time.monotonic() + seconds
        while not cond():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    threads = [threading.Thread(target=calls, args=(i, 3), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        ring0, ring1_ = streams[0].ring, streams[1].ring
        assert within(lambda: streams[1].stats.calls == 3 and ring1_.op is not None), "worker 1 in the third call's op"
        assert streams[0].stats.calls == 2 and ring0.op is not None, "worker 0 still in the second call's op"
        barrier.announce(2)
        streams[0].notify_grant(ina2)  # worth finishing: worker 0 finishes the op, then resyncs
        assert within(lambda: 0 in barrier.reports.get(2, {})), "worker 0 waits at the barrier"
        streams[1].notify_grant(ina2)  # worker 1's op in flight looks worth finishing: not aborted
        assert within(lambda: barrier.complete(2)), "worker 1 still waits in a ring op worker 0 will not join"
        barrier.announce(3)
        for s in streams:
            s.notify_grant(ring3)  # the switch never answers: back to the ring to finish the calls
        for t in threads:
            t.join(30)
        assert [len(r) for r in results.values()] == [3, 3]
        for r in results.values():
            assert all((out == 3).all() for out in r)
    finally:
        for s in streams:
            s.close()
        for a in acceptors:
            a.close()
        for udp, _ in socks:
            udp.close()
        sink.close()
