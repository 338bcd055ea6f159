"""Two-level aggregation trees across switches (docs/controller.md, "Aggregation trees").

A job whose workers sit under several ToR switches, all running the program, aggregates in a tree: each
ToR sums its rack's workers and sends the partial, as one contribution, to the root (a switch linked to
every ToR, a spine, without workers of the job); the root's sum is final and comes back down to the ToRs,
which keep it and multicast it to their workers. Loss is recovered end to end by the chain primitive
(docs/switch.md, "Chains"): a worker's resend is answered by its ToR if it holds the final sum, else the
ToR sends its partial up again and the root answers with the final sum.

:func:`tree_layout` decides which switches a job's tree would use (the ToRs and the root), so that the
controller can ask every one of them for slots; :func:`plan_tree` turns a job whose grant holds the same
number of slots on every switch of its tree into the entries each switch needs. Pure computation:
:class:`controller.programming.SwitchProgrammer` writes what it returns.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.chains import job_state
from controller.policies import SlotRange
from controller.store import Job
from controller.topology import Topology
from inaproto import wire
from inaproto.job_entries import (
    ChainEntries,
    ChainHop,
    ChainLink,
    ChainPartition,
    JobEntries,
    chain_entries,
    job_entries,
    split_generation,
)

__all__ = ["TreeLayout", "TreeMember", "TreePlan", "plan_tree", "tree_layout", "tree_ranges"]


@dataclass(frozen=True)
class TreeLayout:
    """The switches of a job's tree: its ToRs (the switches its workers sit under) and the root above them."""

    tors: tuple[str, ...]  # name order
    root: str

    @property
    def switches(self) -> tuple[str, ...]:
        return (*self.tors, self.root)


@dataclass(frozen=True)
class TreeMember:
    """One aggregating switch of a tree: its member id in the job's worker-id space and where its sum goes."""

    switch: str
    member_id: int
    parent: str | None  # None: the root
    workers: tuple[int, ...]  # the job's workers under it (none at the root)


@dataclass(frozen=True)
class TreePlan:
    """A job's tree: members, the slots every member holds, and per switch its job and chain entries."""

    job_id: int
    root: str
    members: tuple[TreeMember, ...]  # the ToRs in name order, then the root
    num_slots: int  # the same on every switch of the tree
    states: Mapping[str, JobEntries]  # ina_job / ina_worker / ina_binding / group, per member
    chains: Mapping[str, ChainEntries]  # ina_chain entries, chain groups and link bindings, per member

    def member(self, switch: str) -> TreeMember:
        return next(m for m in self.members if m.switch == switch)


def tree_layout(topology: Topology, job: Job) -> TreeLayout | None:
    """The tree a job would aggregate in, or None: fewer than two ToRs, a ToR without the program, or no
    switch with the program and a pool that is linked to every ToR and has none of the job's workers.
    The root is the first such switch by name (stable across reallocations)."""
    tors = tuple(sorted(job.switches()))
    if len(tors) < 2 or not all(topology.switches[t].ina for t in tors):
        return None
    links = topology.neighbour_ports()
    for name in sorted(topology.switches):
        info = topology.switches[name]
        if name in tors or not info.ina or info.pool_size == 0:
            continue
        if all(t in links.get(name, {}) for t in tors):
            return TreeLayout(tors, name)
    return None


def tree_ranges(tree: TreeLayout, ranges: dict[str, SlotRange | None]) -> tuple[dict[str, SlotRange | None], bool]:
    """A tree job's ranges as granted: where every switch of its tree holds slots, each range cut to the smallest
    (every switch of a tree holds the same number of slots for the job) and True; otherwise the root's range
    given back (the job runs Rina or the ring under its ToRs, as without trees) and False."""
    sizes = [ranges.get(sw).size if ranges.get(sw) is not None else 0 for sw in tree.switches]
    if min(sizes) == 0:
        return {sw: r for sw, r in ranges.items() if sw != tree.root}, False
    n = min(sizes)
    return {sw: SlotRange(r.base, n) if r is not None else None for sw, r in ranges.items()}, True


def _free_ids(job: Job) -> list[int]:
    used = set(job.worker_ids)
    return [i for i in range(wire.MAX_WORKERS - 1, -1, -1) if i not in used]


def plan_tree(topology: Topology, job: Job) -> TreePlan | None:
    """The entries of ``job``'s tree, or None where it has none: no layout, a switch of it without slots,
    different slot counts on its switches (the controller trims them to one), or no free member ids."""
    layout = tree_layout(topology, job)
    if layout is None:
        return None
    ranges = [job.range_on(sw) for sw in layout.switches]
    if any(r is None or r.size == 0 for r in ranges) or len({r.size for r in ranges}) != 1:
        return None
    num_slots = ranges[0].size
    free = _free_ids(job)
    if len(free) < len(layout.switches):
        return None
    ids = dict(zip(layout.switches, free))
    links = topology.neighbour_ports()
    root_info = topology.switches[layout.root]
    members: list[TreeMember] = []
    states: dict[str, JobEntries] = {}
    chains: dict[str, ChainEntries] = {}
    to_tors: list[ChainHop] = []
    for tor in layout.tors:
        info = topology.switches[tor]
        up = links[tor][layout.root]  # the ToR's uplink to the root
        down = links[layout.root][tor]  # the root's port to the ToR
        members.append(TreeMember(tor, ids[tor], layout.root, tuple(w for w, _ in job.workers_on(tor))))
        state = states[tor] = job_state(job, tor)
        # The partial goes up the uplink to the root, addressed to it (no switch routes it on the way);
        # the final sum comes back on the same link, under the ToR's own member id.
        hop = ChainHop(ids[layout.root], up, root_info.switch_mac, root_info.switch_ip, wire.INA_UDP_PORT)
        chains[tor] = chain_entries(state, ids[tor], hop, [ChainPartition(0, 0, (), False)],
                                    {ids[tor]: ChainLink(up)})
        to_tors.append(ChainHop(ids[tor], down, info.switch_mac, info.switch_ip, wire.INA_UDP_PORT))
    rng = job.range_on(layout.root)
    generation, owner_epoch = split_generation(job.generation)
    root_state = states[layout.root] = job_entries(job.job_id, [], base_slot=rng.base, num_slots=rng.size,
                                                   generation=generation, owner_epoch=owner_epoch)
    upstream = tuple(ids[t] for t in layout.tors)
    chains[layout.root] = chain_entries(
        root_state, ids[layout.root], None, [ChainPartition(0, 0, upstream, True, tuple(to_tors))],
        {ids[t]: ChainLink(links[layout.root][t]) for t in layout.tors})
    members.append(TreeMember(layout.root, ids[layout.root], None, ()))
    return TreePlan(job.job_id, layout.root, tuple(members), num_slots, states, chains)
