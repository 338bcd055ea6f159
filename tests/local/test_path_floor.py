"""The path round-trip floor in the grant (controller/path_floor.py): the controller sizes it from the
topology's link rates (one INA frame's serialization per link crossing, the slowest link per crossing), each
SwitchGrant carries it, `inactl job show` shows it, and the agents take it from every grant (an explicit
``path_rtt_floor`` overrides it)."""
from __future__ import annotations

import io
import time

import numpy as np
import pytest

from controller import cli
from controller.path_floor import frame_seconds, path_rtt_floors
from controller.store import Job
from controller.topology import LinkRate, Topology, TopologyError
from host_agent.agent import AgentOptions
from host_agent.grant import Grant
from host_agent.stream import StreamOptions
from inaproto import admission_pb2 as pb
from inaproto import wire
from topologies.loopback import LocalControlPlane, LoopbackCluster, exact_sum, worker

UPLINK = 100  # s1-p100 -- s3-p1, s2-p100 -- s3-p2


def _frame(mbps: float) -> float:
    return wire.INA_FRAME_LEN * 8 / (mbps * 1e6)


def _leaf_spine(host_mbps: dict[str, float | None], uplink_mbps: dict[str, float | None], grpc: dict | None = None,
                pool: int = 16) -> dict:
    """ToRs s1, s2 with hosts h11, h12 / h21, h22 on ports 1, 2 and uplinks to the spine s3; rates in Mbit/s by
    host and by ToR (None: the link gives none)."""
    doc: dict = {"hosts": {}, "switches": {}, "links": []}
    for k, name in enumerate(("s1", "s2", "s3"), start=1):
        sw = {"pool": pool, "rack": f"r{k}", "switch_ip": f"10.0.{k}.254", "switch_mac": f"02:00:00:00:{k:02x}:fe"}
        if grpc:
            sw.update(grpc[name])
        doc["switches"][name] = sw
    for k in (1, 2):
        for i in (1, 2):
            host = f"h{k}{i}"
            doc["hosts"][host] = {"ip": f"10.0.{k}.{i}/24", "mac": f"02:00:00:00:{k:02x}:{i:02x}"}
            rate = host_mbps.get(host)
            doc["links"].append([host, f"s{k}-p{i}"] + (["0ms", rate] if rate is not None else []))
        rate = uplink_mbps.get(f"s{k}")
        doc["links"].append([f"s{k}-p{UPLINK}", f"s3-p{k}"] + (["0ms", rate] if rate is not None else []))
    return doc


def _job(topology: Topology, hosts: list[str]) -> Job:
    placement = tuple((i, *topology.locate(h)) for i, h in enumerate(hosts))
    return Job(job_id=1, seq=1, request=pb.RegisterJobRequest(name="j"), placement=placement, registered_at=0.0,
               generation=1)


HOSTS = ["h11", "h12", "h21", "h22"]


def test_the_topology_reads_each_links_rate_on_both_ends() -> None:
    topo = Topology.from_dict(_leaf_spine({"h11": 2.0, "h12": 2}, {"s1": 10.0}))
    assert topo.port_mbps("s1", 1) == 2.0 and topo.port_mbps("s1", 2) == 2.0
    assert topo.port_mbps("s1", UPLINK) == 10.0 and topo.port_mbps("s3", 1) == 10.0
    assert topo.port_mbps("s2", 1) is None and topo.port_mbps("s2", UPLINK) is None


@pytest.mark.parametrize("rate", ["fast", 0, -2])
def test_a_link_rate_that_is_not_a_positive_number_is_refused(rate) -> None:
    doc = _leaf_spine({}, {})
    doc["links"][0] += ["0ms", rate]
    with pytest.raises(TopologyError, match="bandwidth"):
        Topology.from_dict(doc)


def test_a_star_floor_is_two_crossings_of_its_hosts_links() -> None:
    topo = Topology.from_dict(_leaf_spine(dict.fromkeys(HOSTS, 2.0), {}))
    floors = path_rtt_floors(topo, _job(topo, ["h11", "h12"]))
    assert floors == {"s1": 2 * _frame(2.0)}
    assert frame_seconds(2.0) == _frame(2.0) == pytest.approx(0.736e-3)


