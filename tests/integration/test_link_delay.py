"""``ina-switch --link-delay``: frames are held on ingress and on egress, never less than the delay, in order.

The lower bound is read from the switch's own pcap timestamps (written when a frame is read from a port and
when it is sent), not from sleeps: a result that leaves on port p, completed by a gradient that came in on
port q, is at least d(q) + d(p) older than that gradient. With and without pcap (the fast path has no per-frame
bookkeeping, so there the bound is checked from the hosts' side).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from scapy.utils import rdpcap

from inaproto import wire
from tests.integration.ptfutil import HostPorts
from tests.p4rt_client import P4RuntimeTestClient
from tests.support.entries import install_job
from tests.support.frames import gradient, make_workers
from tests.targets import ModelTarget
from topologies.netns import Network, sweep_stale, wait_until
from topologies.switch_process import SwitchNetwork, SwitchProcess

K, JOB, SLOTS = 3, 6, 16
DELAY_MS = {1: 20.0, 2: 20.0, 3: 5.0}  # --link-delay 20 --link-delay 3:5
PCAP_RESOLUTION = 2e-6  # pcap keeps microseconds (both stamps truncated)


@pytest.fixture(scope="module")
def net():
    sweep_stale()
    with Network("dly") as network:
        yield SwitchNetwork(network, range(1, K + 1), separate_hosts=True)


def _rounds() -> list[list[tuple[int, bytes]]]:
    rng = np.random.default_rng(21)
    return [[(w.port, gradient(w, JOB, slot=s, lanes=rng.integers(-1000, 1000, wire.LANES), seq=s, shadow=0))
             for s in range(SLOTS)] for w in make_workers(K)]


def _by_port(frames) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for port, frame in frames:
        out.setdefault(port, []).append(frame)
    return out


@pytest.mark.parametrize("pcap", [True, False], ids=["pcap", "fast-path"])
def test_held_at_least_the_delay_each_way_and_in_order(net, tmp_path, pcap):
    rounds = _rounds()
    model = ModelTarget()
    install_job(model, JOB, make_workers(K), base=0, num_slots=SLOTS)
    expected = _by_port([out for r in rounds for port, f in r for out in model.pipeline.process(port, f)])

    args = ["--link-delay", "20", "--link-delay", "3:5"]
    if pcap:
        (tmp_path / "pcap").mkdir()
        args += ["--pcap", str(tmp_path / "pcap")]
    sw = SwitchProcess(net, tmp_path, core_args=args)
    hosts = HostPorts(net.hosts)
    client = P4RuntimeTestClient(sw.address, sw.device_id, 1, device_config=b"")
    try:
        assert "Link delay: 20 ms on every port; 5 ms on port 3 (each direction)" in sw.process.log_path.read_text()
        install_job(client, JOB, make_workers(K), base=0, num_slots=SLOTS)
        for r in rounds[:-1]:
            for port, f in r:
                hosts.send(port, f)
        wait_until(lambda: client.read_counter("MyIngress.ina_aggregated", JOB) == (K - 1) * SLOTS, 10,
                   message="the first workers' gradients aggregated")
        sent = time.monotonic()
        for port, f in rounds[-1]:  # the last worker (port 3) completes every slot, in slot order
            hosts.send(port, f)
        got: list[tuple[int, bytes]] = []
        first_back: dict[int, float] = {}

        def all_results() -> bool:
            for p, f in hosts.poll(0.05):
                if len(f) == wire.INA_FRAME_LEN:
                    got.append((p, f))
                    first_back.setdefault(p, time.monotonic())
            return len(got) >= K * SLOTS

        wait_until(all_results, 10, message="every result")
        hosts.drain()
        got += [(p, f) for p, f in hosts.pending if len(f) == wire.INA_FRAME_LEN]
        assert _by_port(got) == expected  # exact bytes, and per port the order of the slots
        for p, t in first_back.items():  # from the hosts' side: sent before, received after the switch held it
            assert t - sent >= (DELAY_MS[3] + DELAY_MS[p]) / 1000
    finally:
        client.close()
        hosts.close()
        assert sw.stop() in (0, -15, 143)
    if not pcap:
        return
    ifaces = net.switch_ifaces
    grads_in = [p for p in rdpcap(str(tmp_path / "pcap" / f"{ifaces[3]}_in.pcap")) if len(p) == wire.INA_FRAME_LEN]
    assert len(grads_in) == SLOTS
    for port in range(1, K + 1):
        results = [p for p in rdpcap(str(tmp_path / "pcap" / f"{ifaces[port]}_out.pcap")) if len(p) == wire.INA_FRAME_LEN]
        assert [bytes(p) for p in results] == expected[port]
        hold = (DELAY_MS[3] + DELAY_MS[port]) / 1000
        for grad, res in zip(grads_in, results):
            assert float(res.time - grad.time) >= hold - PCAP_RESOLUTION, (port, float(res.time - grad.time))
