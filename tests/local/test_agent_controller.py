"""Agents against the controller core's decisions (topologies.loopback.LoopbackCluster: controller, admission
service, switches programmed over P4Runtime and bridged to loopback UDP): a reallocation by another job's
admission, and Rina across two racks in the relay layout."""
from __future__ import annotations

import threading

import numpy as np

from host_agent.agent import AgentOptions
from host_agent.options import StreamOptions
from inaproto import admission_pb2 as pb
from topologies.loopback import LoopbackCluster, exact_sum

OPTIONS = AgentOptions(stream=StreamOptions(op_timeout=20.0), close_timeout=5.0)


def test_ina_and_reallocation_by_the_controller() -> None:
    """A second job on the same switch halves the first one's slots mid-run (policy "equal"): the
    controller's generation barrier resyncs the first job's workers."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(5000).astype(np.float32) for _ in range(3)]
    with LoopbackCluster(["s1"] * 3, slots=64, pool=64, policy="equal", sync_timeout=20.0, options=OPTIONS,
                         name="first") as cl:
        started = threading.Event()

        def work(agent):
            assert agent.backend == "ina"
            outs = []
            for k in range(12):
                outs.append(agent.allreduce(inputs[agent.rank]))
                if k == 2:
                    started.set()
            return outs, agent.stats.generation_history

        t = threading.Thread(target=lambda: started.wait(30) and cl.admit("second", "s1", 64))
        t.start()
        try:
            out = cl.run(work)
        finally:
            t.join(30)
        assert [j.name for j in cl.control.stub.ListJobs(pb.ListJobsRequest()).jobs] == ["second"], "first released"
    want = exact_sum(inputs)
    for outs, _ in out:
        assert all(o.tobytes() == want.tobytes() for o in outs)
    histories = {tuple(h) for _, h in out}
    assert len(histories) == 1
    assert len(histories.pop()) >= 2, "the second job's admission changed the first job's generation"


