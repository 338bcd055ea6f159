"""Jobs under a changing grant, the real way: steps at the controller (other jobs admitted or released, which
its policy answers by moving, shrinking, revoking or restoring a job's slots) taken while the job's workers
all-reduce, each landing in the middle of a call."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from host_agent.agent import Agent
from inaproto.backends import Backend
from inaproto.wire import LANES
from topologies.loopback import LoopbackCluster, exact_sum

__all__ = ["MID_CALL_LIMIT", "Step", "admit_step", "assert_exact", "release_step", "run_with_steps"]

MID_CALL_LIMIT = 2.0  # seconds
Step = Callable[[LoopbackCluster], None]  # one change at the controller, through its admission service


def _into_call(agent: Agent, per_call: int) -> int:
    """How many chunks of its current call ``agent`` has results for (read from another thread: a torn read
    only delays the caller's wait)."""
    try:
        return agent.stream.first_missing() % per_call
    except (IndexError, RuntimeError, AttributeError):
        return 0


def run_with_steps(cl: LoopbackCluster, inputs: list[np.ndarray], calls: int, steps: list[Step], *, every: int,
                    spec=None, sockets=None, before: Step | None = None) -> list:
    """Every worker all-reduces its input ``calls`` times; a controller thread takes ``steps`` one by one (each a
    change at the real controller: another job admitted or released, which the policy answers by moving,
    shrinking, revoking or restoring this job's slots), each once worker 0 has synced on the previous one, then
    started ``every`` more chunks, then had results for a fifth of that call's chunks; the switches hold their
    frames from then until worker 0 synced on the step, so the step lands in the middle of a call whatever the
    machine's load.

    Waiting on conditions, not time: ``stats.chunks`` counts a call's chunks when it starts, so a worker
    that had its results before it noticed a grant could start the next call and let the next step supersede
    the grant before anyone synced on it (on a loaded machine, the ring step vanished); and a fixed few ms
    into a call were, on a loaded machine, often before its first result, and the workers could finish a
    call before noticing a grant (every step landed on a call's boundary). Only under a single-switch INA
    plan (Rina's ring exchanges would wait on a held switch; the ring has no switch) does the step wait for
    mid-call results (at most ``MID_CALL_LIMIT`` seconds) and hold the switches; otherwise it is taken at once.
    ``before`` is taken as soon as the job is registered, before any step. Returns (per worker (results, stats),
    the job's generation after each step)."""
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
        name = (spec or cl.spec).name
        target = every
        if before is not None:
            while first.get("agent") is None and not done.is_set():
                time.sleep(0.0005)
            before(cl)
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
                step(cl)
                applied.append(cl.job(name).grant.generation)
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


def assert_exact(out, inputs) -> None:
    want = exact_sum(inputs)
    for outs, _ in out:
        for o in outs:
            assert o.tobytes() == want.tobytes()


def admit_step(name: str, rack: str, slots: int, priority: int = 1) -> Step:
    return lambda cl: cl.admit(name, rack, slots, priority=priority)


def release_step(*names: str) -> Step:
    def step(cl: LoopbackCluster) -> None:
        for name in names:
            cl.release(cl.job(name).job_id)

    return step
