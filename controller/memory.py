"""Switch memory: one pool of aggregator slots per switch, shared by jobs through an allocation policy.

Pure functions over plain values (no I/O): :func:`allocate_pools` runs the policy once per switch pool and
checks its answer; :func:`memory_view` describes a pool's occupancy (free space, fragmentation).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.policies import AllocationPolicy, JobDemand, SlotRange, validate_allocation

__all__ = ["MemoryView", "allocate_pools", "memory_view"]


def allocate_pools(
    policy: AllocationPolicy,
    pools: Mapping[str, int],
    demands: Mapping[str, Sequence[JobDemand]],
    current: Mapping[str, Mapping[int, SlotRange]],
) -> dict[str, dict[int, SlotRange | None]]:
    """The policy's allocation of every switch pool: switch -> job -> range (None: no slots there).

    `demands[switch]` lists the jobs with workers under that switch, in admission order. The answer is
    validated (contiguous, inside the pool, no overlap, within each job's min..requested) before the
    controller writes any of it to a switch.
    """
    out: dict[str, dict[int, SlotRange | None]] = {}
    for switch, pool in pools.items():
        jobs = list(demands.get(switch, ()))
        if not jobs:
            out[switch] = {}
            continue
        alloc = policy.allocate(pool, jobs, dict(current.get(switch, {})))
        validate_allocation(pool, jobs, alloc)
        out[switch] = dict(alloc)
    return out


@dataclass(frozen=True)
class MemoryView:
    pool_size: int
    used: int
    free: int
    largest_free: int
    fragmentation: float  # 1 - largest_free / free (0 when nothing is free)
    ranges: tuple[tuple[int, int, int | None], ...]  # (base, size, job id or None for a free gap), address order


def memory_view(pool_size: int, holdings: Mapping[int, SlotRange]) -> MemoryView:
    ranges: list[tuple[int, int, int | None]] = []
    cursor = 0
    for job_id, rng in sorted(holdings.items(), key=lambda kv: kv[1].base):
        if rng.base > cursor:
            ranges.append((cursor, rng.base - cursor, None))
        ranges.append((rng.base, rng.size, job_id))
        cursor = max(cursor, rng.end)
    if cursor < pool_size:
        ranges.append((cursor, pool_size - cursor, None))
    used = sum(r.size for r in holdings.values())
    gaps = [size for _, size, job in ranges if job is None]
    free = sum(gaps)
    largest = max(gaps, default=0)
    frag = 0.0 if free == 0 else 1.0 - largest / free
    return MemoryView(pool_size, used, free, largest, frag, tuple(ranges))
