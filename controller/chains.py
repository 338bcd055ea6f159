"""Chains across switches for a job (docs/switch.md, "Chains"): Rina's ring of racks as switch entries.

From the topology and a job's grant (its workers' placement and its slot ranges) :func:`plan_rina` decides the
ring's members, their member ids, the partitions of the slots, every member's next hop and the entries each
switch needs. The ring's members are the INA racks that hold slots for the job (their switch, with the rack's
workers as local members) and every worker of any other rack (a host member). The ring has R members and the
slots R partitions; partition p's chain starts after member p and ends at member p, and its final sum goes
round once more, so every member sends 2(R-1)/R of the tensor. INA switches that carry the job's packets
without aggregating them (a spine, a rack without slots) route them (``ina_transit``).

Pure computation: :class:`controller.programming.SwitchProgrammer` writes what it returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from controller.store import Job
from controller.topology import Topology, next_hops_towards
from inaproto import wire
from inaproto.job_entries import (ChainEntries, ChainHop, ChainPartition, JobEntries, TransitEntry, WorkerAddress,
                                  chain_entries, job_entries)

__all__ = ["RingMember", "RinaPlan", "job_state", "plan_rina"]

SLOT_BITS = 16  # hdr.ina.slot: partitions are prefixes of it
# A host member keeps its copy of the chain as a switch would: it runs the program's model (softswitch.pipeline)
# in its agent with these entries: its own gradients enter on HOST_PORT, as local worker HOST_WORKER, and come
# back there as results; everything for the network (partials, passed-on final sums) leaves on NETWORK_PORT.
HOST_PORT, NETWORK_PORT = 1, 2


@dataclass(frozen=True)
class RingMember:
    """One member of a job's Rina ring: an INA switch with its rack's workers, or a single worker (a host)."""

    member_id: int  # in the job's worker-id space: the worker's own id for a host member
    switch: str  # the switch it is, or the switch its host sits under
    workers: tuple[int, ...]  # the rack's workers (a switch member); the worker itself (a host member)
    is_switch: bool


@dataclass(frozen=True)
class RinaPlan:
    """A job's ring, its partitions, and what each switch holds for it besides its JobEntries."""

    job_id: int
    members: tuple[RingMember, ...]  # ring order: member i sends to member i + 1
    partition_slots: int  # slots per partition (a power of two); partition p is slots [p * n, (p + 1) * n)
    chains: Mapping[str, ChainEntries]  # per switch member
    transit: Mapping[str, TransitEntry]  # per INA switch that only carries the job
    hosts: Mapping[int, tuple[JobEntries, ChainEntries]]  # per host member: its own copy (see HOST_PORT)

    def partition_of(self, slot: int) -> int:
        return slot // self.partition_slots

    def successor(self, member_id: int) -> RingMember:
        i = [m.member_id for m in self.members].index(member_id)
        return self.members[(i + 1) % len(self.members)]


def job_state(job: Job, switch: str) -> JobEntries:
    by_id = {w.worker_id: w for w in job.request.workers}
    rng = job.range_on(switch)
    return job_entries(job.job_id, [WorkerAddress(wid, port, by_id[wid].mac, by_id[wid].ip, by_id[wid].udp_port)
                                    for wid, port in job.workers_on(switch)],
                       base_slot=rng.base if rng else 0, num_slots=rng.size if rng else 0, generation=job.generation)


def plan_rina(topology: Topology, job: Job) -> RinaPlan | None:
    """The job's Rina ring over ``topology``, or None where no chain is needed or possible (fewer than two
    members, or no INA rack with slots: the plain ring; too few slots for one per partition: the ring too)."""
    by_id = {w.worker_id: w for w in job.request.workers}
    used = set(job.worker_ids)
    free_ids = [i for i in range(wire.MAX_WORKERS - 1, -1, -1) if i not in used]
    members: list[RingMember] = []
    for sw in sorted(job.switches()):
        local = tuple(sorted(w for w, _ in job.workers_on(sw)))
        rng = job.range_on(sw)
        if topology.switches[sw].ina and rng is not None and rng.size > 0:
            if not free_ids:
                return None
            members.append(RingMember(free_ids.pop(0), sw, local, True))
        else:
            members += [RingMember(w, sw, (w,), False) for w in local]
    switch_members = [m for m in members if m.is_switch]
    if len(members) < 2 or not switch_members:
        return None
    r = len(members)
    slots = min(job.range_on(m.switch).size for m in switch_members)
    block = 1 << max(0, (slots // r).bit_length() - 1) if slots >= r else 0
    if block == 0:
        return None
    plen = SLOT_BITS - (block.bit_length() - 1)

    links = {sw: [(nb, port) for port, nb in ports.items()] for sw, ports in topology.trunks.items()}

    def hop(frm: str, to: RingMember) -> ChainHop:
        """``to`` as switch ``frm`` reaches it: a switch member by its lowest worker's address (routable; the
        switch takes its INA packets on the way), a host member by its own."""
        w = by_id[min(to.workers)]
        if to.switch == frm:
            port = dict(job.workers_on(frm))[w.worker_id]
        else:
            route = next_hops_towards(links, to.switch).get(frm)
            if route is None:
                raise ValueError(f"job {job.job_id}: no path from {frm} to {to.switch}")
            port = route[0]
        udp = wire.INA_UDP_PORT if to.is_switch else w.udp_port
        return ChainHop(to.member_id, port, w.mac, w.ip, udp)

    chains: dict[str, ChainEntries] = {}
    hosts: dict[int, tuple[JobEntries, ChainEntries]] = {}
    taken = {m.member_id for m in members}
    for i, m in enumerate(members):
        succ, pred = members[(i + 1) % r], members[(i - 1) % r]
        if m.is_switch:
            nxt = hop(m.switch, succ)
        else:  # the host's own copy: the network is one port away
            h = hop(m.switch, succ)
            nxt = ChainHop(h.member_id, NETWORK_PORT, h.mac, h.ip, h.udp_port)
        parts = []
        for p in range(r):
            parts.append(ChainPartition(
                p * block, plen,
                () if i == (p + 1) % r else (pred.member_id,),
                i == p,
                () if i == (p - 1) % r else (nxt,),
            ))
        if m.is_switch:
            chains[m.switch] = chain_entries(job_state(job, m.switch), m.member_id, nxt, parts)
            continue
        w = by_id[m.member_id]
        local = min(set(range(wire.MAX_WORKERS)) - taken)  # the host's own gradients, under an id of no member
        own = job_entries(job.job_id, [WorkerAddress(local, HOST_PORT, w.mac, w.ip, w.udp_port)],
                          base_slot=0, num_slots=block * r, generation=job.generation)
        hosts[m.member_id] = (own, chain_entries(own, m.member_id, nxt, parts))
    transit = {sw: TransitEntry(job.job_id) for sw, info in sorted(topology.switches.items())
               if info.ina and sw not in chains}
    return RinaPlan(job.job_id, tuple(members), block, chains, transit, hosts)
