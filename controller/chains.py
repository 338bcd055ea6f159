"""Chains across switches for a job (docs/switch.md, "Chains"): Rina's ring of racks as switch entries.

From the topology and a job's grant (its workers' placement and its slot ranges) :func:`plan_rina` takes the
ring from :func:`inaproto.rina_ring.ring_of` (members, member ids, partitions: the rule agents apply to their
grant too) and adds what the network decides: every member's next hop (port and address), the entries each
switch member needs, the copy each host member keeps, and the INA switches that only carry the job's packets
(a spine, a rack without slots), which route them (``ina_transit``).

Pure computation: :class:`controller.programming.SwitchProgrammer` writes what it returns.
"""
from __future__ import annotations

import ipaddress
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.path_floor import frame_seconds
from controller.store import Job
from controller.topology import LinkRate, Topology, next_hops_towards
from inaproto import wire
from inaproto.job_entries import (
    ChainEntries,
    ChainHop,
    ChainLink,
    JobEntries,
    TransitEntry,
    WorkerAddress,
    chain_entries,
    job_entries,
    split_generation,
)
from inaproto.rina_ring import (
    HOST_PORT,
    NETWORK_PORT,
    Rack,
    Ring,
    RingMember,
    host_copy_entries,
    host_copy_port,
    ring_of,
)
from inaproto.rina_runs import MAX_VARIANTS, RUN_ENTRY_LEN, RUN_PAYLOADS, run_header_len

__all__ = [
    "CHAIN_HEADROOM",
    "GRANT_RUN_PAYLOADS",
    "HOST_PORT",
    "NETWORK_PORT",
    "RinaPlan",
    "RingMember",
    "chain_round_trip",
    "chain_rtt_floor",
    "chain_slots",
    "job_state",
    "plan_rina",
    "run_frame_len",
]


@dataclass(frozen=True)
class RinaPlan:
    """A job's ring, its partitions, and what each switch holds for it besides its JobEntries."""

    job_id: int
    members: tuple[RingMember, ...]  # ring order: member i sends to member i + 1
    ring: Ring  # members and partition sizes (inaproto.rina_ring): the rule the agents apply too
    chains: Mapping[str, ChainEntries]  # per switch member
    transit: Mapping[str, TransitEntry]  # per INA switch that only carries the job
    hosts: Mapping[int, tuple[JobEntries, ChainEntries]]  # per host member: its copy (its agent derives the same)

    @property
    def partition_slots(self) -> int:
        """Slots of the blocks the partitions are made of (all of a partition's where they are equal)."""
        return self.ring.partition_slots

    @property
    def num_slots(self) -> int:
        return self.ring.num_slots

    def partition_of(self, slot: int) -> int:
        return self.ring.partition_of(slot)

    def successor(self, member_id: int) -> RingMember:
        i = [m.member_id for m in self.members].index(member_id)
        return self.members[(i + 1) % len(self.members)]


def _ip(ip: str | bytes | int) -> str:
    return str(ipaddress.IPv4Address(ip if not isinstance(ip, bytes) else int.from_bytes(ip, "big")))


def job_state(job: Job, switch: str) -> JobEntries:
    by_id = {w.worker_id: w for w in job.request.workers}
    rng = job.range_on(switch)
    generation, owner_epoch = split_generation(job.generation)
    return job_entries(job.job_id, [WorkerAddress(wid, port, by_id[wid].mac, by_id[wid].ip, by_id[wid].udp_port)
                                    for wid, port in job.workers_on(switch)],
                       base_slot=rng.base if rng else 0, num_slots=rng.size if rng else 0, generation=generation,
                       owner_epoch=owner_epoch)


def switches_connected(topology: Topology, switches: Iterable[str]) -> bool:
    """Whether the topology's trunks join every one of ``switches`` (chains need a path between them)."""
    switches = list(switches)
    if len(switches) < 2:
        return True
    links = {sw: [(nb, port) for port, nb in ports.items()] for sw, ports in topology.trunks.items()}
    reach = next_hops_towards(links, switches[0])
    return all(sw in reach for sw in switches[1:])


