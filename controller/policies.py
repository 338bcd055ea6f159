"""Slot-allocation policies: how one switch's pool of aggregator slots is shared by concurrent jobs.

This module is the single home of allocation policy logic. The controller daemon and the cluster
simulator (``simulator/``) both call these classes through :meth:`AllocationPolicy.allocate`, so a
policy added here (and registered with :func:`register_policy`) is available to both.

Every policy hands out contiguous, non-overlapping ranges inside ``[0, pool_size)``, never gives a job
more than it requested, and never gives it fewer than its ``min_slots`` (it gives ``None`` instead: the
job falls back to ring all-reduce). Policies are pure and deterministic: same inputs, same output.

What each policy does when memory runs out (the question the ATP/ESA line of work asks):

==========  ========================================================================================
policy      when the pool cannot satisfy every request
==========  ========================================================================================
equal       Static partition: each of the n admitted jobs gets at most ``pool_size // n``; a job whose
            share is below its ``min_slots`` gets None (ring). Unused shares stay idle (not lent).
first-fit   First come, first served: jobs keep what they hold. A newcomer gets the first gap that fits
            its whole request; if none does but the total free space would, ranges are compacted
            toward slot 0 (moving some jobs) to open one gap; else it gets the largest gap if that is
            >= ``min_slots``, else None. Waiting and short jobs are upgraded, in admission order, when
            departures free space.
weighted    Best effort: water-filling shares proportional to ``weight``, capped at the request, whole
            slots by largest remainder; every job whose share reaches ``min_slots`` gets a (smaller)
            range; below that, later-admitted jobs yield first and get None.
priority    Preemptive (ESA-like): jobs served in priority order (ties: admission order) with their
            full request; a higher-priority arrival takes slots from lower-priority jobs, which shrink
            to what is left (>= ``min_slots``) or drop to None.
==========  ========================================================================================

Stability: a job whose range does not change keeps the *identical* :class:`SlotRange` object, because
the controller bumps a job's generation (and resets its switch state) only when its range changes.
Sized policies (equal, weighted, priority) keep ranges of jobs whose size is unchanged, shrink ranges
in place and grow them in place when the neighbouring slots are free; only when the free space is
fragmented do they compact (slide ranges toward slot 0), which moves some jobs.
"""
from __future__ import annotations

import abc
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

__all__ = [
    "POLICIES",
    "Allocation",
    "AllocationPolicy",
    "EqualPolicy",
    "FirstFitPolicy",
    "JobDemand",
    "PriorityPolicy",
    "SizedPolicy",
    "SlotRange",
    "WeightedPolicy",
    "make_policy",
    "register_policy",
    "validate_allocation",
]


@dataclass(frozen=True)
class JobDemand:
    """What one job asks of one switch's slot pool."""

    job_id: int
    requested_slots: int  # slots the job asks for (>= 1)
    priority: int = 0  # larger = more important
    weight: float = 1.0  # share weight for the weighted policy
    min_slots: int = 1  # fewer than this is useless: the job gets None and falls back to ring

    def __post_init__(self) -> None:
        for name in ("job_id", "requested_slots", "priority", "min_slots"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"JobDemand.{name} must be an int, got {value!r}")
        if self.requested_slots < 1:
            raise ValueError(f"job {self.job_id}: requested_slots must be >= 1, got {self.requested_slots}")
        if not 1 <= self.min_slots <= self.requested_slots:
            raise ValueError(
                f"job {self.job_id}: min_slots must be in [1, requested_slots={self.requested_slots}], "
                f"got {self.min_slots}"
            )
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"job {self.job_id}: weight must be a finite number > 0, got {self.weight!r}")


@dataclass(frozen=True)
class SlotRange:
    """A contiguous run of aggregator slots ``[base, base + size)`` in one switch."""

    base: int
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.base, int) or not isinstance(self.size, int):
            raise TypeError(f"SlotRange fields must be ints, got base={self.base!r} size={self.size!r}")
        if self.base < 0 or self.size < 1:
            raise ValueError(f"SlotRange needs base >= 0 and size >= 1, got base={self.base} size={self.size}")

    @property
    def end(self) -> int:
        """One past the last slot."""
        return self.base + self.size

    def overlaps(self, other: SlotRange) -> bool:
        return self.base < other.end and other.base < self.end

    def __contains__(self, slot: object) -> bool:
        return isinstance(slot, int) and self.base <= slot < self.end


Allocation = dict[int, "SlotRange | None"]