def test_a_tree_floor_is_four_crossings() -> None:
    topo = Topology.from_dict(_leaf_spine(dict.fromkeys(HOSTS, 2.0), {"s1": 2.0, "s2": 2.0}))
    floors = path_rtt_floors(topo, _job(topo, HOSTS), root="s3")
    assert floors == {"s1": pytest.approx(4 * _frame(2.0)), "s2": pytest.approx(4 * _frame(2.0))}
    # the same racks without a tree (Rina's racks): each its rack switch path
    assert path_rtt_floors(topo, _job(topo, HOSTS)) == {"s1": 2 * _frame(2.0), "s2": 2 * _frame(2.0)}


def test_mixed_rates_count_the_slowest_link_of_each_crossing() -> None:
    topo = Topology.from_dict(_leaf_spine({"h11": 10.0, "h12": 1.0, "h21": 10.0, "h22": 5.0}, {"s1": 4.0, "s2": 8.0}))
    floors = path_rtt_floors(topo, _job(topo, HOSTS), root="s3")
    # up: the slowest host link of the job, the slowest uplink; down: the rack's uplink, its slowest host link
    assert floors["s1"] == pytest.approx(_frame(1.0) + _frame(4.0) + _frame(4.0) + _frame(1.0))
    assert floors["s2"] == pytest.approx(_frame(1.0) + _frame(4.0) + _frame(8.0) + _frame(5.0))
    star = path_rtt_floors(topo, _job(topo, ["h21", "h22"]))
    assert star == {"s2": 2 * _frame(5.0)}


def test_a_crossing_without_a_known_rate_gives_no_floor() -> None:
    no_uplink = Topology.from_dict(_leaf_spine(dict.fromkeys(HOSTS, 2.0), {"s1": 2.0}))
    assert path_rtt_floors(no_uplink, _job(no_uplink, HOSTS), root="s3") == {"s1": 0.0, "s2": 0.0}
    one_host = Topology.from_dict(_leaf_spine({"h11": 2.0, "h21": 2.0, "h22": 2.0}, {"s1": 2.0, "s2": 2.0}))
    assert path_rtt_floors(one_host, _job(one_host, HOSTS), root="s3") == {"s1": 0.0, "s2": 0.0}
    assert path_rtt_floors(one_host, _job(one_host, HOSTS)) == {"s1": 0.0, "s2": 2 * _frame(2.0)}
    specs = Topology.from_specs(["name=s1,addr=127.0.0.1:1"])  # --switch: no links at all
    assert path_rtt_floors(specs, _job(specs, ["s1-p1", "s1-p2"])) == {"s1": 0.0}


def _register(h: LocalControlPlane, hosts: list[str], name: str) -> pb.JobGrant:
    workers = [worker(i, host) for i, host in enumerate(hosts)]
    return h.stub.RegisterJob(pb.RegisterJobRequest(name=name, workers=workers, tensor_elements=10_000,
                                                    requested_slots=8))


def test_the_grant_carries_each_switchs_floor_and_inactl_shows_it(tmp_path) -> None:
    rates = dict.fromkeys(HOSTS, 2.0)
    doc = lambda sw: _leaf_spine(rates, {"s1": 2.0, "s2": 2.0},
                                 {n: {"grpc": s.address, "device_id": s.device_id} for n, s in sw.items()})
    with LocalControlPlane(tmp_path / "ctl.db", 3, topology_doc=doc, trees=True) as h:
        tree = _register(h, HOSTS, "tree")
        assert tree.backend == "tree"
        floors = {sg.switch: sg.path_rtt_floor for sg in tree.switches}
        assert floors == {"s1": pytest.approx(4 * _frame(2.0)), "s2": pytest.approx(4 * _frame(2.0)), "s3": 0.0}
        star = _register(h, ["h21", "h22"], "star")
        assert star.backend == "ina" and [sg.path_rtt_floor for sg in star.switches] == [2 * _frame(2.0)]
        agent_grant = Grant.from_proto(tree)
        assert agent_grant.path_rtt_floor(0) == agent_grant.path_rtt_floor(3) == pytest.approx(4 * _frame(2.0))
        out = io.StringIO()
        cli.render_job(h.stub.GetJob(pb.GetJobRequest(job_id=tree.job_id)), out)
        assert out.getvalue().count(f"path RTT floor {4 * _frame(2.0) * 1e3:.3f} ms") == 2


