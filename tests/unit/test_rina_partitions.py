"""inaproto/rina_partitions.py: partition sizes of Rina's ring from the hops' framed costs."""
from __future__ import annotations

import itertools

import pytest

from inaproto.rina_partitions import (
    BUNDLE_SHARE,
    INA_SHARE,
    aligned_blocks,
    continuous_shares,
    hop_loads,
    hop_share,
    partition_sizes,
    slot_partitions,
)


def _brute_force(kinds: tuple[bool, ...], slots: int) -> float:
    """The smallest busiest-hop load over every split of ``slots`` into partitions of at least one slot."""
    return min(max(hop_loads(kinds, c)) for c in itertools.product(range(1, slots + 1), repeat=len(kinds))
               if sum(c) == slots)


def test_hop_loads_follow_the_chains():
    """Hop i -> i+1 carries every partial but member i's own partition's and every final sum but member
    i+1's: 2T - s_i - s_{i+1}, over its frames' payload share."""
    assert hop_share(True, False) == hop_share(False, True) == hop_share(True, True) == INA_SHARE
    assert hop_share(False, False) == BUNDLE_SHARE and 0.93 < BUNDLE_SHARE < 0.94 and 0.69 < INA_SHARE < 0.70
    assert hop_loads((True, False, False), (4, 2, 2)) == pytest.approx(
        ((16 - 6) / 8 / INA_SHARE, (16 - 4) / 8 / BUNDLE_SHARE, (16 - 6) / 8 / INA_SHARE))


@pytest.mark.parametrize("r,slots", [(2, 8), (3, 8), (4, 16), (5, 64)])
def test_every_member_a_switch_gives_equal_power_of_two_partitions(r, slots):
    sizes = partition_sizes((True,) * r, slots)
    assert len(set(sizes)) == 1 and sizes[0] & (sizes[0] - 1) == 0 and sizes[0] * r <= slots < sizes[0] * 2 * r
    assert hop_loads((True,) * r, sizes) == pytest.approx([2 * (r - 1) / r / INA_SHARE] * r)


@pytest.mark.parametrize("kinds,slots", [
    ((True, False, False, False, False), 8),  # 2 x 4, 50 % INA racks
    ((True, False, False), 8),
    ((False, True, False, False), 9),
    ((True, False, False, True, False, False), 8),  # 4 x 2, 50 %
    ((True, False, True, False, False), 7),
])
def test_host_members_sizes_minimise_the_busiest_hop(kinds, slots):
    sizes = partition_sizes(kinds, slots)
    assert sum(sizes) == slots and min(sizes) >= 1
    assert max(hop_loads(kinds, sizes)) == pytest.approx(_brute_force(kinds, slots))


def test_the_switch_member_of_a_mixed_ring_gets_the_largest_partition():
    """2 x 4 with one INA rack: the switch member sits between the two INA-frame hops; framed busiest hop 1.98
    (runs between host members) against 2.30 with equal partitions of 5 of the 8 slots."""
    kinds = (True, False, False, False, False)
    assert partition_sizes(kinds, 8) == (4, 1, 1, 1, 1)
    assert max(hop_loads(kinds, (4, 1, 1, 1, 1))) == pytest.approx((2 - 5 / 8) / INA_SHARE)  # the switch hops now
    assert max(hop_loads(kinds, (1,) * 5)) == pytest.approx(1.6 / INA_SHARE)
    assert partition_sizes(kinds, 33) == (18, 4, 3, 4, 4)  # the controller's grant at 2 x 4, 2 Mbit/s


@pytest.mark.parametrize("kinds", [
    (True, False, False, False, False),  # 2 x 4, 50 % INA racks
    (True, False, False, True, False, False),  # 4 x 2, 50 %
    (True, False, False),
    (False, True, False, True),
])
def test_continuous_shares_are_the_limit_of_whole_slots(kinds):
    """Continuous shares: the busiest hop of the linear programme min B s.t. hop_i <= B, sum s = 1, s >= 0 (solved
    here by scipy), never above any whole-slot split, and whole slots approach it as the range grows."""
    from scipy.optimize import linprog

    r = len(kinds)
    shares = continuous_shares(kinds)
    assert sum(shares) == pytest.approx(1) and min(shares) >= 0
    busiest = max(hop_loads(kinds, shares))
    # variables s_0..s_{r-1}, B: (2 - s_i - s_{i+1}) / e_i <= B
    a_ub = [[-(k in (i, (i + 1) % r)) / hop_share(kinds[i], kinds[(i + 1) % r]) for k in range(r)] + [-1]
            for i in range(r)]
    b_ub = [-2 / hop_share(kinds[i], kinds[(i + 1) % r]) for i in range(r)]
    lp = linprog([0] * r + [1], A_ub=a_ub, b_ub=b_ub, A_eq=[[1] * r + [0]], b_eq=[1], bounds=[(0, None)] * (r + 1))
    assert lp.status == 0 and busiest == pytest.approx(lp.fun, abs=1e-3)
    for slots in (8, 9, 12):
        assert _brute_force(kinds, slots) >= busiest - 1e-9
    assert max(hop_loads(kinds, partition_sizes(kinds, 256))) == pytest.approx(busiest, rel=0.01)


def test_large_ranges_are_sized_in_units_and_too_few_slots_give_none():
    kinds = (True, False, False, False, False)
    sizes = partition_sizes(kinds, 1000)
    assert sum(sizes) <= 1000 and all(s % 4 == 0 for s in sizes) and sizes[0] == max(sizes)
    assert partition_sizes(kinds, 4) is None and partition_sizes((True, False), 1) is None


@pytest.mark.parametrize("start,size", [(0, 8), (4, 1), (5, 6), (3, 13), (0, 65536), (1, 1)])
def test_aligned_blocks_cover_the_range_exactly(start, size):
    blocks = aligned_blocks(start, size)
    covered = []
    for prefix, plen in blocks:
        n = 1 << (16 - plen)
        assert prefix % n == 0
        covered += range(prefix, prefix + n)
    assert covered == list(range(start, start + size))


def test_equal_partitions_are_blocks_and_unequal_ones_interleave():
    assert slot_partitions((4, 4)) == (0, 0, 0, 0, 1, 1, 1, 1)
    order = slot_partitions((4, 1, 1, 1, 1))
    assert order == (0, 1, 0, 2, 3, 0, 4, 0)
    for sizes in [(4, 1, 1, 1, 1), (9, 7, 1, 7), (3, 2, 2)]:
        order = slot_partitions(sizes)
        assert [order.count(p) for p in range(len(sizes))] == list(sizes)
        # every window of consecutive slots holds each partition within one slot of its share
        for w in range(1, len(order) + 1):
            for p, n in enumerate(sizes):
                assert abs(order[:w].count(p) - n * w / sum(sizes)) < 1 + 1e-9
