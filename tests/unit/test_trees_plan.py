"""controller/trees.py: a job's two-level tree planned from a leaf-spine topology and installed into pipeline
models of every switch gives every worker the exact sum; an uplink carries one partial up and one final sum
down per rack and slot; loss is recovered from the nearest copy holding the final sum."""
from __future__ import annotations

import numpy as np
import pytest

from controller.policies import SlotRange
from controller.trees import plan_tree, tree_layout, tree_ranges
from inaproto import wire
from inaproto.scapy_layer import INA
from tests.support.plans import carry, install_plan, leaf_spine, placed_job, plan_gradient

JOB = 3


def _tree_job(topo, racks: int, slots: int = 8):
    return placed_job(topo, {**{f"tor{r}": slots for r in range(racks)}, "spine": slots})


def test_layout_is_the_tors_under_the_spine_and_none_without_a_tree():
    topo = leaf_spine(2, 4)
    job = _tree_job(topo, 2)
    layout = tree_layout(topo, job)
    assert layout.tors == ("tor0", "tor1") and layout.root == "spine"
    assert tree_layout(leaf_spine(2, 2, {"tor1": False}), job) is None  # a ToR without the program
    one_rack = leaf_spine(1, 4)
    assert tree_layout(one_rack, placed_job(one_rack, {"tor0": 8})) is None


def test_plan_gives_member_ids_parents_and_the_same_slots_everywhere():
    topo = leaf_spine(4, 2)
    plan = plan_tree(topo, _tree_job(topo, 4))
    assert [m.switch for m in plan.members] == ["tor0", "tor1", "tor2", "tor3", "spine"]
    assert [m.member_id for m in plan.members] == [31, 30, 29, 28, 27]  # free ids of the worker-id space
    assert all(m.parent == "spine" for m in plan.members[:4]) and plan.members[4].parent is None
    assert plan.num_slots == 8 and {s.job.num_slots for s in plan.states.values()} == {8}
    (root,) = plan.chains["spine"].chains
    assert (root.num_upstream, root.chain_end, root.upstream_mask) == (4, 1, sum(1 << i for i in (31, 30, 29, 28)))
    (tor,) = plan.chains["tor0"].chains
    assert (tor.prefix_len, tor.chain_end, tor.num_upstream) == (0, 0, 0)
    # the root binds each ToR's partials to its link; a ToR binds the final sums to its uplink
    assert {(b.member_id, b.port) for b in plan.chains["spine"].bindings} == {(31, 1), (30, 2), (29, 3), (28, 4)}
    assert {(b.member_id, b.port) for b in plan.chains["tor0"].bindings} == {(31, 3)}
    # unequal slot counts or a switch of the tree without slots: no tree
    assert plan_tree(topo, placed_job(topo, {"tor0": 8, "tor1": 8, "tor2": 8, "tor3": 4, "spine": 8})) is None
    assert plan_tree(topo, placed_job(topo, {f"tor{r}": 8 for r in range(4)})) is None


def test_tree_ranges_cut_to_the_smallest_or_give_the_root_back():
    layout = tree_layout(leaf_spine(2, 2), _tree_job(leaf_spine(2, 2), 2))
    ranges, is_tree = tree_ranges(layout, {"tor0": SlotRange(0, 8), "tor1": SlotRange(4, 16), "spine": SlotRange(8, 4)})
    assert is_tree and ranges == {"tor0": SlotRange(0, 4), "tor1": SlotRange(4, 4), "spine": SlotRange(8, 4)}
    ranges, is_tree = tree_ranges(layout, {"tor0": SlotRange(0, 8), "tor1": SlotRange(4, 16), "spine": None})
    assert not is_tree and ranges == {"tor0": SlotRange(0, 8), "tor1": SlotRange(4, 16)}


def _round(topo, job, pipes, slots, rng):
    totals = {s: np.zeros(wire.LANES, np.int64) for s in slots}
    sends = []
    values = {}
    for wid, sw, port in job.placement:
        for s in slots:
            v = rng.integers(-(2**20), 2**20, size=wire.LANES).astype(np.int32)
            totals[s] += v
            values[(wid, s)] = v
            sends.append((sw, port, plan_gradient(job, wid, port, s, v)))
    return totals, values, sends


def _check(job, delivered, totals, wids=None):
    for wid, sw, port in job.placement:
        if wids is not None and wid not in wids:
            continue
        got = {p[INA].slot: p for p in delivered.pop((sw, port))}
        assert sorted(got) == sorted(totals), f"worker {wid}"
        for s, pkt in got.items():
            assert pkt[INA].msg_type == wire.MsgType.RESULT and pkt[INA].worker_id == wid
            assert pkt[INA].lanes == [int(x) for x in totals[s].astype(np.int32)]
    assert not delivered


