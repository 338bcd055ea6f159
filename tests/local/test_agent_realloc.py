"""The agent under a changing grant: moved, shrunk, revoked (ring) and restored slots mid-operation; Rina; lifecycle."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from host_agent.agent import Agent, AgentOptions
from host_agent.control import AdmissionClient
from host_agent.errors import JobReleased
from host_agent.stream import StreamOptions
from inaproto.backends import Backend
from inaproto.wire import LANES
from softswitch.udp import Faults
from tests.udp_switch import LocalCluster, quantised_sum, run_workers

MID_CALL_LIMIT = 2.0  # seconds
QUICK = AgentOptions(stream=StreamOptions(op_timeout=20.0))
FAULTY = Faults(drop=0.03, duplicate=0.03, reorder=0.03, reorder_delay=0.002)


def _into_call(agent: Agent, per_call: int) -> int:
    """How many chunks of its current call ``agent`` has results for (read from another thread: a torn read
    only delays the caller's wait)."""
    try:
        return agent.stream.first_missing() % per_call
    except (IndexError, RuntimeError, AttributeError):
        return 0


def _run_with_steps(cl: LocalCluster, inputs: list[np.ndarray], calls: int, steps: list[dict], *, every: int,
                    spec=None, sockets=None) -> list:
    """Every worker all-reduces its input ``calls`` times; a controller thread applies ``steps`` one by one,
    each once worker 0 has synced on the previous one, then started ``every`` more chunks, then had results
    for a fifth of that call's chunks; the switches hold their frames from then until worker 0 synced on the step,
    so the step lands in the middle of a call whatever the machine's load.

    Waiting on conditions, not time: ``stats.chunks`` counts a call's chunks when it starts, so a worker
    that had its results before it noticed a grant could start the next call and let the next step supersede
    the grant before anyone synced on it (on a loaded machine, the ring step vanished); and a fixed few ms
    into a call were, on a loaded machine, often before its first result, and the workers could finish a
    call before noticing a grant (every step landed on a call's boundary). Only under a single-switch INA
    plan (Rina's ring exchanges would wait on a held switch; the ring has no switch) does the step wait for
    mid-call results (at most ``MID_CALL_LIMIT`` seconds) and hold the switches; otherwise it is applied at once.
    Returns (per worker (results, stats), generations applied)."""
    first: dict[str, Agent] = {}
    per_call = -(-inputs[0].size // LANES)  # chunks per call
    done = threading.Event()
    applied: list[int] = []

    def work(agent):
        if agent.rank == 0:
            first["agent"] = agent
        outs = [agent.allreduce(inputs[agent.rank]) for _ in range(calls)]
        if agent.rank == 0:
            done.set()
        return outs, agent.stats

    def controller():
        job_id = cl.fake.job_named((spec or cl.spec).name).job_id
        target = every
        for step in steps:
            while (first.get("agent") is None or first["agent"].stats.chunks < target) and not done.is_set():
                time.sleep(0.0005)
            agent = first.get("agent")
            stats = agent.stats if agent is not None else None
            single = stats is not None and agent.plan.kind == Backend.INA
            if single:
                limit = time.monotonic() + MID_CALL_LIMIT
                while _into_call(agent, per_call) < per_call // 5 and time.monotonic() < limit and not done.is_set():
                    time.sleep(0.0005)
            if done.is_set():
                return
            switches = [sw for sw in cl.switches.values() if sw is not None] if single else []
            for sw in switches:  # nobody finishes the call before noticing the grant
                sw.hold()
            try:
                applied.append(cl.fake.reallocate(job_id, **step))
                while not done.is_set() and not any(g >= applied[-1] for g, _, _ in list(stats.generation_history)):
                    time.sleep(0.0005)
            finally:
                for sw in switches:
                    sw.release()
            target = stats.chunks + every

    t = threading.Thread(target=controller)
    t.start()
    try:
        out = cl.run(work, spec=spec, sockets=sockets)
    finally:
        done.set()
        t.join(10)
    return out, applied


def _assert_exact(out, inputs) -> None:
    want = quantised_sum(inputs)
    for outs, _ in out:
        for o in outs:
            assert o.tobytes() == want.tobytes()


@pytest.mark.parametrize("faults", [None, FAULTY], ids=["clean", "faulty"])
def test_reallocation_mid_operation_is_exact(faults) -> None:
    """Range moved, shrunk, revoked (ring takes over mid-call), restored (INA again), moved again: exact sums."""
    n = 4
    rng = np.random.default_rng(1)
    inputs = [(rng.standard_normal(3000) * 3).astype(np.float32) for _ in range(n)]
    steps = [{"slots": 16, "bases": 200}, {"slots": 4}, {"slots": 0}, {"slots": 32, "bases": 0}, {"slots": 8, "bases": 64}]
    with LocalCluster(["s1"] * n, slots=16, faults=faults, options=QUICK) as cl:
        out, applied = _run_with_steps(cl, inputs, calls=24, steps=steps, every=100)
    _assert_exact(out, inputs)
    assert len(applied) == len(steps), "the run ended before every reallocation was applied"
    histories = {tuple(st.generation_history) for _, st in out}
    assert len(histories) == 1, f"every worker resumed at the same chunk in every generation: {histories}"
    history = histories.pop()
    kinds = [kind for _, kind, _ in history]
    # a worker skips a generation that is superseded before it syncs on it, so compare in order only
    assert kinds[0] == "ina" and "ring" in kinds and "ina" in kinds[kinds.index("ring"):], history
    assert [g for g, _, _ in history] == sorted({g for g, _, _ in history}), history
    assert any(resume % 94 for _, _, resume in history[1:]), f"some reallocation hit the middle of a call: {history}"


def test_no_slots_granted_falls_back_to_ring() -> None:
    n = 3
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(777).astype(np.float32) for _ in range(n)]
    with LocalCluster(["s1"] * n, slots=0, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank])], agent.stats, agent.backend))
    assert {o[2] for o in out} == {"ring"}
    _assert_exact([(o[0], o[1]) for o in out], inputs)


