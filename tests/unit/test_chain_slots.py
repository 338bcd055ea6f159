"""controller/chains.py: a Rina job's grant sized to its chains' round trip from the topology's link rates."""
from __future__ import annotations

import math

import pytest

from controller.chains import (
    CHAIN_HEADROOM,
    chain_round_trip,
    chain_rtt_floor,
    chain_slots,
    plan_rina,
    switches_connected,
)
from controller.memory import SlotRange
from controller.store import Job
from controller.topology import LinkRate, Topology, TopologyError
from inaproto import admission_pb2 as pb
from inaproto import wire
from tests.support.plans import placed_job

FRAME_2M = wire.INA_FRAME_LEN * 8 / 2e6  # one INA frame on a 2 Mbit/s link


def _rated_leaf_spine(racks: int, per_rack: int, ina_racks: int, mbps: float = 2.0, uplink: float = 2.0) -> Topology:
    switches = {"spine": {}}
    hosts, links = {}, []
    for r in range(racks):
        tor = f"tor{r}"
        switches[tor] = {"ina": r < ina_racks, "switch_ip": f"10.0.{r}.253", "switch_mac": f"02:00:00:00:{r:02x}:fe"}
        links.append([f"{tor}-p{per_rack + 1}", f"spine-p{r + 1}", "0ms", uplink])
        for k in range(per_rack):
            h = f"h{r}{k}"
            hosts[h] = {"ip": f"10.0.{r}.{k + 1}/16", "mac": f"02:00:00:00:{r:02x}:{k + 1:02x}"}
            links.append([h, f"{tor}-p{k + 1}", "0ms", mbps])
    return Topology.from_dict({"switches": switches, "hosts": hosts, "links": links})


def test_link_rates_come_from_the_topology_and_bad_ones_are_refused():
    topo = _rated_leaf_spine(2, 1, 2, uplink=1.0)
    assert topo.link_rates[frozenset(("tor0", "spine"))] == LinkRate(1.0, 0.0)
    assert topo.link_rates[frozenset(("h00", "tor0"))] == LinkRate(2.0, 0.0)
    with pytest.raises(TopologyError, match="bandwidth"):
        Topology.from_dict({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "02:00:00:00:00:01"}},
                            "links": [["h1", "s1-p1", "0ms", "fast"]]})


def test_two_ina_racks_round_trip_counts_every_link_of_the_chains():
    topo = _rated_leaf_spine(2, 4, 2)
    rtt, frame = chain_round_trip(topo, placed_job(topo, {"tor0": 8, "tor1": 8}))
    # up and down (2 links), partition of the own rack: its partial round (2 links) and back (2): 4; the other's:
    # round (2 links), final sum here: 2 ; mean 3 ring links + 2 access links
    assert frame == pytest.approx(FRAME_2M)
    assert rtt == pytest.approx(5 * FRAME_2M)
    need = CHAIN_HEADROOM * 5
    assert chain_slots(topo, placed_job(topo, {"tor0": 8, "tor1": 8})) == 16 >= need  # R x 2^k


def test_mixed_ring_needs_more_slots_than_the_all_ina_one_and_none_without_rates():
    topo = _rated_leaf_spine(2, 4, 1)
    job = placed_job(topo, {"tor0": 8})
    rtt, _ = chain_round_trip(topo, job)
    assert rtt > 10 * FRAME_2M  # 5 members, 12 links a loop
    assert chain_slots(topo, job) >= CHAIN_HEADROOM * rtt / FRAME_2M
    bare = Topology.from_dict({"switches": {"tor0": {}, "tor1": {"ina": False}, "spine": {}},
                               "hosts": {h.name: {"ip": h.ip, "mac": h.mac} for h in topo.hosts.values()},
                               "links": [[a, b] for a, b in (("tor0-p5", "spine-p1"), ("tor1-p5", "spine-p2"))]
                               + [[h.name, f"{h.switch}-p{h.port}"] for h in topo.hosts.values()]})
    assert chain_slots(bare, placed_job(bare, {"tor0": 8})) is None  # no rates: the request stands


def test_no_ring_no_sizing():
    topo = _rated_leaf_spine(2, 4, 0)
    assert chain_slots(topo, placed_job(topo, {})) is None


def test_link_delays_lengthen_the_round_trip_not_the_frame_time():
    topo = Topology.from_dict({
        "switches": {"s1": {"switch_ip": "10.0.1.254"}, "s2": {"switch_ip": "10.0.2.254"}, "spine": {"ina": False}},
        "hosts": {f"h{i}": {"ip": f"10.0.{(i + 1) // 2}.{i}/16", "mac": f"02:00:00:00:00:0{i}"} for i in (1, 2, 3, 4)},
        "links": [["h1", "s1-p1", "5ms", 2.0], ["h2", "s1-p2", "5ms", 2.0], ["s1-p3", "spine-p1", "5ms", 2.0],
                  ["h3", "s2-p1", "5ms", 2.0], ["h4", "s2-p2", "5ms", 2.0], ["s2-p3", "spine-p2", "5ms", 2.0]]})
    job = placed_job(topo, {"s1": 16, "s2": 16})
    rtt, frame = chain_round_trip(topo, job)
    assert frame == pytest.approx(FRAME_2M)
    assert rtt == pytest.approx(5 * (FRAME_2M + 0.005))  # five link crossings on the mean chain, each 5 ms longer
    assert chain_slots(topo, job) == 2 * 64  # 2 x 28.7 ms / 0.74 ms = 78 -> R x 2^k


