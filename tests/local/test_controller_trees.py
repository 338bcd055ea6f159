"""The controller's trees (controller/trees.py, docs/controller.md "Aggregation trees"): a job spanning two racks
of a leaf-spine gets a tree where every switch of it has slots, the switches' P4Runtime servers hold it, the
frames carried between them give exact sums; a controller that dies half-way through changing a tree repairs
it on restart under a new generation, written everywhere before the agents learn it."""
from __future__ import annotations

import io

import numpy as np
import pytest

from controller import cli
from controller.switch import Switch
from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.backends import Backend
from tests.support.frames import grant_gradient, parse_result
from topologies.loopback import LocalControlPlane, LocalSwitch, worker

UPLINK, DOWN1, DOWN2 = 100, 1, 2  # s1-p100 -- s3-p1, s2-p100 -- s3-p2


def _leaf_spine(switches: dict[str, LocalSwitch], pool: int) -> dict:
    """s1, s2: ToRs with hosts h11, h12 / h21, h22 on ports 1, 2; s3: the spine, no hosts."""
    doc: dict = {"hosts": {}, "switches": {}, "links": []}
    for k, name in enumerate(switches, start=1):
        sw = switches[name]
        doc["switches"][name] = {"grpc": sw.address, "device_id": sw.device_id, "pool": pool, "rack": f"r{k}",
                                 "switch_ip": f"10.0.{k}.254", "switch_mac": f"02:00:00:00:{k:02x}:fe"}
    for k in (1, 2):
        for i in (1, 2, 3):
            doc["hosts"][f"h{k}{i}"] = {"ip": f"10.0.{k}.{i}/24", "mac": f"02:00:00:00:{k:02x}:{i:02x}"}
            doc["links"].append([f"h{k}{i}", f"s{k}-p{i}"])
        doc["links"].append([f"s{k}-p{UPLINK}", f"s3-p{k}"])
    return doc


@pytest.fixture
def h(tmp_path):
    with LocalControlPlane(tmp_path / "ctl.db", 3, topology_doc=lambda sw: _leaf_spine(sw, 16), trees=True) as harness:
        yield harness


HOSTS = {0: "h11", 1: "h12", 2: "h21", 3: "h22"}


def _register(h, name="t", requested=16):
    workers = [worker(i, host) for i, host in HOSTS.items()]
    return h.stub.RegisterJob(pb.RegisterJobRequest(name=name, workers=workers, tensor_elements=10_000,
                                                    requested_slots=requested))


def _allreduce(h, grant, slot: int, seq: int, rng, generation: int | None = None) -> dict[int, np.ndarray]:
    """Every worker's gradient for ``slot``; frames carried between the switches; returns worker -> result lanes."""
    by_switch = {sg.switch: i for i, sg in enumerate(grant.switches)}
    total = np.zeros(wire.LANES, np.int64)
    queue = []
    for wid, host in HOSTS.items():
        lanes = rng.integers(-(2**20), 2**20, size=wire.LANES).astype(np.int32)
        total += lanes
        sw = h.topology.hosts[host].switch
        frame = grant_gradient(h.host(host, 40000 + wid), grant, wid, slot, lanes, seq=seq, generation=generation,
                               switch=by_switch[sw])
        queue.append((sw, h.topology.hosts[host].port, frame))
    links = {("s1", UPLINK): ("s3", DOWN1), ("s2", UPLINK): ("s3", DOWN2)}
    links.update({b: a for a, b in links.items()})
    got: dict[int, np.ndarray] = {}
    while queue:
        sw, port, frame = queue.pop(0)
        for out_port, out in h.switches[sw].send(port, frame):
            if (sw, out_port) in links:
                queue.append((*links[(sw, out_port)], out))
                continue
            header, lanes, _ip, _udp = parse_result(out)
            assert header.msg_type == wire.MsgType.RESULT and header.worker_id not in got
            got[header.worker_id] = lanes
    return {w: v for w, v in got.items()}, total.astype(np.int32)


def _job_generations(h, job_id: int) -> dict[str, int]:
    return {name: sw.entries("MyIngress.ina_job")[(job_id,)][1][5] for name, sw in h.switches.items()}