@pytest.mark.parametrize("faults", [None, FAULTY], ids=["clean", "faulty"])
def test_rina_three_racks_one_without_ina(faults) -> None:
    """Racks r1 (3 workers) and r2 (2) aggregate in their switches; r3 (2) has none: its workers are ring members."""
    racks = ["r1", "r1", "r1", "r2", "r2", "r3", "r3"]
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal(3000) * 5).astype(np.float32) for _ in racks]
    inputs[3][100:160] = inputs[4][100:160] = 30000.0  # overflows in r2's switch: recovered
    with LocalCluster(racks, ina_racks={"r1", "r2"}, slots=16, faults=faults, options=QUICK) as cl:
        def work(agent):
            assert agent.backend == "rina"
            return [agent.allreduce(inputs[agent.rank]) for _ in range(2)], agent.stats

        out = cl.run(work)
        _assert_exact(out, inputs)
        plan = cl.fake.jobs[cl.fake.job_id("job")].grant
        assert plan.backend == "rina"
    stats = [st for _, st in out]
    assert stats[0].broadcasts_sent > 0 and stats[3].broadcasts_sent > 0  # the two representatives
    assert all(st.broadcasts_sent == 0 for i, st in enumerate(stats) if i not in (0, 3))
    assert all(st.overflow_chunks > 0 for st in stats)


def test_rina_rack_loses_and_regains_its_slots() -> None:
    racks = ["r1", "r1", "r2", "r2", "r2"]
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal(3000).astype(np.float32) for _ in racks]
    steps = [{"slots": {"r1": 16, "r2": 0}}, {"slots": {"r1": 0, "r2": 0}}, {"slots": {"r1": 8, "r2": 8}}]
    with LocalCluster(racks, slots=16, options=QUICK) as cl:
        out, applied = _run_with_steps(cl, inputs, calls=30, steps=steps, every=200)
    _assert_exact(out, inputs)
    assert len(applied) == len(steps)
    kinds = [kind for _, kind, _ in out[0][1].generation_history]
    assert kinds[0] == "rina" and "ring" in kinds and kinds[-1] == "rina"


def test_launcher_registers_and_workers_join_by_job_id() -> None:
    n = 3
    with LocalCluster(["s1"] * n, slots=8, options=QUICK) as cl:
        client = AdmissionClient(cl.fake.address)
        job_id = client.register(cl.spec).job_id
        client.close()

        def worker(i: int):
            agent = Agent(cl.spec, i, controller=cl.fake.address, job_id=job_id, sock=cl.sockets[i][0],
                          listener=cl.sockets[i][1], options=QUICK)
            try:
                return agent.allreduce(np.full(10, float(i), dtype=np.float32)), agent.job_id
            finally:
                agent.close()

        for total, jid in run_workers(n, worker):
            assert jid == job_id and total.tolist() == [3.0] * 10
        # nobody registered a second job; worker 0 released the launcher's job at the end
        assert [(j.job_id, j.state) for j in cl.fake.jobs.values()] == [(job_id, "released")]


def test_release_stops_every_worker() -> None:
    n = 3
    with LocalCluster(["s1"] * n, slots=8, options=QUICK) as cl:
        started = threading.Barrier(n + 1)

        def work(agent):
            agent.allreduce(np.ones(100, dtype=np.float32))
            started.wait(10)
            start = time.monotonic()
            with pytest.raises(JobReleased):
                while True:
                    agent.allreduce(np.ones(100_000, dtype=np.float32))
            return time.monotonic() - start

        t = threading.Thread(target=lambda: (started.wait(10), time.sleep(0.2), cl.fake.release(cl.fake.job_id("job"))))
        t.start()
        elapsed = cl.run(work)
        t.join()
    assert max(elapsed) < 5.0


def test_idle_workers_resync_when_woken_by_the_grant() -> None:
    """Between calls the idle service has no work (it sleeps instead of ticking); a new grant wakes it and every
    idle worker resyncs on the new generation without a call; the next call is exact."""
    n = 3
    inputs = [np.full(200, float(i + 1), dtype=np.float32) for i in range(n)]
    with LocalCluster(["s1"] * n, slots=8, options=QUICK) as cl:
        first_done = threading.Barrier(n + 1)
        resynced = threading.Barrier(n + 1)

        def work(agent):
            out = [agent.allreduce(inputs[agent.rank])]
            idle_before = agent.stream.wants_idle_service()
            first_done.wait(20)
            resynced.wait(20)  # the controller thread moved the job and saw every worker sync, no call made
            out.append(agent.allreduce(inputs[agent.rank]))
            return out, agent.stats, idle_before

        result: list = []

        def controller() -> None:
            first_done.wait(20)
            job_id = cl.fake.job_id("job")
            generation = cl.fake.reallocate(job_id, 4, bases=100)
            result.append(cl.fake.wait_sync(job_id, generation, timeout=20))
            resynced.wait(20)

        t = threading.Thread(target=controller)
        t.start()
        out = cl.run(work)
        t.join(30)
    assert result, "the idle workers did not resync on the new grant"
    assert not any(o[2] for o in out)  # no idle work between calls
    _assert_exact([(o[0], o[1]) for o in out], inputs)