class _Carrier:
    """``_run`` with a record of the frames that crossed each uplink (ToR <-> spine), and losses on them."""

    def __init__(self, topo, pipes):
        self.topo, self.pipes, self.uplink = topo, pipes, []

    def run(self, sends, drop=lambda sw, port, frame: False):
        topo, carrier = self.topo, self

        class Tap(dict):
            def __getitem__(self, sw):
                pipe = carrier.pipes[sw]

                class P:
                    @staticmethod
                    def process(port, frame):
                        out = []
                        for p, f in pipe.process(port, frame):
                            if p in topo.trunks.get(sw, {}):
                                carrier.uplink.append((sw, f))
                                if drop(sw, p, f):
                                    continue
                            out.append((p, f))
                        return out
                return P

        return carry(topo, Tap(), sends)


@pytest.mark.parametrize("racks,per_rack", [(2, 4), (4, 2)])
def test_tree_gives_exact_sums_and_one_partial_per_rack_crosses_each_uplink(racks, per_rack):
    topo = leaf_spine(racks, per_rack)
    job = _tree_job(topo, racks)
    plan = plan_tree(topo, job)
    pipes = install_plan(topo, plan)
    carrier = _Carrier(topo, pipes)
    totals, _, sends = _round(topo, job, pipes, range(plan.num_slots), np.random.default_rng(racks))
    _check(job, carrier.run(sends), totals)
    up = [(sw, f) for sw, f in carrier.uplink if sw != "spine"]
    down = [(sw, f) for sw, f in carrier.uplink if sw == "spine"]
    assert len(up) == len(down) == racks * plan.num_slots  # one framed partial up, one final down, per rack
    assert all(len(f) == wire.INA_FRAME_LEN for _, f in carrier.uplink)
    assert pipes["spine"].counters["MyIngress.ina_aggregated"][JOB] == racks * plan.num_slots


def test_lost_final_on_one_downlink_is_answered_by_the_root_and_then_by_the_tor():
    topo = leaf_spine(2, 2)
    job = _tree_job(topo, 2)
    plan = plan_tree(topo, job)
    pipes = install_plan(topo, plan)
    carrier = _Carrier(topo, pipes)
    totals, values, sends = _round(topo, job, pipes, [0], np.random.default_rng(7))
    port_tor1 = next(p for p, nb in topo.trunks["spine"].items() if nb == "tor1")
    lost = carrier.run(sends, drop=lambda sw, p, f: sw == "spine" and p == port_tor1)
    # tor0's workers have the sum; tor1's do not
    _check(job, {k: v for k, v in lost.items() if k[0] == "tor0"}, totals, wids={0, 1})
    assert not [k for k in lost if k[0] == "tor1"]
    # worker 2 (under tor1) resends: tor1 holds only its partial, sends it up; the root answers tor1 with the final
    wid, sw, port = job.placement[2]
    carrier.uplink.clear()
    again = carrier.run([(sw, port, plan_gradient(job, wid, port, 0, values[(wid, 0)]))])
    _check(job, again, totals, wids={2, 3})
    assert [(s, _msg(f)) for s, f in carrier.uplink] == [("tor1", wire.MsgType.GRADIENT), ("spine", wire.MsgType.RESULT)]
    # now tor1 holds the final sum: a further resend is answered there, nothing crosses the uplink
    carrier.uplink.clear()
    once_more = carrier.run([(sw, port, plan_gradient(job, wid, port, 0, values[(wid, 0)]))])
    assert not carrier.uplink
    _check(job, once_more, totals, wids={2})


def test_lost_partial_is_sent_up_again_when_a_worker_of_its_rack_resends():
    topo = leaf_spine(2, 2)
    job = _tree_job(topo, 2)
    pipes = install_plan(topo, plan_tree(topo, job))
    carrier = _Carrier(topo, pipes)
    totals, values, sends = _round(topo, job, pipes, [1], np.random.default_rng(8))
    assert carrier.run(sends, drop=lambda sw, p, f: sw == "tor0" and _msg(f) == wire.MsgType.GRADIENT) == {}
    wid, sw, port = job.placement[1]
    _check(job, carrier.run([(sw, port, plan_gradient(job, wid, port, 1, values[(wid, 1)]))]), totals)
    assert pipes["tor0"].counters["MyIngress.ina_partials"][JOB] == 2


def _msg(frame: bytes) -> int:
    return frame[wire.INA_OFFSET]

