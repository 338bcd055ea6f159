"""BMv2's replication order (p4src/v1model.py): one node per replica id in libstdc++'s hash-table order, each
node's ports ascending; a modified group keeps its nodes in place and appends the new ones.

The expected orders were printed by a C++ program (g++ 12, libstdc++) that fills a
``std::unordered_map<uint32_t, int>`` with ``m[id]`` in the given order and iterates it, as PI's ``PreMcMgr``
does; tests/packet/test_replication.py checks the small cases against simple_switch_grpc itself.
"""
from __future__ import annotations

import pytest

from p4src.v1model import replication_order

SHUFFLED = [9, 23, 14, 10, 27, 1, 5, 3, 21, 22, 13, 12, 28, 16, 26, 6, 30, 8, 24, 0, 25, 2, 29, 20, 15, 19, 11, 4, 17,
            18, 7]
WIDE = [8392, 20892, 5608, 39487, 4064, 35314, 61964, 50804, 55959, 51768, 58277, 17583, 47909, 12773, 4703, 17821,
        64865, 28440, 33814, 57168, 39456, 55200, 50576, 45994, 53421, 30459, 44140, 3756, 36658, 21377, 42780, 13641,
        27672, 35007, 37349, 16309, 8317, 63176, 63374, 11602]


@pytest.mark.parametrize("ids, expected", [
    ([0, 1, 2, 3], [3, 2, 1, 0]),
    ([0, 13, 26, 1], [1, 26, 13, 0]),
    (list(range(16)), [15, 14, 13, *range(13)]),
    (SHUFFLED, [7, 18, 28, 12, 13, 21, 3, 5, 1, 30, 27, 14, 10, 23, 22, 9, 16, 26, 6, 8, 24, 0, 29, 25, 2, 20, 15, 19,
                11, 4, 17]),
    (WIDE, [11602, 63176, 8317, 35007, 13641, 58277, 39456, 16309, 51768, 53421, 42780, 50804, 4064, 37349, 28440,
            35314, 64865, 39487, 55959, 61964, 8392, 20892, 27672, 47909, 17583, 57168, 30459, 12773, 55200, 4703,
            5608, 17821, 3756, 33814, 50576, 45994, 63374, 44140, 21377, 36658]),
], ids=["four", "one-bucket", "rehash-29", "rehash-59", "wide-ids"])
def test_nodes_in_libstdcxx_hash_order(ids, expected):
    assert [rid for _, rid in replication_order([(1, rid) for rid in ids])] == expected


def test_a_nodes_ports_ascending_and_a_repeated_id_one_node():
    replicas = [(5, 2), (3, 1), (9, 2), (1, 2)]  # id 2 on ports 5, 9, 1; id 1 on port 3
    assert replication_order(replicas) == ((3, 1), (1, 2), (5, 2), (9, 2))


def test_a_modified_group_keeps_its_nodes_and_appends_new_ones_in_the_new_lists_order():
    before = replication_order([(4, rid) for rid in (0, 1, 2, 3)])
    assert [rid for _, rid in before] == [3, 2, 1, 0]
    after = replication_order([(4, 3), (4, 5), (4, 1), (4, 6), (7, 1)], before)
    assert after == ((4, 3), (4, 1), (7, 1), (4, 6), (4, 5))  # 3 and 1 where they were (1 gains port 7); 6, 5 new
