"""The agent under a changing grant: moved, shrunk, revoked (ring) and restored slots mid-operation; lifecycle. (Rina
on chains under a changing grant: tests/local/test_agent_rina_chains.py.)"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from host_agent.agent import Agent, AgentOptions
from host_agent.control import AdmissionClient
from host_agent.errors import JobReleased
from host_agent.options import StreamOptions
from inaproto import admission_pb2 as pb
from softswitch.udp import Faults
from tests.support.realloc import admit_step, assert_exact, release_step, run_with_steps
from topologies.loopback import LoopbackCluster, run_workers

QUICK = AgentOptions(stream=StreamOptions(op_timeout=20.0))
FAULTY = Faults(drop=0.03, duplicate=0.03, reorder=0.03, reorder_delay=0.002)


@pytest.mark.parametrize("faults", [None, FAULTY], ids=["clean", "faulty"])
def test_reallocation_mid_operation_is_exact(faults) -> None:
    """The controller's priority policy over a pool of 64 slots moves the job's 16 slots (a higher-priority job
    needs the space they fragment), shrinks them to 4, revokes them (the ring takes over mid-call), restores 4
    and then 16 (INA again) as other jobs come and go: exact sums throughout."""
    n = 4
    rng = np.random.default_rng(1)
    inputs = [(rng.standard_normal(3000) * 3).astype(np.float32) for _ in range(n)]
    steps = [admit_step("b", "s1", 48), admit_step("c", "s1", 12), admit_step("d", "s1", 4), release_step("d"), release_step("c")]
    with LoopbackCluster(["s1"] * n, slots=16, pool=64, policy="priority", faults=faults, options=QUICK) as cl:
        cl.admit("x", "s1", 8, priority=0)  # ahead of the job, so that the job's slots start at 8
        out, applied = run_with_steps(cl, inputs, calls=24, steps=steps, every=100, before=release_step("x"))
    assert_exact(out, inputs)
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
    with LoopbackCluster(["s1"] * n, slots=0, options=QUICK) as cl:
        out = cl.run(lambda agent: ([agent.allreduce(inputs[agent.rank])], agent.stats, agent.backend))
    assert {o[2] for o in out} == {"ring"}
    assert_exact([(o[0], o[1]) for o in out], inputs)


def test_launcher_registers_and_workers_join_by_job_id() -> None:
    n = 3
    with LoopbackCluster(["s1"] * n, slots=8, options=QUICK) as cl:
        client = AdmissionClient(cl.address, credential=cl.spec.secret)
        job_id = client.register(cl.spec).job_id
        client.close()

        def worker(i: int):
            agent = Agent(cl.spec, i, controller=cl.address, job_id=job_id, sock=cl.sockets[i][0],
                          listener=cl.sockets[i][1], options=QUICK)
            try:
                return agent.allreduce(np.full(10, float(i), dtype=np.float32)), agent.job_id
            finally:
                agent.close()

        for total, jid in run_workers(n, worker):
            assert jid == job_id and total.tolist() == [3.0] * 10
        # worker 0 released the launcher's job at the end, and nobody registered a second job: the next is job_id + 1
        assert list(cl.control.stub.ListJobs(pb.ListJobsRequest()).jobs) == []
        assert cl.admit("next", "s1", 1).job_id == job_id + 1


def test_release_stops_every_worker() -> None:
    n = 3
    with LoopbackCluster(["s1"] * n, slots=8, options=QUICK) as cl:
        started = threading.Barrier(n + 1)

        def work(agent):
            agent.allreduce(np.ones(100, dtype=np.float32))
            started.wait(10)
            start = time.monotonic()
            with pytest.raises(JobReleased):
                while True:
                    agent.allreduce(np.ones(100_000, dtype=np.float32))
            return time.monotonic() - start

        t = threading.Thread(target=lambda: (started.wait(10), time.sleep(0.2), cl.release(cl.job("job").job_id)))
        t.start()
        elapsed = cl.run(work)
        t.join()
    assert max(elapsed) < 5.0


def test_idle_workers_resync_when_woken_by_the_grant() -> None:
    """Between calls the idle service has no work (it sleeps instead of ticking); a new grant wakes it and every
    idle worker resyncs on the new generation without a call; the next call is exact."""
    n = 3
    inputs = [np.full(200, float(i + 1), dtype=np.float32) for i in range(n)]
    with LoopbackCluster(["s1"] * n, slots=8, pool=16, policy="priority", options=QUICK) as cl:
        first_done = threading.Barrier(n + 1)
        resynced = threading.Barrier(n + 1)

        agents = []

        def work(agent):
            agents.append(agent)
            out = [agent.allreduce(inputs[agent.rank])]
            idle_before = agent.stream.wants_idle_service()
            first_done.wait(20)
            resynced.wait(20)  # the controller thread shrank the job and saw every worker sync, no call made
            out.append(agent.allreduce(inputs[agent.rank]))
            return out, agent.stats, idle_before

        result: list = []

        def controller() -> None:
            first_done.wait(20)
            cl.admit("b", "s1", 12, priority=1)  # the job's 8 slots shrink to 4
            generation = cl.job("job").grant.generation
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if all(any(g == generation for g, _, _ in list(a.stats.generation_history)) for a in agents):
                    result.append(generation)
                    break
                time.sleep(0.001)
            resynced.wait(20)

        t = threading.Thread(target=controller)
        t.start()
        out = cl.run(work)
        t.join(30)
    assert result, "the idle workers did not resync on the new grant"
    assert not any(o[2] for o in out)  # no idle work between calls
    assert_exact([(o[0], o[1]) for o in out], inputs)
