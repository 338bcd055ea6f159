"""Agents on Rina's chains: with every rack INA-capable each worker is plain INA towards its rack's switch over
the ring's partitions, and the switches (models behind UDP, linked to each other) carry the ring: exact sums,
also under loss. The entries are the ones controller/chains.py computes (tests/unit/test_chains_plan.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from host_agent.agent import AgentOptions
from host_agent.stream import StreamOptions
from inaproto.job_entries import ChainHop, ChainPartition, WorkerAddress, chain_entries, job_entries
from inaproto.rina_ring import Rack, ring_of
from softswitch.udp import Faults, _mac_bytes
from tests.udp_switch import LocalCluster, quantised_sum

OPTIONS = AgentOptions(stream=StreamOptions(op_timeout=20.0, rina_chains=True))
JOB_ID = 1  # the fake controller's first job
SLOTS = 8


def _install_chains(cl: LocalCluster) -> None:
    """What SwitchProgrammer(chains=True) writes, for the UDP switches: partials and final sums go to the next
    rack's switch socket."""
    racks = sorted(cl.switches)
    workers = {r: [w for i, w in enumerate(cl.spec.workers) if cl.racks[i] == r] for r in racks}
    ring = ring_of(Rack(r, tuple(w.worker_id for w in workers[r]), SLOTS, True) for r in racks)
    n = len(ring.members)
    for i, m in enumerate(ring.members):
        sw, nxt_sw = cl.switches[m.switch], cl.switches[ring.members[(i + 1) % n].switch]
        nxt = ChainHop(ring.members[(i + 1) % n].member_id, sw.attach(*nxt_sw.address), _mac_bytes(0),
                       nxt_sw.address[0], nxt_sw.address[1])
        nxt_sw.attach(*sw.address)
        job = job_entries(JOB_ID, [WorkerAddress(w.worker_id, sw.attach(w.ip, w.udp_port), _mac_bytes(w.worker_id),
                                                 w.ip, w.udp_port) for w in workers[m.switch]],
                          base_slot=0, num_slots=SLOTS, generation=0)
        parts = [ChainPartition(p * ring.partition_slots, ring.prefix_len, ring.upstream(i, p), i == p,
                                (nxt,) if ring.passes_final_on(i, p) else ()) for p in range(n)]
        chain_entries(job, m.member_id, nxt, parts).insert_into(sw.pipeline)


@pytest.mark.parametrize("racks", [["r1", "r1", "r2", "r2"], ["r1", "r2", "r2", "r3", "r3", "r3"]], ids=["2x2", "3-racks"])
@pytest.mark.parametrize("faults", [None, Faults(drop=0.02, duplicate=0.01)], ids=["clean", "lossy"])
def test_every_rack_ina_workers_get_exact_sums_through_the_chains(racks, faults):
    rng = np.random.default_rng(len(racks))
    inputs = [(rng.standard_normal(2000) * 3).astype(np.float32) for _ in racks]
    with LocalCluster(racks, slots=SLOTS, backend="rina", options=OPTIONS, faults=faults, seed=5) as cl:
        _install_chains(cl)

        def work(agent):
            return [agent.allreduce(inputs[agent.rank]) for _ in range(2)], agent.stats

        out = cl.run(work)
        partials = sum(sw.counter("MyIngress.ina_partials", JOB_ID) for sw in cl.switches.values())
    expected = quantised_sum(inputs)
    for results, stats in out:
        for r in results:
            np.testing.assert_array_equal(r, expected)
        assert stats.broadcasts_sent == 0
    assert partials > 0