class AllocationPolicy(abc.ABC):
    """Decides which slots of one switch each job holds; stateless, so one instance can serve many switches."""

    name: ClassVar[str]

    @abc.abstractmethod
    def allocate(
        self, pool_size: int, jobs: Sequence[JobDemand], current: Mapping[int, SlotRange]
    ) -> dict[int, SlotRange | None]:
        """Return the new allocation for every job in `jobs` (None = no slots: ring fallback).

        `jobs` is in admission order (earlier first); `current` is what each job holds now (jobs absent
        hold nothing; entries for jobs not in `jobs` are departed jobs and are ignored). Must be
        deterministic. A job whose range is unchanged keeps the identical SlotRange (the controller
        bumps a job's generation only when its range changes).
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


POLICIES: dict[str, type[AllocationPolicy]] = {}


def register_policy(cls: type[AllocationPolicy]) -> type[AllocationPolicy]:
    """Class decorator: make a policy available by name to the controller and the simulator."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a non-empty class attribute `name`")
    if name in POLICIES and POLICIES[name] is not cls:
        raise ValueError(f"allocation policy name {name!r} is already registered by {POLICIES[name].__name__}")
    POLICIES[name] = cls
    return cls


def make_policy(name: str) -> AllocationPolicy:
    """Instantiate a registered policy by name; unknown names raise ValueError listing the valid ones."""
    try:
        cls = POLICIES[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown allocation policy {name!r}; valid policies: {valid}") from None
    return cls()


def validate_allocation(
    pool_size: int, jobs: Sequence[JobDemand], allocation: Mapping[int, SlotRange | None]
) -> None:
    """Raise ValueError unless `allocation` is a legal answer for `jobs` on a pool of `pool_size` slots.

    Used by the simulator's invariant checks and available to the controller as a last line of defence
    before it writes ranges to a switch.
    """
    ids = [job.job_id for job in jobs]
    if set(allocation) != set(ids):
        raise ValueError(f"allocation covers jobs {sorted(allocation)}, expected {sorted(ids)}")
    held = []
    for job in jobs:
        rng = allocation[job.job_id]
        if rng is None:
            continue
        if rng.end > pool_size:
            raise ValueError(f"job {job.job_id}: range [{rng.base}, {rng.end}) exceeds pool of {pool_size}")
        if rng.size > job.requested_slots:
            raise ValueError(f"job {job.job_id}: holds {rng.size} slots, requested {job.requested_slots}")
        if rng.size < job.min_slots:
            raise ValueError(f"job {job.job_id}: holds {rng.size} slots, below min_slots {job.min_slots}")
        held.append((rng.base, rng.end, job.job_id))
    held.sort()
    for (_, end_a, id_a), (base_b, _, id_b) in itertools.pairwise(held):
        if base_b < end_a:
            raise ValueError(f"jobs {id_a} and {id_b} hold overlapping slots")


# ---------------------------------------------------------------------------------------------------
# Shared helpers (private): input checks, free-gap search, stable placement of decided sizes.


def _check_inputs(pool_size: int, jobs: Sequence[JobDemand]) -> None:
    if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 0:
        raise ValueError(f"pool_size must be an int >= 0, got {pool_size!r}")
    seen: set[int] = set()
    for job in jobs:
        if job.job_id in seen:
            raise ValueError(f"job {job.job_id} appears twice in the demand list")
        seen.add(job.job_id)


def _usable_current(pool_size: int, jobs: Sequence[JobDemand], current: Mapping[int, SlotRange]) -> dict[int, SlotRange]:
    """Current ranges of the listed jobs that are still legal: inside the pool, not overlapping an
    earlier-admitted job's range (first claimant wins). Anything else is treated as not held."""
    usable: dict[int, SlotRange] = {}
    taken: list[SlotRange] = []
    for job in jobs:
        rng = current.get(job.job_id)
        if rng is None or rng.end > pool_size:
            continue
        if any(rng.overlaps(other) for other in taken):
            continue
        usable[job.job_id] = rng
        taken.append(rng)
    return usable


def _gaps(pool_size: int, held: Iterable[SlotRange]) -> list[tuple[int, int]]:
    """Free gaps as (base, size), in slot order."""
    gaps = []
    cursor = 0
    for rng in sorted(held, key=lambda r: r.base):
        if rng.base > cursor:
            gaps.append((cursor, rng.base - cursor))
        cursor = max(cursor, rng.end)
    if cursor < pool_size:
        gaps.append((cursor, pool_size - cursor))
    return gaps


def _is_free(pool_size: int, held: Iterable[SlotRange], base: int, size: int) -> bool:
    end = base + size
    return end <= pool_size and all(r.end <= base or r.base >= end for r in held)


def _compact(held: dict[int, SlotRange]) -> dict[int, SlotRange]:
    """Slide every range toward slot 0, keeping their order; ranges already in place keep their object."""
    packed: dict[int, SlotRange] = {}
    cursor = 0
    for job_id, rng in sorted(held.items(), key=lambda item: item[1].base):
        packed[job_id] = rng if rng.base == cursor else SlotRange(cursor, rng.size)
        cursor += rng.size
    return packed


def _reuse(new: SlotRange | None, old: SlotRange | None) -> SlotRange | None:
    """Return `old` itself when `new` describes the same range, so unchanged jobs keep identical objects."""
    if new is not None and old is not None and new == old:
        return old
    return new


def _place(
    pool_size: int, jobs: Sequence[JobDemand], sizes: Mapping[int, int], current: Mapping[int, SlotRange]
) -> dict[int, SlotRange | None]:
    """Turn decided sizes (0 = none) into ranges, moving as few jobs as possible.

    Jobs keep their range if its size is unchanged, shrink in place, grow in place if the next slots are
    free, else take the first gap that fits; if fragmentation leaves no such gap, everything is compacted
    toward slot 0 (order kept) and the rest appended. Requires sum(sizes) <= pool_size.
    """
    total = sum(sizes.values())
    if total > pool_size:  # a sizing bug, never user input
        raise AssertionError(f"sizes sum to {total} > pool {pool_size}")
    placed: dict[int, SlotRange] = {}
    pending: list[JobDemand] = []
    for job in jobs:
        size = sizes[job.job_id]
        if size == 0:
            continue
        cur = current.get(job.job_id)
        if cur is not None and cur.size >= size:
            placed[job.job_id] = cur if cur.size == size else SlotRange(cur.base, size)
        else:
            pending.append(job)
    unplaced: list[JobDemand] = []
    for job in pending:
        size = sizes[job.job_id]
        cur = current.get(job.job_id)
        rng = None
        if cur is not None and _is_free(pool_size, placed.values(), cur.base, size):
            rng = SlotRange(cur.base, size)
        else:
            for base, gap in _gaps(pool_size, placed.values()):
                if gap >= size:
                    rng = SlotRange(base, size)
                    break
        if rng is None:
            unplaced.append(job)
        else:
            placed[job.job_id] = rng
    if unplaced:
        placed = _compact(placed)
        cursor = sum(r.size for r in placed.values())
        for job in unplaced:
            placed[job.job_id] = SlotRange(cursor, sizes[job.job_id])
            cursor += sizes[job.job_id]
    return {job.job_id: _reuse(placed.get(job.job_id), current.get(job.job_id)) for job in jobs}


# ---------------------------------------------------------------------------------------------------
# Policies.


class SizedPolicy(AllocationPolicy):
    """A policy that first decides how many slots each job gets, then places them stably.

    Subclasses implement :meth:`sizes` only; placement (keep, shrink/grow in place, compact when
    fragmented) is shared, so every sized policy has the same stability guarantees.
    """

    @abc.abstractmethod
    def sizes(self, pool_size: int, jobs: Sequence[JobDemand]) -> dict[int, int]:
        """Slots per job (0 = none); each in {0} or [min_slots, requested_slots]; sum <= pool_size."""

    def allocate(
        self, pool_size: int, jobs: Sequence[JobDemand], current: Mapping[int, SlotRange]
    ) -> dict[int, SlotRange | None]:
        _check_inputs(pool_size, jobs)
        return _place(pool_size, jobs, self.sizes(pool_size, jobs), _usable_current(pool_size, jobs, current))


@register_policy
class EqualPolicy(SizedPolicy):
    """Static equal partition: each admitted job gets min(requested, pool_size // n).

    Why: the simplest isolation baseline; a job's share depends only on how many jobs are admitted,
    never on what the others ask for. Shares a job does not use stay idle.
    """

    name = "equal"

    def sizes(self, pool_size: int, jobs: Sequence[JobDemand]) -> dict[int, int]:
        share = pool_size // len(jobs) if jobs else 0
        out = {}
        for job in jobs:
            size = min(job.requested_slots, share)
            out[job.job_id] = size if size >= job.min_slots else 0
        return out


@register_policy
class FirstFitPolicy(AllocationPolicy):
    """On-demand first fit: whoever holds slots keeps them; newcomers take what fits.

    Why: never disturbs a running job for a newcomer unless the only way to fit the newcomer's whole
    request is compaction (which moves ranges but never shrinks them). A job that cannot get its whole
    request takes the largest gap (if >= min_slots) or waits with None; waiting and short jobs are
    upgraded, in admission order, when space frees up.
    """

    name = "first-fit"

    def allocate(
        self, pool_size: int, jobs: Sequence[JobDemand], current: Mapping[int, SlotRange]
    ) -> dict[int, SlotRange | None]:
        _check_inputs(pool_size, jobs)
        usable = _usable_current(pool_size, jobs, current)
        held: dict[int, SlotRange] = {}
        for job in jobs:
            rng = usable.get(job.job_id)
            if rng is not None:  # a job that lowered its request shrinks in place
                held[job.job_id] = rng if rng.size <= job.requested_slots else SlotRange(rng.base, job.requested_slots)
        # Repeat until nothing improves: a compaction late in a pass can open room for an earlier
        # waiting job. Sizes only grow, so this terminates, and the result is a fixed point.
        while self._pass(pool_size, jobs, held):
            pass
        return {job.job_id: _reuse(held.get(job.job_id), current.get(job.job_id)) for job in jobs}

    @staticmethod
    def _pass(pool_size: int, jobs: Sequence[JobDemand], held: dict[int, SlotRange]) -> bool:
        grew = False
        for job in jobs:
            own = held.get(job.job_id)
            need = job.requested_slots
            if own is not None and own.size >= need:
                continue
            others = {k: v for k, v in held.items() if k != job.job_id}
            gaps = _gaps(pool_size, others.values())
            new = None
            if own is not None and _is_free(pool_size, others.values(), own.base, need):
                new = SlotRange(own.base, need)  # grow in place
            else:
                new = next((SlotRange(base, need) for base, size in gaps if size >= need), None)
            if new is None and sum(size for _, size in gaps) >= need:
                packed = _compact(others)
                held.update(packed)
                new = SlotRange(sum(r.size for r in packed.values()), need)
            if new is None:
                if own is not None:
                    continue  # a short job waits for its whole request rather than hopping between gaps
                base, size = max(gaps, key=lambda g: g[1], default=(0, 0))  # first of the largest
                if size < job.min_slots:
                    continue
                new = SlotRange(base, size)
            held[job.job_id] = new
            grew = True
        return grew


@register_policy
class WeightedPolicy(SizedPolicy):
    """Best-effort weighted max-min share (water-filling), whole slots by largest remainder.

    Why: uses the whole pool while sharing it in proportion to weight; a job gets a smaller range rather
    than none whenever its share reaches min_slots. When some shares fall below min_slots the
    latest-admitted such job is dropped (None) and the rest re-shared, until every remaining share fits.
    """

    name = "weighted"

    def sizes(self, pool_size: int, jobs: Sequence[JobDemand]) -> dict[int, int]:
        active = list(jobs)
        while True:
            sizes = self._water_fill(pool_size, active)
            below = [job for job in active if sizes[job.job_id] < job.min_slots]
            if not below:
                break
            active.remove(below[-1])  # later admission yields first
        out = {job.job_id: 0 for job in jobs}
        out.update(sizes)
        return out

    @staticmethod
    def _water_fill(pool_size: int, jobs: Sequence[JobDemand]) -> dict[int, int]:
        sizes: dict[int, int] = {}
        uncapped = list(jobs)
        remaining = pool_size
        # Cap jobs whose proportional share covers their whole request, then re-share the rest.
        while uncapped:
            total_weight = sum(Fraction(job.weight) for job in uncapped)
            capped = [j for j in uncapped if j.requested_slots * total_weight <= remaining * Fraction(j.weight)]
            if not capped:
                break
            for job in capped:
                sizes[job.job_id] = job.requested_slots
                remaining -= job.requested_slots
            uncapped = [j for j in uncapped if j.job_id not in sizes]
        if not uncapped:
            return sizes
        total_weight = sum(Fraction(job.weight) for job in uncapped)
        shares = [(job, remaining * Fraction(job.weight) / total_weight) for job in uncapped]
        floors = {job.job_id: math.floor(share) for job, share in shares}
        leftover = remaining - sum(floors.values())
        # Largest remainder; ties go to the earlier-admitted job (stable sort keeps admission order).
        by_remainder = sorted(range(len(shares)), key=lambda i: shares[i][1] - floors[shares[i][0].job_id], reverse=True)
        for i in by_remainder[:leftover]:
            floors[shares[i][0].job_id] += 1  # share < requested, so floor + 1 <= requested
        sizes.update(floors)
        return sizes


@register_policy
class PriorityPolicy(SizedPolicy):
    """Preemptive priority (ESA-like): serve jobs by (priority desc, admission order), each in full.

    Why: protects important jobs' aggregation throughput. The first job that does not fit gets what is
    left if that reaches its min_slots; lower jobs get what remains after it, usually None (ring).
    """

    name = "priority"

    def sizes(self, pool_size: int, jobs: Sequence[JobDemand]) -> dict[int, int]:
        order = sorted(range(len(jobs)), key=lambda i: (-jobs[i].priority, i))
        remaining = pool_size
        out = {}
        for i in order:
            job = jobs[i]
            size = min(job.requested_slots, remaining)
            if size < job.min_slots:
                size = 0
            out[job.job_id] = size
            remaining -= size
        return out