def test_switches_without_trunks_get_no_chains():
    """``--switch`` specs give no switch-to-switch links: a job across them has no chains (no crash; it runs on the
    ring)."""
    topo = Topology.from_specs(["name=s1,addr=127.0.0.1:1,device_id=1,rack=r1",
                                "name=s2,addr=127.0.0.1:2,device_id=2,rack=r2"])
    req = pb.RegisterJobRequest(name="j")
    placement = []
    for wid, (sw, port) in enumerate([("s1", 1), ("s1", 2), ("s2", 1), ("s2", 2)]):
        req.workers.append(pb.Worker(worker_id=wid, ip=f"10.0.0.{wid + 1}", udp_port=40000 + wid,
                                     mac=f"02:00:00:00:00:{wid + 1:02x}", host=f"{sw}-p{port}"))
        placement.append((wid, sw, port))
    job = Job(1, 1, req, tuple(placement), 0.0, 1, "rina", "", (("s1", SlotRange(0, 8)), ("s2", SlotRange(0, 8))))
    assert not switches_connected(topo, job.switches())
    assert plan_rina(topo, job) is None and chain_round_trip(topo, job) is None and chain_slots(topo, job) is None
    assert chain_rtt_floor(topo, job) == 0.0


@pytest.mark.parametrize("delay,seconds", [("2ms", 2e-3), ("100us", 1e-4), ("1s", 1.0), (3, 3e-3), ("", 0.0)])
def test_link_delays_take_mininets_units(delay, seconds):
    topo = Topology.from_dict({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "02:00:00:00:00:01"}},
                               "links": [["h1", "s1-p1", delay, 2.0]]})
    assert topo.link_rates[frozenset(("h1", "s1"))].delay_s == pytest.approx(seconds)


@pytest.mark.parametrize("delay", ["inf", "-1ms", "soon", "nan"])
def test_a_link_delay_that_is_not_a_finite_time_is_refused(delay):
    with pytest.raises(TopologyError, match="delay"):
        Topology.from_dict({"switches": {"s1": {}}, "hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "02:00:00:00:00:01"}},
                            "links": [["h1", "s1-p1", delay, 2.0]]})


def test_a_hop_between_host_members_is_counted_in_runs_for_the_grant_not_for_the_floor():
    """Host members' copies send runs to each other (inaproto.rina_runs): every link of such a hop stores and
    forwards a whole run, so the grant counts those links at a run of GRANT_RUN_PAYLOADS (89 slots at 2 x 4 with
    one INA rack, where single frames gave 33 and the 50 % mix ran slot-bound); the floor the agents' windows
    read (``chain_rtt_floor``) stays the single-frame one, and a ring of switches only is not changed."""
    from controller.chains import GRANT_RUN_PAYLOADS, run_frame_len
    from inaproto.rina_runs import RUN_FRAME_LEN, RUN_PAYLOADS

    assert run_frame_len(1) == wire.INA_FRAME_LEN and run_frame_len(RUN_PAYLOADS) == RUN_FRAME_LEN == 1511
    assert GRANT_RUN_PAYLOADS == 6 and run_frame_len(6) == 851
    topo = _rated_leaf_spine(2, 4, 1)
    job = placed_job(topo, {"tor0": 8})
    floor, frame = chain_round_trip(topo, job)
    grant, _ = chain_round_trip(topo, job, GRANT_RUN_PAYLOADS)
    full, _ = chain_round_trip(topo, job, RUN_PAYLOADS)
    assert floor == pytest.approx(12.0704e-3) and floor < grant < full
    # the members: tor0, h10 .. h13; three host-host hops of two links each in a loop (6 link crossings), which a
    # chain and its final sum cross once to twice: the mean chain's extra is that many links' worth of a run
    extra = (run_frame_len(GRANT_RUN_PAYLOADS) - wire.INA_FRAME_LEN) * 8 / 2e6
    assert 6 <= (grant - floor) / extra <= 12
    assert chain_slots(topo, job) == math.ceil(CHAIN_HEADROOM * grant / frame) == 89
    assert chain_rtt_floor(topo, job) == pytest.approx(floor)
    every = _rated_leaf_spine(2, 4, 2)
    both = placed_job(every, {"tor0": 8, "tor1": 8})
    assert chain_round_trip(every, both, GRANT_RUN_PAYLOADS) == chain_round_trip(every, both)