def _wait_for_grant(agent, generation: int) -> None:
    """Until the agent's stream has the grant of ``generation`` from the controller's event stream."""
    while agent.stream._latest.generation != generation:
        time.sleep(0.001)


def test_agents_take_the_floor_from_every_grant_and_a_regrant_changes_it() -> None:
    """Hosts on 2 Mbit/s links: the controller's grant carries 2 frame times, the agents take it; a higher-priority
    job then takes the pool (the ring: no floor) and leaves (INA again: the floor again), each a new grant."""
    floor = 2 * _frame(2.0)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(1000).astype(np.float32) for _ in range(2)]
    opts = AgentOptions(stream=StreamOptions(op_timeout=20.0))
    with LoopbackCluster(["s1", "s1"], slots=16, pool=16, policy="priority", link_mbps=2.0, options=opts) as cl:
        def work(agent):
            seen = []
            for step in (None, lambda: cl.admit("b", "s1", 16, priority=1), lambda: cl.release(cl.job("b").job_id)):
                if step is not None and agent.rank == 0:  # a new grant, pending here before this worker's next call
                    step()
                    _wait_for_grant(agent, cl.job("job").grant.generation)
                total = agent.allreduce(inputs[agent.rank])  # the other worker's call is interrupted by the grant
                seen.append((total.tobytes(), agent.backend, agent.stats.path_rtt_floor_s, agent.stream.ina.rtt.path_floor))
            return seen

        want = exact_sum(inputs).tobytes()
        for seen in cl.run(work):
            assert [s[0] == want for s in seen] == [True] * 3
            assert [s[1:] for s in seen] == [("ina", pytest.approx(floor), pytest.approx(floor)), ("ring", 0.0, 0.0),
                                             ("ina", pytest.approx(floor), pytest.approx(floor))]


def test_an_explicit_floor_overrides_the_grants() -> None:
    inputs = [np.ones(100, np.float32)] * 2
    opts = AgentOptions(stream=StreamOptions(op_timeout=20.0, path_rtt_floor=0.0005))
    with LoopbackCluster(["s1", "s1"], slots=16, link_mbps=2.0, options=opts) as cl:  # the grants': 2 frame times
        out = cl.run(lambda agent: (agent.allreduce(inputs[agent.rank]), agent.stats.path_rtt_floor_s,
                                    agent.stream.ina.rtt.path_floor))
        assert all(o[0].tobytes() == exact_sum(inputs).tobytes() and o[1:] == (0.0005, 0.0005) for o in out)


def test_a_worker_on_the_ring_uses_no_floor() -> None:
    inputs = [np.ones(100, np.float32)] * 2
    with LoopbackCluster(["s1", "s1"], slots=16, backend="ring", link_mbps=2.0) as cl:  # granted, but the ring asked
        out = cl.run(lambda agent: (agent.allreduce(inputs[agent.rank]), agent.stats.path_rtt_floor_s))
        assert all(o[0].tobytes() == exact_sum(inputs).tobytes() and o[1] == 0.0 for o in out)


def test_parallel_trunks_keep_the_rate_of_the_lowest_port_whatever_their_order():
    for order in (1, -1):
        links = [["s1-p2", "s2-p2", "1ms", 5.0], ["s1-p1", "s2-p1", "0ms", 1.0]][::order]
        topo = Topology.from_dict({"switches": {"s1": {}, "s2": {}}, "links": links})
        assert topo.link_rates[frozenset(("s1", "s2"))] == LinkRate(1.0, 0.0)
        assert topo.neighbour_ports()["s1"]["s2"] == 1
