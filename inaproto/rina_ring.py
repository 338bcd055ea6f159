"""Rina's ring decided from what a grant says: the one rule the controller and the agents both apply.

Members are the racks whose switch runs INA and holds slots for the job (one member each, with the rack's
workers local to it) and every worker of any other rack (a host member), in switch-name order, a rack's
workers by id. A switch member's id is free in the job's worker-id space, taken from 31 down; a host
member's is its worker id. The slots are cut into as many partitions as there are members: with every member a
switch, each ``2^k`` slots (the largest power of two that fits the smallest rack's range R times); with host
members, sizes from the hops' framed costs over the smallest rack's whole range (``inaproto.rina_partitions``).
Equal partitions are contiguous blocks of slots, unequal ones interleaved (``slot_partitions``); one LPM entry
per aligned block of a partition's slots. Partition p's chain
starts after member p and ends at member p. docs/switch.md, "Chains"; docs/experiments.md, "Rina as designed".
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inaproto.rina_partitions import aligned_blocks, partition_sizes, slot_partitions
from inaproto.wire import INA_UDP_PORT, MAX_WORKERS

__all__ = [
    "HOST_PORT",
    "NETWORK_PORT",
    "Rack",
    "Ring",
    "RingMember",
    "host_copy_entries",
    "host_copy_port",
    "ring_of",
]

# A host member keeps its copy of the chain as a switch would: its agent runs the program's model
# (host_agent/host_member.py) with host_copy_entries: its worker's gradients enter on HOST_PORT and come back
# there as results; everything for the network (partials, passed-on final sums) leaves on NETWORK_PORT.
HOST_PORT, NETWORK_PORT = 1, 2


def host_copy_port(udp_port: int) -> int:
    """The UDP port a host member's copy listens and sends on: its worker's INA port + 1 (on the worker's IP)."""
    if not 0 < udp_port < 65535:
        raise ValueError(f"a host member's worker needs a UDP port below 65535, got {udp_port}")
    return udp_port + 1


@dataclass(frozen=True)
class Rack:
    """A switch the job has workers under, as its grant describes it."""

    switch: str
    worker_ids: tuple[int, ...]
    num_slots: int  # slots the job holds there (0: none)
    ina: bool  # the switch runs the INA program


@dataclass(frozen=True)
class RingMember:
    """One member of a job's Rina ring: an INA switch with its rack's workers, or a single worker (a host)."""

    member_id: int  # in the job's worker-id space: the worker's own id for a host member
    switch: str  # the switch it is, or the switch its host sits under
    workers: tuple[int, ...]  # the rack's workers (a switch member); the worker itself (a host member)
    is_switch: bool


@dataclass(frozen=True)
class Ring:
    members: tuple[RingMember, ...]  # ring order: member i sends to member i + 1
    sizes: tuple[int, ...]  # slots of partition p, in ring order (which slots: slot_partitions)

    @property
    def slot_partitions(self) -> tuple[int, ...]:
        """The partition of every slot (``inaproto.rina_partitions.slot_partitions``)."""
        return slot_partitions(self.sizes)

    @property
    def partition_slots(self) -> int:
        """The largest power of two of slots whose aligned blocks lie in one partition each (the agent's window
        times each block's chain on its own): a partition's size where they are equal, else 1."""
        order, g = self.slot_partitions, 1
        while all(len(set(order[b : b + 2 * g])) == 1 for b in range(0, len(order), 2 * g)) and 2 * g <= len(order):
            g *= 2
        return g

    @property
    def prefix_len(self) -> int:
        return 16 - (self.partition_slots.bit_length() - 1)

    @property
    def num_slots(self) -> int:
        """The slots the job uses on every switch member: every partition's."""
        return sum(self.sizes)

    def blocks(self, p: int) -> list[tuple[int, int]]:
        """Partition p's slots as (prefix, prefix_len) LPM blocks."""
        order, out, t = self.slot_partitions, [], 0
        while t < len(order):
            end = t
            while end < len(order) and order[end] == order[t]:
                end += 1
            if order[t] == p:
                out += aligned_blocks(t, end - t)
            t = end
        return out

    def partition_of(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is beyond the ring's {self.num_slots} slots")
        return self.slot_partitions[slot]

    def index(self, member_id: int) -> int:
        return [m.member_id for m in self.members].index(member_id)

    def upstream(self, i: int, p: int) -> tuple[int, ...]:
        """Member ids whose partial member i waits for in partition p (none where p's chain starts)."""
        r = len(self.members)
        return () if i == (p + 1) % r else (self.members[(i - 1) % r].member_id,)

    def passes_final_on(self, i: int, p: int) -> bool:
        """Whether member i passes partition p's final sum to its successor (all but the one before p)."""
        return i != (p - 1) % len(self.members)

    def chain_partitions(self, i: int, nxt):
        """Member i's ChainPartitions (``inaproto.job_entries``), one per block of every partition; ``nxt`` the
        ChainHop of its successor."""
        from inaproto.job_entries import ChainPartition

        return [ChainPartition(prefix, plen, self.upstream(i, p), i == p, (nxt,) if self.passes_final_on(i, p) else ())
                for p in range(len(self.members)) for prefix, plen in self.blocks(p)]


def ring_of(racks: Iterable[Rack]) -> Ring | None:
    """The ring, or None where Rina has nothing to do across switches (fewer than two members, no switch
    member: the plain ring; fewer slots than members: the plain ring too)."""
    racks = sorted(racks, key=lambda r: r.switch)
    used = {w for r in racks for w in r.worker_ids}
    free = [i for i in range(MAX_WORKERS - 1, -1, -1) if i not in used]
    members: list[RingMember] = []
    for rack in racks:
        local = tuple(sorted(rack.worker_ids))
        if rack.ina and rack.num_slots > 0:
            if not free:
                return None
            members.append(RingMember(free.pop(0), rack.switch, local, True))
        else:
            members += [RingMember(w, rack.switch, (w,), False) for w in local]
    switch_slots = [r.num_slots for r in racks if r.ina and r.num_slots > 0]
    if len(members) < 2 or not switch_slots:
        return None
    sizes = partition_sizes([m.is_switch for m in members], min(switch_slots))
    return None if sizes is None else Ring(tuple(members), sizes)


def host_copy_entries(ring: Ring, member_id: int, job_id: int, generation: int, worker: tuple[str, str, int],
                      next_hop: tuple[str, int], owner_epoch: int = 0):
    """(JobEntries, ChainEntries) of host member ``member_id``'s copy: its worker (mac, ip, udp_port) local on
    HOST_PORT under an id of no member, slots ``[0, ring.num_slots)``, partials and passed-on final sums to
    ``next_hop`` (ip, udp port) on NETWORK_PORT. Chain packets come in on NETWORK_PORT from INA_UDP_PORT:
    the agent's copy hands them over so (host_agent/host_member.py) and checks who sent them itself."""
    from inaproto.job_entries import ChainHop, ChainLink, WorkerAddress, chain_entries, job_entries

    i, r = ring.index(member_id), len(ring.members)
    local = min(set(range(MAX_WORKERS)) - {m.member_id for m in ring.members})
    mac, ip, udp = worker
    own = job_entries(job_id, [WorkerAddress(local, HOST_PORT, mac or 0, ip, udp)], base_slot=0,
                      num_slots=ring.num_slots, generation=generation, owner_epoch=owner_epoch)
    nxt = ChainHop(ring.members[(i + 1) % r].member_id, NETWORK_PORT, 0, next_hop[0], next_hop[1])
    parts = ring.chain_partitions(i, nxt)
    link = ChainLink(NETWORK_PORT, INA_UDP_PORT)
    pred = ring.members[(i - 1) % r].member_id
    return own, chain_entries(own, member_id, nxt, parts, {pred: link, member_id: link})
