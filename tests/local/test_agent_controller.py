"""Agents against the real controller (tests.harness.Harness: controller, admission service, switches
programmed over P4Runtime), with the switches' pipelines bridged to loopback UDP by tests/udp_switch.py."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from host_agent.agent import Agent, AgentOptions
from host_agent.stream import StreamOptions
from softswitch.udp import UdpSwitch
from tests.udp_switch import local_job, quantised_sum, run_workers

testing = pytest.importorskip("tests.harness")


@pytest.fixture
def harness(tmp_path):
    # the relay Rina (its racks' switches are bridged to loopback: no route between them for chains)
    with testing.Harness(tmp_path / "ctl.db", n_switches=2, hosts_per_switch=4, pool=64, sync_timeout=20.0,
                         policy="equal", rina_chains=False) as h:
        yield h


def _bridges(harness, hosts: list[str], sockets) -> tuple[dict[str, UdpSwitch], AgentOptions]:
    """A UDP bridge per switch onto the pipeline the controller programs; workers on their topology ports."""
    bridges = {name: UdpSwitch(name, pipeline=sw.pipeline) for name, sw in harness.switches.items()}
    for host, (udp, _) in zip(hosts, sockets):
        switch, port = harness.topology.locate(host)
        bridges[switch].attach("127.0.0.1", udp.getsockname()[1], port, mac=harness.topology.hosts[host].mac)
    opts = AgentOptions(stream=StreamOptions(op_timeout=20.0), close_timeout=5.0,
                        switch_addresses={name: b.address for name, b in bridges.items()})
    return bridges, opts


def _run(harness, spec, sockets, opts, fn) -> list:
    def worker(i: int):
        agent = Agent(spec, i, controller=harness.address, sock=sockets[i][0], listener=sockets[i][1], options=opts)
        try:
            return fn(agent)
        finally:
            agent.close()

    return run_workers(len(spec.workers), worker, timeout=60)


def test_ina_and_reallocation_by_the_controller(harness) -> None:
    """A second job on the same switch halves the first one's slots mid-run (policy "equal"): the
    controller's generation barrier resyncs the first job's workers."""
    hosts = ["h11", "h12", "h13"]
    spec, sockets = local_job(3, "first", hosts=hosts)
    bridges, opts = _bridges(harness, hosts, sockets)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(5000).astype(np.float32) for _ in hosts]
    started = threading.Event()

    def work(agent):
        assert agent.backend == "ina"
        outs = []
        for k in range(12):
            outs.append(agent.allreduce(inputs[agent.rank]))
            if k == 2:
                started.set()
        return outs, agent.stats.generation_history

    def second_job() -> None:
        started.wait(30)
        from inaproto import admission_pb2 as pb

        harness.stub.RegisterJob(pb.RegisterJobRequest(
            name="second", tensor_elements=100,
            workers=[pb.Worker(worker_id=0, host="h14", udp_port=45000)]), timeout=10)

    t = threading.Thread(target=second_job)
    t.start()
    try:
        out = _run(harness, spec, sockets, opts, work)
    finally:
        t.join(30)
        for b in bridges.values():
            b.close()
    want = quantised_sum(inputs)
    for outs, _ in out:
        assert all(o.tobytes() == want.tobytes() for o in outs)
    histories = {tuple(h) for _, h in out}
    assert len(histories) == 1
    assert len(histories.pop()) >= 2, "the second job's admission changed the first job's generation"
    assert all(j.name != "first" for j in harness.stub.ListJobs(testing.pb.ListJobsRequest()).jobs), "released"


def test_rina_across_two_racks(harness) -> None:
    hosts = ["h11", "h12", "h21", "h22", "h23"]
    spec, sockets = local_job(len(hosts), "rina", hosts=hosts)
    bridges, opts = _bridges(harness, hosts, sockets)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(3000).astype(np.float32) for _ in hosts]
    try:
        out = _run(harness, spec, sockets, opts, lambda agent: (agent.backend, agent.allreduce(inputs[agent.rank])))
    finally:
        for b in bridges.values():
            b.close()
    want = quantised_sum(inputs)
    for backend, total in out:
        assert backend == "rina" and total.tobytes() == want.tobytes()
