"""Placement policies: which racks a job's workers go to. Pluggable through a name registry.

A placement returns ``[(rack, workers), ...]`` or None when the job cannot start now. It reads the
cluster through a :class:`RackView` and never changes it. All three policies always succeed when the
cluster has enough free workers in total (jobs may span racks), and all are deterministic: ties go to
the lower rack index. The view keeps the racks indexed by free workers, so a placement looks at the
racks it may take, not at every rack of the cluster.
"""
from __future__ import annotations

import abc
import bisect
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
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


class RackView:
    """What a placement may look at: per rack its free workers, whether its ToR is INA-capable, the slots of its
    pool held by nobody (0 for plain switches) and the jobs registered for slots there (lists indexed by rack);
    the spine's free slots (0 when the spine does not aggregate); and the racks indexed by free workers.

    The simulator owns it and changes it only through :meth:`take_workers`, :meth:`set_free_slots` and
    :meth:`add_slot_job`, which keep the index current: per number of free workers (one or more), the plain racks
    and the INA racks in index order, and the INA racks also by (slot users, most free slots first, index)."""

    def __init__(self, free_workers: Sequence[int], ina: Sequence[bool], free_slots: Sequence[int],
                 slot_jobs: Sequence[int], spine_free_slots: int = 0) -> None:
        self.free_workers = list(free_workers)
        self.ina = tuple(ina)
        self.free_slots = list(free_slots)
        self.slot_jobs = list(slot_jobs)
        self.spine_free_slots = spine_free_slots
        self.free_total = sum(self.free_workers)
        self.most = max(self.free_workers, default=0)  # no rack ever has more free workers than at the start
        self._plain: list[list[int]] = [[] for _ in range(self.most + 1)]  # by free workers: plain racks
        self._ina: list[list[int]] = [[] for _ in range(self.most + 1)]  # by free workers: INA racks
        self._by_slots: list[list[tuple[int, int, int]]] = [[] for _ in range(self.most + 1)]  # (users, -free slots, rack)
        for rack in range(len(self.free_workers)):
            self._index(rack)

    @property
    def racks(self) -> int:
        return len(self.free_workers)

    # --- changes (the simulator's) ------------------------------------------------------------------------
    def take_workers(self, rack: int, workers: int) -> None:
        """`workers` of `rack` start a job (negative: they are released)."""
        self._unindex(rack)
        self.free_workers[rack] -= workers
        self.free_total -= workers
        self._index(rack)

    def set_free_slots(self, rack: int, slots: int) -> None:
        if self.free_slots[rack] != slots:
            self._unindex(rack)
            self.free_slots[rack] = slots
            self._index(rack)

    def add_slot_job(self, rack: int, change: int) -> None:
        self._unindex(rack)
        self.slot_jobs[rack] += change
        self._index(rack)

    # A rack without free workers is in no index: no placement asks for one, and in a busy cluster most racks are full.
    def _index(self, rack: int) -> None:
        free = self.free_workers[rack]
        if not free:
            return
        if self.ina[rack]:
            bisect.insort(self._ina[free], rack)
            bisect.insort(self._by_slots[free], (self.slot_jobs[rack], -self.free_slots[rack], rack))
        else:
            bisect.insort(self._plain[free], rack)

    def _unindex(self, rack: int) -> None:
        free = self.free_workers[rack]
        if not free:
            return
        if self.ina[rack]:
            _remove(self._ina[free], rack)
            _remove(self._by_slots[free], (self.slot_jobs[rack], -self.free_slots[rack], rack))
        else:
            _remove(self._plain[free], rack)

    # --- queries (the placements') ------------------------------------------------------------------------
    def best_fit(self, workers: int, *, ina: bool | None = None) -> int | None:
        """The rack (plain or INA only, or either with None) that fits `workers` with the fewest free workers
        left, the lowest index among equals; None if no rack fits."""
        for free in range(max(workers, 1), self.most + 1):
            plain = self._plain[free] if ina is not True else []
            capable = self._ina[free] if ina is not False else []
            if plain or capable:
                return min(plain[:1] + capable[:1])
        return None

    def most_free_first(self, *, ina: bool | None = None, least: int = 1) -> Iterator[int]:
        """Racks with at least `least` free workers (plain or INA only, or either with None), the most free
        first, then by index."""
        for free in range(self.most, max(least, 1) - 1, -1):
            plain = self._plain[free] if ina is not True else []
            capable = self._ina[free] if ina is not False else []
            yield from heapq.merge(plain, capable) if plain and capable else (plain or capable)

    def ina_by_slots(self, free: int) -> list[tuple[int, int, int]]:
        """The INA racks with `free` free workers as (slot users, -free slots, rack), in that order."""
        return self._by_slots[free]


