"""The controller binds every worker it admits: port from the topology, MAC/IPv4/UDP port from the registration;
a spoofed gradient is dropped and shows in the job's stats; release removes the bindings."""
from __future__ import annotations

import ipaddress

import numpy as np

from inaproto import admission_pb2 as pb
from inaproto import wire
from tests.support.frames import grant_gradient, parse_result
from topologies.loopback import LocalControlPlane, worker


def _mac(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def _ip(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def test_admission_binds_each_worker_and_spoofing_is_counted(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", pool=16) as h:
        # workers 0 and 1 share host h11 (distinct UDP ports); worker 2 is on h12
        workers = [worker(0, "h11", 40000), worker(1, "h11", 40001), worker(2, "h12", 40002)]
        g = h.stub.RegisterJob(pb.RegisterJobRequest(name="a", workers=workers, tensor_elements=1000, requested_slots=4),
                               timeout=10)
        sw = h.switches["s1"]
        h11, h12 = h.topology.hosts["h11"], h.topology.hosts["h12"]
        assert sw.entries("MyIngress.ina_binding") == {
            (g.job_id, 0): ("MyIngress.bind_member", (h11.port, _mac(h11.mac), _ip(h11.ip), 40000)),
            (g.job_id, 1): ("MyIngress.bind_member", (h11.port, _mac(h11.mac), _ip(h11.ip), 40001)),
            (g.job_id, 2): ("MyIngress.bind_member", (h12.port, _mac(h12.mac), _ip(h12.ip), 40002)),
        }

        addr = {0: h.host("h11", 40000), 1: h.host("h11", 40001), 2: h.host("h12", 40002)}
        port = {0: h11.port, 1: h11.port, 2: h12.port}
        data = np.arange(3 * wire.LANES, dtype=np.int32).reshape(3, wire.LANES)
        # h12 claims to be worker 0, with worker 0's own addresses: wrong port
        assert sw.send(h12.port, grant_gradient(addr[0], g, 0, 0, data[0] + 1000)) == []
        # h11 claims to be worker 2 from its own port: wrong addresses
        assert sw.send(h11.port, grant_gradient(addr[0], g, 2, 0, data[2] + 1000)) == []
        out = []
        for i in range(3):
            out += sw.send(port[i], grant_gradient(addr[i], g, i, 0, data[i]))
        assert len(out) == 3
        for _, frame in out:
            header, lanes, ip, udp = parse_result(frame)
            assert np.array_equal(lanes, data.sum(axis=0)) and (ip, udp) == (addr[header.worker_id].ip, addr[header.worker_id].udp_port)

        (stats,) = h.stub.GetStats(pb.GetStatsRequest(job_id=g.job_id), timeout=10).stats
        assert stats.drops["spoofed"] == 2
        assert h.stub.GetStats(pb.GetStatsRequest(all=True), timeout=10).switch_drops["s1/spoofed"] == 2

        h.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=g.job_id), timeout=10)
        assert sw.entries("MyIngress.ina_binding") == {}