def plan_rina(topology: Topology, job: Job) -> RinaPlan | None:
    """The job's Rina ring over ``topology``, or None where no chain is needed or possible (fewer than two
    members, or no INA rack with slots: the plain ring; too few slots for one per partition: the ring too)."""
    if not switches_connected(topology, job.switches()):
        return None  # no switch-to-switch path (``--switch`` specs, no trunks): the ring
    by_id = {w.worker_id: w for w in job.request.workers}
    ring = ring_of(Rack(sw, tuple(w for w, _ in job.workers_on(sw)),
                        (job.range_on(sw).size if job.range_on(sw) else 0), topology.switches[sw].ina)
                   for sw in job.switches())
    if ring is None:
        return None
    members, r = list(ring.members), len(ring.members)

    links = {sw: [(nb, port) for port, nb in ports.items()] for sw, ports in topology.trunks.items()}
    addresses = Counter([*(s.switch_ip for s in topology.switches.values()), *(h.ip for h in topology.hosts.values())])

    def own_address(switch: str) -> bool:
        """The switch's INA address is its alone (so the topology routes it: controller.topology, topologies.plan)."""
        return addresses[topology.switches[switch].switch_ip] == 1

    def hop(frm: str, to: RingMember) -> ChainHop:
        """``to`` as switch ``frm`` reaches it: a switch member by its own INA address (the topology routes it;
        not one of its workers': the final sums it multicasts take the address its packets came to as their
        source, and a worker's kernel drops packets from its own address), a host member by its own. Where
        switches share one INA address (no route tells them apart) the switch's lowest worker's address."""
        w = by_id[min(to.workers)]
        if to.is_switch and to.switch != frm and own_address(to.switch):
            info = topology.switches[to.switch]
            route = next_hops_towards(links, to.switch).get(frm)
            if route is None:
                raise ValueError(f"job {job.job_id}: no path from {frm} to {to.switch}")
            return ChainHop(to.member_id, route[0], info.switch_mac, info.switch_ip, wire.INA_UDP_PORT)
        if to.switch == frm:
            port = dict(job.workers_on(frm))[w.worker_id]
        else:
            route = next_hops_towards(links, to.switch).get(frm)
            if route is None:
                raise ValueError(f"job {job.job_id}: no path from {frm} to {to.switch}")
            port = route[0]
        udp = wire.INA_UDP_PORT if to.is_switch else host_copy_port(w.udp_port)
        return ChainHop(to.member_id, port, w.mac, w.ip, udp)

    def ingress_port(frm: RingMember, to: str) -> int:
        """The port of switch ``to`` that ``frm``'s packets come in on: the last link of the route they take
        (the lowest port to that neighbour where two switches share more than one link)."""
        if frm.switch == to:  # a host member under this switch: its own port
            return dict(job.workers_on(to))[min(frm.workers)]
        hops, at, last = next_hops_towards(links, to), frm.switch, frm.switch
        while at != to:
            if at not in hops:
                raise ValueError(f"job {job.job_id}: no path from {frm.switch} to {to}")
            last, at = at, hops[at][1]
        return min(p for nb, p in links[to] if nb == last)

    chains: dict[str, ChainEntries] = {}
    hosts: dict[int, tuple[JobEntries, ChainEntries]] = {}
    for i, m in enumerate(members):
        succ = members[(i + 1) % r]
        # Ingress binding (bind_link): partials and passed-on final sums both come from the predecessor, from
        # INA_UDP_PORT (a switch member's) or its agent's copy (a host member's, inaproto.rina_ring.host_copy_port).
        pred = members[(i - 1) % r]
        pred_udp = wire.INA_UDP_PORT if pred.is_switch else host_copy_port(by_id[pred.member_id].udp_port)
        nxt = hop(m.switch, succ)
        if not m.is_switch:  # the host's own copy (its agent derives the same from the grant)
            w = by_id[m.member_id]
            generation, owner_epoch = split_generation(job.generation)
            hosts[m.member_id] = host_copy_entries(ring, m.member_id, job.job_id, generation, (w.mac, w.ip, w.udp_port),
                                                   (_ip(nxt.ip), nxt.udp_port), owner_epoch)
            continue
        parts = ring.chain_partitions(i, nxt)
        link = ChainLink(ingress_port(pred, m.switch), pred_udp)
        sources = {pred.member_id: link, m.member_id: link}
        chains[m.switch] = chain_entries(job_state(job, m.switch), m.member_id, nxt, parts, sources)
    transit = {sw: TransitEntry(job.job_id) for sw, info in sorted(topology.switches.items())
               if info.ina and sw not in chains}
    return RinaPlan(job.job_id, tuple(members), ring, chains, transit, hosts)


# A Rina job's grant covers its chains' round trip (docs/controller.md, "Rina's grant"): every chunk a worker
# has in flight holds a slot until its final sum has come round, so the worker's window (its slots) must hold a
# chain's round trip at its link's rate. The floor counts each link a chunk's frame crosses (store and forward
# at the link's rate, plus its delay): one INA frame. The grant counts a hop between two host members in the runs
# their copies send there (``inaproto.rina_runs``): a run is stored and forwarded whole on every link, and holds
# 1 to RUN_PAYLOADS payloads (what a wake-up of the copy has for that neighbour: no timer), so the grant takes
# the mean, GRANT_RUN_PAYLOADS (6; docs/protocol.md, "Runs between host members"). The real
# round trip adds every member's processing and some queue, so the grant is CHAIN_HEADROOM times the
# bandwidth-delay product of that round trip.
CHAIN_HEADROOM = 2.0
GRANT_RUN_PAYLOADS = (1 + RUN_PAYLOADS) // 2  # 6


def _frame_time(rate: LinkRate | None, frame_len: int = wire.INA_FRAME_LEN) -> float:
    """A frame of ``frame_len`` bytes stored and forwarded on a link of ``rate``, plus the link's delay."""
    if rate is None or rate.mbps is None:
        return 0.0
    return frame_seconds(rate.mbps) * frame_len / wire.INA_FRAME_LEN + rate.delay_s


