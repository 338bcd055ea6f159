"""Rina's ring decided from what a grant says: the one rule the controller and the agents both apply.

Members are the racks whose switch runs INA and holds slots for the job (one member each, with the rack's
workers local to it) and every worker of any other rack (a host member), in switch-name order, a rack's
workers by id. A switch member's id is free in the job's worker-id space, taken from 31 down; a host
member's is its worker id. The slots are cut into as many partitions as there are members, each ``2^k``
slots (the largest power of two that fits the smallest rack's range R times), so a partition is a prefix of
the slot index. Partition p's chain starts after member p and ends at member p. docs/switch.md, "Chains".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["Rack", "RingMember", "Ring", "ring_of", "MAX_WORKERS"]

MAX_WORKERS = 32  # wire.MAX_WORKERS: the worker-id space (bitmap width)


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
    partition_slots: int  # 2^k; partition p is slots [p * 2^k, (p + 1) * 2^k)

    @property
    def prefix_len(self) -> int:
        return 16 - (self.partition_slots.bit_length() - 1)

    @property
    def num_slots(self) -> int:
        """The slots the job uses on every switch member: one block per partition."""
        return self.partition_slots * len(self.members)

    def index(self, member_id: int) -> int:
        return [m.member_id for m in self.members].index(member_id)

    def upstream(self, i: int, p: int) -> tuple[int, ...]:
        """Member ids whose partial member i waits for in partition p (none where p's chain starts)."""
        r = len(self.members)
        return () if i == (p + 1) % r else (self.members[(i - 1) % r].member_id,)

    def passes_final_on(self, i: int, p: int) -> bool:
        """Whether member i passes partition p's final sum to its successor (all but the one before p)."""
        return i != (p - 1) % len(self.members)


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
    per = min(switch_slots) // len(members)
    if per == 0:
        return None
    return Ring(tuple(members), 1 << (per.bit_length() - 1))