def _remove(items: list, item: object) -> None:
    del items[bisect.bisect_left(items, item)]


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


def _greedy(workers: int, view: RackView, racks: Iterable[int]) -> Placement | None:
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


@_register
class PackPlacement(PlacementPolicy):
    """Fewest racks: one rack if any fits (best fit, to keep big holes for big jobs), else the racks
    with the most free workers first. Why: keeps traffic under one ToR (INA or intra-rack ring)."""

    name = "pack"

    def place(self, workers: int, view: RackView, slots: int = 0) -> Placement | None:
        if workers > view.free_total:
            return None
        single = view.best_fit(workers)
        if single is not None:
            return [(single, workers)]
        return _greedy(workers, view, view.most_free_first())


@_register
class SpreadPlacement(PlacementPolicy):
    """Most racks: one worker per rack, racks with the most free workers first, wrapping around if the
    job has more workers than there are racks with free workers. Why: the fault-tolerance/thermal
    baseline schedulers use, and the worst case for INA (no ToR sees more than a worker or two)."""

    name = "spread"

    def place(self, workers: int, view: RackView, slots: int = 0) -> Placement | None:
        if workers > view.free_total:
            return None
        free = view.free_workers
        counts: dict[int, int] = {}
        order = list(view.most_free_first())
        left = workers
        while left:
            for rack in order:
                if left and free[rack] > counts.get(rack, 0):
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
        if workers > view.free_total:
            return None
        if slots == 0:
            single = view.best_fit(workers, ina=False)
            return [(single, workers)] if single is not None else PackPlacement().place(workers, view)
        if workers <= view.most:
            single = self._one_rack(workers, view, slots)
            if single is not None:
                return [(single, workers)]
        roomy = self._spanning(view, slots, roomy=True)
        spanning = _greedy(workers, view, itertools.chain(roomy, self._spanning(view, slots, roomy=False)))
        return spanning if spanning is not None else PackPlacement().place(workers, view)

    @staticmethod
    def _one_rack(workers: int, view: RackView, slots: int) -> int | None:
        """The INA rack for a job that fits one: among those with >= `slots` free slots (else among all), the
        fewest free workers, then the fewest slot users, the most free slots, the lowest index."""
        for free in range(workers, view.most + 1):
            ranked = view.ina_by_slots(free)
            for _, minus_free_slots, rack in _group_heads(ranked):
                if -minus_free_slots >= slots:  # the first of its group (most free slots) has enough: the best
                    return rack
        first = next((view.ina_by_slots(f) for f in range(workers, view.most + 1) if view.ina_by_slots(f)), None)
        return None if first is None else first[0][2]

    @staticmethod
    def _spanning(view: RackView, slots: int, *, roomy: bool) -> Iterator[int]:
        """INA racks with >= 2 free workers and with (`roomy`) or without >= `slots` free slots: the most free
        workers first, then the fewest slot users, then index."""
        for free in range(view.most, 1, -1):
            ranked = view.ina_by_slots(free)
            for users, _, _ in _group_heads(ranked):
                group = ranked[bisect.bisect_left(ranked, (users,)):bisect.bisect_left(ranked, (users + 1,))]
                cut = bisect.bisect_right(group, (users, -slots, len(view.free_workers)))  # free slots >= slots
                yield from sorted(rack for _, _, rack in (group[:cut] if roomy else group[cut:]))


def _group_heads(ranked: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, int]]:
    """The first entry of each run of equal slot users in `ranked` (sorted): the one with the most free slots."""
    at = 0
    while at < len(ranked):
        yield ranked[at]
        at = bisect.bisect_left(ranked, (ranked[at][0] + 1,), at)