def run_frame_len(payloads: int) -> int:
    """The frame of a run of ``payloads`` INA payloads between two host members' copies (``inaproto.rina_runs``);
    one payload travels as a single INA frame."""
    if payloads <= 1:
        return wire.INA_FRAME_LEN
    return wire.INA_OFFSET + run_header_len(MAX_VARIANTS) + payloads * RUN_ENTRY_LEN


def chain_round_trip(topology: Topology, job: Job, run_payloads: int = 1) -> tuple[float, float] | None:
    """(the floor of a worker's mean chain round trip, one frame's serialization on the fastest worker's link), in
    seconds, for the ring the job's racks make when every INA rack holds slots; None where there is no ring, or the
    topology gives no link rates (a chunk to partition p: up to the worker's switch, p's partial from member p+1
    round to member p, p's final sum from there on to the worker's member, down to the worker; the mean over the
    partitions, the largest over the members; None too where no trunks join the job's switches). ``run_payloads``:
    the payloads of a run between two host members (``run_frame_len``); 1, the floor: single INA frames."""
    if not topology.link_rates or not switches_connected(topology, job.switches()):
        return None
    at = {(h.switch, h.port): name for name, h in topology.hosts.items()}
    ring = ring_of(Rack(sw, tuple(w for w, _ in job.workers_on(sw)), wire.NUM_SLOTS, topology.switches[sw].ina)
                   for sw in job.switches())
    if ring is None:
        return None
    host_of = {w: at.get((sw, port)) for w, sw, port in job.placement}
    links = {sw: [(nb, port) for port, nb in ports.items()] for sw, ports in topology.trunks.items()}

    def link(a: str | None, b: str | None, frame_len: int = wire.INA_FRAME_LEN) -> float:
        return _frame_time(topology.link_rates.get(frozenset((a, b))), frame_len) if a and b else 0.0

    def switch_path(frm: str, to: str, frame_len: int) -> float:
        hops, at_sw, t = next_hops_towards(links, to), frm, 0.0
        while at_sw != to:
            if at_sw not in hops:
                raise ValueError(f"job {job.job_id}: no path from {frm} to {to}")
            nxt = hops[at_sw][1]
            t, at_sw = t + link(at_sw, nxt, frame_len), nxt
        return t

    members, r = ring.members, len(ring.members)

    def hop(i: int) -> float:
        a, b = members[i], members[(i + 1) % r]
        # between two host members the copies send runs: a chunk's payload crosses each link in its run's frame
        frame_len = wire.INA_FRAME_LEN if a.is_switch or b.is_switch else run_frame_len(run_payloads)
        t = switch_path(a.switch, b.switch, frame_len)
        if not a.is_switch:
            t += link(host_of[a.member_id], a.switch, frame_len)
        if not b.is_switch:
            t += link(b.switch, host_of[b.member_id], frame_len)
        return t

    hops = [hop(i) for i in range(r)]
    rates = [topology.link_rates.get(frozenset((host_of[w], sw))) for w, sw, _ in job.placement]
    access = [frame_seconds(x.mbps) for x in rates if x is not None and x.mbps]
    if not any(hops) or not access:
        return None
    worst = 0.0
    for m, member in enumerate(members):
        up = max(link(host_of[w], member.switch) for w in member.workers) if member.is_switch else 0.0
        chains = [sum(hops) - hops[p] + sum(hops[(p + k) % r] for k in range((m - p) % r)) for p in range(r)]
        worst = max(worst, 2 * up + sum(chains) / r)
    return worst, min(access)


def chain_slots(topology: Topology, job: Job) -> int | None:
    """Slots per rack a Rina job on chains needs (CHAIN_HEADROOM x its chains' bandwidth-delay product, in chunks
    at its fastest worker's link rate), rounded up to what the ring uses (``R x 2^k`` where every member is a
    switch); None where the topology cannot tell (no ring, no link rates)."""
    got = chain_round_trip(topology, job, GRANT_RUN_PAYLOADS)
    if got is None:
        return None
    rtt, frame = got
    slots = max(1, math.ceil(CHAIN_HEADROOM * rtt / frame))
    ring = ring_of(Rack(sw, tuple(w for w, _ in job.workers_on(sw)), wire.NUM_SLOTS, topology.switches[sw].ina)
                   for sw in job.switches())
    if ring is not None and all(m.is_switch for m in ring.members):
        r = len(ring.members)
        slots = r * (1 << max(0, math.ceil(slots / r) - 1).bit_length())
    return min(slots, wire.NUM_SLOTS)


def chain_rtt_floor(topology: Topology, job: Job) -> float:
    """A Rina job's chains' mean round-trip floor (0 where the topology gives no link rates), the agents' window
    floor (``JobGrant.chain_rtt_floor``)."""
    got = chain_round_trip(topology, job)
    return got[0] if got else 0.0
