"""``ina-switch``'s data plane on veth pairs: bursts of every worker's gradients give exactly the model's frames,
port by port (each port's frames leave in the order the pipeline emitted them)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from inaproto import wire
from tests.integration.ptfutil import HostPorts
from tests.p4rt_client import P4RuntimeTestClient
from tests.support.entries import install_job
from tests.support.frames import gradient, make_workers
from tests.targets import ModelTarget
from topologies.netns import Network, sweep_stale, wait_until
from topologies.switch_process import SwitchNetwork, SwitchProcess

K, JOB, SLOTS = 3, 4, 64


@pytest.fixture(scope="module")
def net():
    sweep_stale()
    with Network("io") as network:
        yield SwitchNetwork(network, range(1, K + 1), separate_hosts=True)


def _rounds() -> list[list[tuple[int, bytes]]]:
    """Per worker, one gradient into each of SLOTS slots (small lanes: no overflow, so order cannot matter)."""
    rng = np.random.default_rng(12)
    return [[(w.port, gradient(w, JOB, slot=s, lanes=rng.integers(-1000, 1000, wire.LANES), seq=77, shadow=1))
             for s in range(SLOTS)] for w in make_workers(K)]


def _by_port(frames: list[tuple[int, bytes]]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for port, frame in frames:
        out.setdefault(port, []).append(frame)
    return out


def _results(hosts: HostPorts, count: int) -> list[tuple[int, bytes]]:
    """Every INA result the hosts receive, waiting until at least ``count`` came (then the rest in flight)."""
    got: list[tuple[int, bytes]] = []

    def enough() -> bool:
        got.extend((p, f) for p, f in hosts.poll(0.05) if len(f) == wire.INA_FRAME_LEN)
        return len(got) >= count

    wait_until(enough, 10, message="every result")
    hosts.drain()
    return got + [(p, f) for p, f in hosts.pending if len(f) == wire.INA_FRAME_LEN]


@contextlib.contextmanager
def _switch_with_job(net, tmp_path):
    """ina-switch in the switch namespace with the job installed over P4Runtime: (P4Runtime client, host ports)."""
    sw = SwitchProcess(net, tmp_path)
    hosts = HostPorts(net.hosts)
    client = P4RuntimeTestClient(sw.address, sw.device_id, 1, device_config=b"")
    try:
        install_job(client, JOB, make_workers(K), base=0, num_slots=SLOTS)
        yield client, hosts
    finally:
        client.close()
        hosts.close()
        assert sw.stop() in (0, -15, 143)


def test_bursts_give_the_models_frames(net, tmp_path):
    rounds = _rounds()
    model = ModelTarget()
    install_job(model, JOB, make_workers(K), base=0, num_slots=SLOTS)
    expected = _by_port([out for r in rounds for port, f in r for out in model.pipeline.process(port, f)])
    assert sum(map(len, expected.values())) == K * SLOTS

    with _switch_with_job(net, tmp_path) as (client, hosts):
        for r in rounds[:-1]:
            for port, f in r:
                hosts.send(port, f)
        wait_until(lambda: client.read_counter("MyIngress.ina_aggregated", JOB) == (K - 1) * SLOTS, 10,
                   message="the first workers' gradients aggregated")
        for port, f in rounds[-1]:  # one burst: the last worker completes every slot
            hosts.send(port, f)
        assert _by_port(_results(hosts, K * SLOTS)) == expected
        assert client.read_counter("MyEgress.ina_results", JOB) == K * SLOTS


def test_interleaved_rounds_of_every_worker_give_the_models_frames(net, tmp_path):
    """Every worker's gradient into each slot, interleaved slot by slot across the ports in one burst: the I/O loop
    takes each port's ready frames together (one lock), and each slot still completes once, so every port gets
    exactly the model's frames, in the model's order."""
    rounds = _rounds()
    interleaved = [r[s] for s in range(SLOTS) for r in rounds]
    model = ModelTarget()
    install_job(model, JOB, make_workers(K), base=0, num_slots=SLOTS)
    expected = _by_port([out for port, f in interleaved for out in model.pipeline.process(port, f)])

    with _switch_with_job(net, tmp_path) as (client, hosts):
        for port, f in interleaved:
            hosts.send(port, f)
        assert _by_port(_results(hosts, K * SLOTS)) == expected
        assert client.read_counter("MyIngress.ina_aggregated", JOB) == K * SLOTS
