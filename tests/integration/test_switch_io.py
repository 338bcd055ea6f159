"""``ina-switch --io rings|frames``: both I/O paths emit exactly the model's frames; rings are really used.

The packet suite runs on ina-switch's default path (``INA_SWITCH_IO=rings|frames`` picks another,
topologies/switch_process.py); these tests pin each path explicitly, with bursts large enough for the batch
pipeline's vector path.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from inaproto import wire
from softswitch import dataplane as dataplane_module
from softswitch.dataplane import DataPlane, IoMode
from softswitch.pipeline import InaPipeline
from softswitch.ring_io import RingUnavailable
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


def _rings_or_skip(sw: SwitchProcess) -> None:
    log = sw.process.log_path.read_text(errors="replace")
    if "packet rings unavailable" in log:
        reason = log.split("packet rings unavailable", 1)[1].splitlines()[0]
        pytest.skip(f"this kernel gives no PACKET_MMAP rings{reason}")
    assert "Packet I/O: PACKET_MMAP rings" in log, log
    maps = Path(f"/proc/{sw.process.pid}/maps").read_text()
    assert sum("socket:[" in line for line in maps.splitlines()) >= K, "no ring mapped into the switch process"


@pytest.mark.parametrize("io", ["rings", "frames"])
def test_bursts_give_the_models_frames_on_both_io_paths(net, tmp_path, io):
    rounds = _rounds()
    model = ModelTarget()
    install_job(model, JOB, make_workers(K), base=0, num_slots=SLOTS)
    expected = _by_port([out for r in rounds for port, f in r for out in model.pipeline.process(port, f)])
    assert sum(map(len, expected.values())) == K * SLOTS

    sw = SwitchProcess(net, tmp_path, core_args=["--io", io])
    hosts = HostPorts(net.hosts)
    client = P4RuntimeTestClient(sw.address, sw.device_id, 1, device_config=b"")
    try:
        if io == "rings":
            _rings_or_skip(sw)
        else:
            assert "Packet I/O: one recv()/send() per frame (--io frames)" in sw.process.log_path.read_text()
        install_job(client, JOB, make_workers(K), base=0, num_slots=SLOTS)
        for r in rounds[:-1]:
            for port, f in r:
                hosts.send(port, f)
        wait_until(lambda: client.read_counter("MyIngress.ina_aggregated", JOB) == (K - 1) * SLOTS, 10,
                   message="the first workers' gradients aggregated")
        for port, f in rounds[-1]:  # one burst: the last worker completes every slot
            hosts.send(port, f)
        assert _by_port(_results(hosts, K * SLOTS)) == expected
        assert client.read_counter("MyEgress.ina_results", JOB) == K * SLOTS
    finally:
        client.close()
        hosts.close()
        assert sw.stop() in (0, -15, 143)


def test_rings_fall_back_to_frames_with_a_log_line(net, monkeypatch, caplog):
    """Where the kernel refuses rings, the data plane says why and moves frames one at a time."""
    def refuse(sock, **kw):
        raise RingUnavailable(95, "PACKET_MMAP rings refused: Operation not supported")

    monkeypatch.setattr(dataplane_module, "PacketRing", refuse)
    port, iface = 1, net.switch_ifaces[1]
    pipeline = InaPipeline()
    pipeline.insert_entry("MyIngress.ipv4_lpm", ((0x0A000200, 24),), "MyIngress.ipv4_forward", (0x0200000000AA, port))
    dp = DataPlane(pipeline, {port: iface}, io=IoMode.RINGS)
    with caplog.at_level(logging.INFO, logger="ina-switch"), net.switch_ns.entered():
        dp.open()
    hosts = HostPorts({port: net.hosts[port]})
    try:
        assert dp.io is IoMode.FRAMES
        assert "packet rings unavailable (PACKET_MMAP rings refused: Operation not supported)" in caplog.text
        dp.start()
        frame = wire.udp_frame(b"\x02" * 6, b"\x02\x00\x00\x00\x00\xfe", bytes([10, 0, 1, 1]), bytes([10, 0, 2, 9]),
                               5000, 5001, b"fallback")
        hosts.send(port, frame)
        back = hosts.wait_for(lambda p, f: f.endswith(b"fallback"), 5)
        assert back is not None and back[1][:6] == bytes.fromhex("0200000000aa")
    finally:
        dp.stop()
        hosts.close()


@pytest.mark.parametrize("io", ["rings", "frames"])
def test_interleaved_rounds_of_every_worker_give_the_models_frames(net, tmp_path, io):
    """Every worker's gradient into each slot, interleaved slot by slot across the ports in one burst: with rings
    the frames of several ports ready in one wake-up are one batch, and same-slot gradients are summed as runs
    (softswitch/pipeline_batch.py); whatever the batching, the switch emits exactly the model's frames per port."""
    rounds = _rounds()
    interleaved = [r[s] for s in range(SLOTS) for r in rounds]
    model = ModelTarget()
    install_job(model, JOB, make_workers(K), base=0, num_slots=SLOTS)
    expected = _by_port([out for port, f in interleaved for out in model.pipeline.process(port, f)])

    sw = SwitchProcess(net, tmp_path, core_args=["--io", io])
    hosts = HostPorts(net.hosts)
    client = P4RuntimeTestClient(sw.address, sw.device_id, 1, device_config=b"")
    try:
        if io == "rings":
            _rings_or_skip(sw)
        install_job(client, JOB, make_workers(K), base=0, num_slots=SLOTS)
        for port, f in interleaved:
            hosts.send(port, f)
        assert _by_port(_results(hosts, K * SLOTS)) == expected
        assert client.read_counter("MyIngress.ina_aggregated", JOB) == K * SLOTS
    finally:
        client.close()
        hosts.close()
        assert sw.stop() in (0, -15, 143)
