"""What BMv2's ``simple_switch_grpc`` (v1model) does around ``ina.p4``, where the program's behaviour shows it.

- ``DROP_PORT``: the egress port ``mark_to_drop`` sets (BMv2's default drop port).
- ``P4RUNTIME_PORT``: the TCP port ``simple_switch_grpc`` serves P4Runtime on.
- ``replication_order``: the order in which the packet replication engine (PRE) makes a multicast group's
  copies. Copies to one egress port leave in that order (each port is one FIFO queue in BMv2's traffic
  manager, served by one egress thread); copies to different ports leave on different threads, in no
  promised order.

How BMv2 1.15.5 orders a group's copies (src/bm_sim/simple_pre.cpp, ``McSimplePre::replicate``; the
P4Runtime side is PI's ``PreMcMgr``, proto/frontend/src/pre_mc_mgr.cpp): PI makes one PRE node per replica id
(``instance``) holding that id's ports, and attaches the nodes to the group one after the other; the PRE
replicates node by node in the order they were attached, and within a node port by port, lowest first.
PI keeps a group's nodes in a ``std::unordered_map`` keyed by replica id, filled replica by replica, and
attaches them in that map's iteration order: with GCC's libstdc++ (the build here), a hash table whose
hash of an integer is the integer, whose bucket count grows 13, 29, 59, 127, ... as it fills, and whose
iteration order is a singly linked list (``_unordered_map_order`` below). A group that is modified keeps the
nodes of the ids it still has where they were (their ports updated in place), appends the nodes of new ids
in the new map's order, and drops the rest.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["DROP_PORT", "P4RUNTIME_PORT", "replication_order"]

DROP_PORT = 511
P4RUNTIME_PORT = 9559

# libstdc++'s bucket counts for an unordered_map filled one key at a time (_Prime_rehash_policy: 13 buckets at
# the first insertion, then the next listed prime at or above twice the count whenever the elements would
# outnumber the buckets). Replica ids are 16 bits: 65,536 distinct ids at most.
_BUCKET_COUNTS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229)


def _unordered_map_order(keys: Iterable[int]) -> list[int]:
    """The iteration order of a libstdc++ ``std::unordered_map<uint32_t, T>`` after ``m[key]`` for each key.

    The map is one singly linked list of its nodes; a bucket's nodes are consecutive in it. A new key goes
    first in its bucket's run, or at the front of the list if its bucket is empty; a rehash walks the list and
    puts each node in the same way into the new buckets (which reverses the order of runs).
    """
    chain: list[int] = []
    seen: set[int] = set()
    buckets, grown = 1, 0
    for key in keys:
        if key in seen:
            continue
        seen.add(key)
        if len(chain) + 1 > (buckets if grown else 0):
            buckets = _BUCKET_COUNTS[grown]
            grown += 1
            old, chain = chain, []
            for k in old:
                _insert(chain, k, buckets)
        _insert(chain, key, buckets)
    return chain


def _insert(chain: list[int], key: int, buckets: int) -> None:
    """``_M_insert_bucket_begin``: first in the run of its bucket, or at the front when the bucket is empty."""
    b = key % buckets
    for i, k in enumerate(chain):
        if k % buckets == b:
            chain.insert(i, key)
            return
    chain.insert(0, key)


def replication_order(replicas: Sequence[tuple[int, int]],
                      before: Sequence[tuple[int, int]] | None = None) -> tuple[tuple[int, int], ...]:
    """A multicast group's ``(port, rid)`` replicas in the order BMv2 makes the copies (module docstring).

    ``replicas`` as a P4Runtime write lists them; ``before``: the group's replicas in this order before a
    modification (None: a new group).
    """
    ports: dict[int, set[int]] = {}
    for port, rid in replicas:
        ports.setdefault(rid, set()).add(port)
    nodes = _unordered_map_order(rid for _, rid in replicas)
    if before is not None:
        kept = [rid for rid in dict.fromkeys(rid for _, rid in before) if rid in ports]
        nodes = kept + [rid for rid in nodes if rid not in kept]
    return tuple((port, rid) for rid in nodes for port in sorted(ports[rid]))
