"""How big each partition of Rina's ring is: sizes chosen from the framed cost of every hop.

In the ring (``inaproto.rina_ring``) hop i -> i+1 carries every partition's partial but member i's own
(where i's chain ends) and every final sum but member i+1's (whose chain starts there): 2T - s_i - s_{i+1}
over both phases, for partition sizes s (shares of the tensor T). A hop into or out of a switch member carries
INA frames (128 of 184 bytes payload); a hop between two host members carries runs of payloads under one
header (``RUN_PAYLOADS`` per datagram, ``inaproto.rina_runs``: 0.932 payload, about a TCP ring's). With every member a switch, every hop costs the
same and the partitions are equal; with host members the sizes minimise the busiest hop's framed bytes, which
gives the members next to INA-frame hops (a switch member and its neighbours) larger partitions.
docs/experiments.md, "What Rina at 50 % costs, and why".
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from inaproto import wire
from inaproto.rina_runs import RUN_SHARE

__all__ = ["BUNDLE_SHARE", "INA_SHARE", "aligned_blocks", "continuous_shares", "hop_loads", "hop_share",
           "partition_sizes", "slot_partitions"]

INA_SHARE = wire.INA_DATA_LEN / wire.INA_FRAME_LEN  # 0.696
BUNDLE_SHARE = RUN_SHARE  # 0.932
_MAX_UNITS = 128  # partition sizes are multiples of a power-of-two unit of slots: fewer than 2 x this many units


def hop_share(from_switch: bool, to_switch: bool) -> float:
    """Payload share of a hop's frames: INA frames wherever a switch member sends or receives, bundles else."""
    return INA_SHARE if from_switch or to_switch else BUNDLE_SHARE


def hop_loads(kinds: Sequence[bool], sizes: Sequence[int]) -> tuple[float, ...]:
    """Framed bytes of every hop i -> i+1 per all-reduce, in units of the tensor (``kinds[i]``: member i is a
    switch; ``sizes[i]``: slots of partition i, the share of the tensor it carries)."""
    total, r = sum(sizes), len(sizes)
    return tuple((2 * total - sizes[i] - sizes[(i + 1) % r]) / total / hop_share(kinds[i], kinds[(i + 1) % r])
                 for i in range(r))


def _smallest(kinds: tuple[bool, ...], units: int, bound: float) -> list[int] | None:
    """Partition sizes in units (each >= 1) with every hop's framed load at most ``bound`` (in units of the
    tensor), or None if none fits in ``units``. Tries every size of partition 0 and takes each next size as
    small as its hop allows (a larger one frees at most as much on the next hop as it costs)."""
    r = len(kinds)
    need = [2 * units - bound * units * hop_share(kinds[i], kinds[(i + 1) % r]) for i in range(r)]
    best: list[int] | None = None
    for s0 in range(1, units + 1):
        sizes = [s0]
        for i in range(r - 1):
            sizes.append(max(1, _ceil(need[i] - sizes[i])))
        sizes[-1] = max(sizes[-1], _ceil(need[r - 1] - s0))  # closing the ring (a larger size only helps hop r-2)
        if sum(sizes) <= units and (best is None or sum(sizes) < sum(best)):
            best = sizes
    return best


def _ceil(x: float) -> int:
    n = int(x)
    return n + 1 if x - n > 1e-9 else n