def test_a_job_across_two_racks_gets_a_tree_with_the_same_slots_on_every_switch(h):
    g = _register(h)
    assert g.backend == Backend.TREE
    assert [(s.switch, s.num_slots, list(s.worker_ids)) for s in g.switches] == [
        ("s1", 16, [0, 1]), ("s2", 16, [2, 3]), ("s3", 16, [])]
    assert set(_job_generations(h, g.job_id).values()) == {g.generation}
    got, total = _allreduce(h, g, 3, 1, np.random.default_rng(1))
    assert sorted(got) == [0, 1, 2, 3] and all((v == total).all() for v in got.values())
    out = io.StringIO()
    cli.render_job(h.stub.GetJob(pb.GetJobRequest(job_id=g.job_id)), out)
    assert "tree:        root s3, ToRs s1, s2; 16 slots on each" in out.getvalue()
    out = io.StringIO()
    cli.render_memory(h.stub.GetMemory(pb.GetMemoryRequest()), out, h.stub.ListJobs(pb.ListJobsRequest()))
    assert f"job {g.job_id} (tree root)" in out.getvalue() and f"job {g.job_id} (tree ToR under s3)" in out.getvalue()


def test_no_slots_on_the_spine_means_no_tree(h):
    h.stop_controller()
    doc = _leaf_spine(h.switches, 16)
    doc["switches"]["s3"]["pool"] = 0
    from controller.topology import Topology

    h.topology = Topology.from_dict(doc)
    h.start_controller()
    g = _register(h)
    assert g.backend == Backend.RINA and [s.switch for s in g.switches] == ["s1", "s2"]


class _Died(BaseException):
    """The controller process dying in the middle of a write (no rollback, no database commit)."""


def test_controller_dying_half_way_through_a_tree_change_repairs_it_on_restart(h, monkeypatch):
    g = _register(h)
    rng = np.random.default_rng(2)
    got, total = _allreduce(h, g, 0, 1, rng)
    assert all((v == total).all() for v in got.values())
    # a second job under s1 only, waiting (first-fit: s1's pool is the tree's); the policy change to `equal`
    # halves s1 and so the tree on every switch (new generation): the controller dies after 2 switch writes
    other = h.stub.RegisterJob(pb.RegisterJobRequest(name="o", workers=[worker(0, "h13")], requested_slots=8,
                                                     tensor_elements=1000))
    assert other.backend == Backend.RING
    real_apply, writes = Switch.apply, []

    def dying_apply(self, current, target, order):
        if len(writes) == 2:
            raise _Died()
        writes.append(self.name)
        return real_apply(self, current, target, order)

    monkeypatch.setattr(Switch, "apply", dying_apply)
    with pytest.raises(_Died):
        h.controller.set_policy("equal")
    monkeypatch.setattr(Switch, "apply", real_apply)
    fenced = _job_generations(h, g.job_id)
    assert len(set(fenced.values())) == 2  # the switches disagree: two are fenced, one is not
    h.restart_controller()
    g2 = h.stub.GetJob(pb.GetJobRequest(job_id=g.job_id)).grant
    assert g2.backend == Backend.TREE and g2.generation not in (g.generation,)
    assert set(_job_generations(h, g.job_id).values()) == {g2.generation}
    got, total = _allreduce(h, g2, 1, 2, rng)
    assert sorted(got) == [0, 1, 2, 3] and all((v == total).all() for v in got.values())
    stale, _ = _allreduce(h, g2, 2, 3, rng, generation=g.generation)  # the old generation's packets: dropped
    assert stale == {}


def _many(n: int) -> list[pb.Worker]:
    """n workers on the two racks' hosts, several per host (each its own UDP port)."""
    hosts = ["h11", "h12", "h13", "h21", "h22", "h23"]
    return [worker(i, hosts[i % len(hosts)]) for i in range(n)]


@pytest.mark.parametrize("layout, members", [({"trees": True}, 3), ({}, 2)], ids=["tree", "chains"])
def test_a_layout_that_needs_more_member_ids_than_the_mask_has_is_refused(tmp_path, layout, members):
    """Switch members take ids no worker has, from the same 32-bit mask: a tree's ToRs and root, a ring's INA racks."""
    import grpc

    with LocalControlPlane(tmp_path / "ctl.db", 3, topology_doc=lambda sw: _leaf_spine(sw, 16), **layout) as h:
        fits = wire.MAX_WORKERS - members
        with pytest.raises(grpc.RpcError) as info:
            h.stub.RegisterJob(pb.RegisterJobRequest(name="big", workers=_many(fits + 1), tensor_elements=1000))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"need {wire.MAX_WORKERS + 1} member ids" in info.value.details()
        assert f"at most {fits} workers" in info.value.details()
        grant = h.stub.RegisterJob(pb.RegisterJobRequest(name="fits", workers=_many(fits), tensor_elements=1000))
        assert grant.job_id
