"""``rtt_ms`` in the topologies: which switch ports hold how long, and the ina-switch configuration that follows."""
from __future__ import annotations

import pytest

from softswitch.config import FaultSettings
from topologies.nodes import P4Switch
from topologies.topos import LeafSpineTopo, StarTopo


def test_star_holds_half_the_round_trip_at_each_worker_port():
    topo = StarTopo(3, bw=2, rtt_ms=10)
    assert topo.nodeInfo("s1")["link_delay_ms"] == {1: 5.0, 2: 5.0, 3: 5.0}
    assert all(link.delay_ms == 5.0 for link in topo.plan.links)
    assert "link_delay_ms" not in StarTopo(2).nodeInfo("s1")


def test_leaf_spine_links_are_half_the_round_trip_one_way_split_over_their_ends():
    topo = LeafSpineTopo(2, 2, rtt_ms=8)
    assert topo.nodeInfo("s1")["link_delay_ms"] == {1: 4.0, 2: 4.0, 3: 2.0}  # hosts 4 ms, uplink 2 ms at this end
    assert topo.nodeInfo("spine1")["link_delay_ms"] == {1: 2.0, 2: 2.0}


def test_p4switch_passes_link_delay_and_bmv2_refuses_it(tmp_path, monkeypatch):
    from topologies import nodes

    sw = P4Switch.__new__(P4Switch)  # only the configuration: no Mininet node
    sw.__dict__.update(device_id=1, grpc_port=9559, log_level="info", pcap=False, pcap_dir=tmp_path,
                       faults=FaultSettings(), link_delay_ms={1: 5.0, 2: 0.5}, program=None, cpu_port=255)
    sw.data_ports = lambda: [(1, "s1-eth1"), (2, "s1-eth2")]
    assert sw.switch_config().link_delay == ("1:5", "2:0.5")
    monkeypatch.setattr(nodes, "resolve_target", lambda target: ("bmv2", ["simple_switch_grpc"]))
    with pytest.raises(ValueError, match="BMv2 cannot delay frames"):
        P4Switch("s9", target="bmv2", link_delay_ms={1: 5.0})