@lru_cache(maxsize=256)
def _sizes_in_units(kinds: tuple[bool, ...], units: int) -> tuple[int, ...]:
    lo, hi = 0.0, 4.0 / INA_SHARE  # no hop carries more than 2T
    best = _smallest(kinds, units, hi)
    for _ in range(40):
        mid = (lo + hi) / 2
        got = _smallest(kinds, units, mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    sizes = list(best)
    for _ in range(units - sum(sizes)):  # spare units: each to an end of the busiest hop
        loads = _unit_loads(kinds, sizes, units)
        i = max(range(len(sizes)), key=lambda k: (loads[k], -k))
        j = (i + 1) % len(sizes)
        sizes[max((i, j), key=lambda k: (loads[k] if k == j else loads[(i - 1) % len(sizes)], -sizes[k]))] += 1
    return tuple(sizes)


def _unit_loads(kinds: Sequence[bool], sizes: Sequence[int], units: int) -> list[float]:
    r = len(sizes)
    return [(2 * units - sizes[i] - sizes[(i + 1) % r]) / hop_share(kinds[i], kinds[(i + 1) % r]) for i in range(r)]


def partition_sizes(kinds: Sequence[bool], slots: int) -> tuple[int, ...] | None:
    """Slots per partition, in ring order, for members ``kinds`` (True: a switch member) sharing ``slots``.

    Every member a switch: equal partitions of ``2^k`` slots (the largest that fits ``slots`` R times), as
    before. With host members: sizes that minimise the busiest hop's framed load, in units of a power-of-two
    number of slots (fewer than 256 units), every partition at least one unit. None: fewer slots than members."""
    kinds, r = tuple(bool(k) for k in kinds), len(kinds)
    if r == 0 or slots < r:
        return None
    if all(kinds):
        per = slots // r
        return (1 << (per.bit_length() - 1),) * r
    unit = 1
    while slots // (unit * 2) >= max(_MAX_UNITS, r):
        unit *= 2
    return tuple(s * unit for s in _sizes_in_units(kinds, slots // unit))


_GRID = 4096  # continuous shares: partition 0's share tried on this grid of [0, 1]


@lru_cache(maxsize=64)
def continuous_shares(kinds: tuple[bool, ...]) -> tuple[float, ...]:
    """The shares of the tensor (summing to 1) that minimise the busiest hop's framed load when sizes need not
    be whole slots: the limit ``partition_sizes`` approaches as the range grows (its ideal for the table in
    docs/experiments.md). A bisection on the bound; for a candidate bound every share of partition 0 on a grid
    is tried at once (numpy), each next share as small as its hop allows (``_smallest`` in real numbers)."""
    kinds, r = tuple(bool(k) for k in kinds), len(kinds)
    if r == 0:
        return ()
    if all(kinds):
        return (1 / r,) * r
    s0 = np.linspace(0.0, 1.0, _GRID + 1)

    def fit(bound: float) -> np.ndarray | None:
        need = [2 - bound * hop_share(kinds[i], kinds[(i + 1) % r]) for i in range(r)]
        sizes = [s0]
        for i in range(r - 1):
            sizes.append(np.maximum(0.0, need[i] - sizes[i]))
        sizes[-1] = np.maximum(sizes[-1], need[r - 1] - s0)
        total = np.sum(sizes, axis=0)
        k = int(np.argmin(total))
        return None if total[k] > 1 + 1e-12 else np.array([s[k] for s in sizes])

    lo, hi = 0.0, 2.0 / INA_SHARE
    best = fit(hi)
    for _ in range(50):
        mid = (lo + hi) / 2
        got = fit(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    best[0] += max(0.0, 1 - best.sum())  # spare to partition 0: a larger share only lowers its hops
    return tuple(float(x) for x in best / best.sum())


def aligned_blocks(start: int, size: int) -> list[tuple[int, int]]:
    """Slots ``[start, start + size)`` as (prefix, prefix_len) blocks of the 16-bit slot index (LPM entries)."""
    out = []
    while size > 0:
        step = start & -start if start else 1 << 16
        while step > size:
            step >>= 1
        out.append((start, 16 - (step.bit_length() - 1)))
        start, size = start + step, size - step
    return out


def slot_partitions(sizes: Sequence[int]) -> tuple[int, ...]:
    """The partition of every slot. Equal partitions: contiguous blocks (partition p is slots ``[p n, (p + 1) n)``,
    one LPM entry each). Unequal ones: interleaved in proportion to their sizes (each next slot to the partition
    furthest behind its share), so that the few consecutive chunks a worker has in flight (chunk i takes slot
    i mod S) spread over every chain instead of queueing on the largest partition's."""
    if len(set(sizes)) == 1:
        return tuple(p for p, n in enumerate(sizes) for _ in range(n))
    total, given, out = sum(sizes), [0] * len(sizes), []
    for t in range(total):
        p = max(range(len(sizes)), key=lambda k: (sizes[k] * (t + 1) / total - given[k], -k))
        given[p] += 1
        out.append(p)
    return tuple(out)
