"""Placement policies: which racks a job's workers go to. Pluggable through a name registry.

A placement returns ``[(rack, workers), ...]`` or None when the job cannot start now. It reads the
cluster through a :class:`RackView` and never changes it. All three policies always succeed when the
cluster has enough free workers in total (jobs may span racks), and all are deterministic: ties go to
the lower rack index.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "PLACEMENTS",
    "InaAwarePlacement",
    "PackPlacement",
    "Placement",
    "PlacementPolicy",
    "RackView",
    "SpreadPlacement",
    "make_placement",
]

Placement = list[tuple[int, int]]


@dataclass
class RackView:
    """What a placement may look at; the simulator owns it and keeps it current (lists indexed by rack)."""

    free_workers: list[int]
    ina: tuple[bool, ...]  # rack's ToR is INA-capable
    free_slots: list[int]  # slots of the rack's pool held by nobody (0 for plain switches)
    slot_jobs: list[int]  # jobs registered for slots at the rack's switch
    spine_free_slots: int = 0  # slots of the spine's pool held by nobody (0 when the spine does not aggregate)

    @property
    def racks(self) -> int:
        return len(self.free_workers)


class PlacementPolicy(abc.ABC):
    """Chooses racks for a job's workers."""

    name: ClassVar[str]

    @abc.abstractmethod
    def place(self, workers: int, view: RackView, slots: int = 0) -> Placement | None:
        """Racks and worker counts for a job of `workers` workers, or None if it cannot start now.

        `slots` is what the job would ask each switch for (0 = it would not aggregate in-network, e.g.
        one worker, or too few workers for INA to beat ring); placements may ignore it.
        """


PLACEMENTS: dict[str, type[PlacementPolicy]] = {}


def _register(cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
    PLACEMENTS[cls.name] = cls
    return cls


def make_placement(name: str) -> PlacementPolicy:
    try:
        return PLACEMENTS[name]()
    except KeyError:
        raise ValueError(f"unknown placement {name!r}; valid placements: {', '.join(sorted(PLACEMENTS))}") from None


def _greedy(workers: int, view: RackView, racks: list[int]) -> Placement | None:
    """Fill `racks` in the given order, as many workers per rack as are free, until the job is placed."""
    out, left = [], workers
    for rack in racks:
        take = min(left, view.free_workers[rack])
        if take > 0:
            out.append((rack, take))
            left -= take
            if left == 0:
                return out
    return None


def _best_single(workers: int, view: RackView, racks: list[int]) -> int | None:
    """The rack among `racks` that fits the whole job with the fewest free workers left (best fit)."""
    fits = [r for r in racks if view.free_workers[r] >= workers]
    return min(fits, key=lambda r: (view.free_workers[r], r)) if fits else None


@_register
class PackPlacement(PlacementPolicy):
    """Fewest racks: one rack if any fits (best fit, to keep big holes for big jobs), else the racks
    with the most free workers first. Why: keeps traffic under one ToR (INA or intra-rack ring)."""

    name = "pack"

    def place(self, workers: int, view: RackView, slots: int = 0) -> Placement | None:
        if workers > sum(view.free_workers):
            return None
        all_racks = list(range(view.racks))
        single = _best_single(workers, view, all_racks)
        if single is not None:
            return [(single, workers)]
        return _greedy(workers, view, sorted(all_racks, key=lambda r: (-view.free_workers[r], r)))


@_register
class SpreadPlacement(PlacementPolicy):
    """Most racks: one worker per rack, racks with the most free workers first, wrapping around if the
    job has more workers than there are racks with free workers. Why: the fault-tolerance/thermal
    baseline schedulers use, and the worst case for INA (no ToR sees more than a worker or two)."""

    name = "spread"

    def place(self, workers: int, view: RackView, slots: int = 0) -> Placement | None:
        if workers > sum(view.free_workers):
            return None
        free = list(view.free_workers)
        counts: dict[int, int] = {}
        order = sorted(range(view.racks), key=lambda r: (-free[r], r))
        left = workers
        while left:
            for rack in order:
                if left and free[rack] > 0:
                    free[rack] -= 1
                    counts[rack] = counts.get(rack, 0) + 1
                    left -= 1
        return sorted(counts.items())


@_register
class InaAwarePlacement(PlacementPolicy):
    """Prefer racks whose ToR can aggregate for the job: INA-capable with enough free slots.

    1. A job that will not aggregate (slots == 0) goes to one plain rack if one fits (best fit),
       keeping INA racks' workers for jobs that can use them; else it is packed.
    2. One INA rack that fits the whole job: racks with >= `slots` free slots first, then best fit on
       workers (as pack: keeps whole racks free for big jobs), then fewer slot users, more free slots.
    3. Else INA racks with >= 2 free workers (so each ToR has something to aggregate), racks with
       enough free slots first, then the fullest (fewest racks: Rina's ring among r racks moves
       2(r-1)/r of the data).
    4. Else pack.
    Why: a job's backend depends on where it lands; placing for INA is the NetPack/INAlloc question.
    """

    name = "ina-aware"

    def place(self, workers: int, view: RackView, slots: int = 0) -> Placement | None:
        if workers > sum(view.free_workers):
            return None
        racks = range(view.racks)
        if slots == 0:
            single = _best_single(workers, view, [r for r in racks if not view.ina[r]])
            return [(single, workers)] if single is not None else PackPlacement().place(workers, view)
        ina = [r for r in racks if view.ina[r]]
        fits = [r for r in ina if view.free_workers[r] >= workers]
        if fits:
            best = min(
                fits,
                key=lambda r: (view.free_slots[r] < slots, view.free_workers[r], view.slot_jobs[r], -view.free_slots[r], r),
            )
            return [(best, workers)]
        useful = sorted(
            (r for r in ina if view.free_workers[r] >= 2),
            key=lambda r: (view.free_slots[r] < slots, -view.free_workers[r], view.slot_jobs[r], r),
        )
        spanning = _greedy(workers, view, useful)
        return spanning if spanning is not None else PackPlacement().place(workers, view)
