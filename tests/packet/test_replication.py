"""Several copies of one result to one egress port (workers sharing a host): they leave in BMv2's order.

BMv2 1.15.5 makes a group's copies node by node, one node per replica id, in the order PI attached the nodes
(p4src/v1model.py says why that is libstdc++'s hash-table order of the ids). The orders below were read from
simple_switch_grpc itself; every target must give them, port by port (copies to different ports leave on
different threads of BMv2: no order between ports is promised, and none is asserted).
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from inaproto.scapy_layer import INA
from tests.support.frames import dissect, gradient, make_workers

JOB = 9


@dataclass(frozen=True)
class Sender:
    """A worker of the job: its id, switch port, and its host's MAC and IPv4 address with its own UDP port."""

    wid: int
    port: int
    mac: str
    ip: str
    udp_port: int

    @property
    def address(self) -> WorkerAddress:
        return WorkerAddress(self.wid, self.port, self.mac, self.ip, self.udp_port)


def _workers_on(ports: dict[int, int]) -> list[Sender]:
    """Worker ``wid`` on switch port ``ports[wid]``; workers of one port share its host's MAC and IPv4 address."""
    hosts = {p: make_workers(p)[p - 1] for p in set(ports.values())}
    return [Sender(wid, port, hosts[port].mac, hosts[port].ip, 45000 + wid) for wid, port in ports.items()]


def _install(target, workers: list[Sender]):
    entries = job_entries(JOB, [w.address for w in workers], base_slot=0, num_slots=2, generation=0)
    entries.insert_into(target)
    return entries.group.group_id


def _round(target, workers: list[Sender], slot: int = 0) -> dict[int, list[int]]:
    """Every worker's gradient into ``slot``; the result copies as {port: [recipient worker id, ...]} in the order
    they left that port (each one checked to be its recipient's)."""
    for w in workers:
        target.send(w.port, gradient(w, JOB, slot=slot, lanes=[w.wid] * wire.LANES, seq=slot + 1))
    by_id = {w.wid: w for w in workers}
    expected = sum(by_id)
    order: dict[int, list[int]] = {}
    for port, frame in target.receive(expect=len(workers)):
        pkt = dissect(frame)
        wid = pkt[INA].worker_id
        assert pkt[INA].lanes == [expected] * wire.LANES and pkt["UDP"].dport == by_id[wid].udp_port
        assert port == by_id[wid].port
        order.setdefault(port, []).append(wid)
    return order


@pytest.mark.parametrize("ports, expected", [
    ({0: 4, 1: 4, 2: 4, 3: 4}, {4: [3, 2, 1, 0]}),  # distinct buckets: the latest id first
    ({0: 4, 13: 4, 26: 4, 1: 4}, {4: [1, 26, 13, 0]}),  # 0, 13 and 26 share a bucket (13 buckets)
    ({i: 4 for i in range(16)}, {4: [15, 14, 13, *range(13)]}),  # the 14th id grows the table to 29 buckets
    ({0: 4, 1: 4, 2: 4, 3: 5, 4: 5, 5: 5}, {4: [2, 1, 0], 5: [5, 4, 3]}),  # two ports, each in its own order
], ids=["four", "one-bucket", "rehash", "two-ports"])
def test_copies_to_one_port_leave_in_bmv2s_order(target, ports, expected):
    workers = _workers_on(ports)
    _install(target, workers)
    assert _round(target, workers) == expected
    assert target.read_counter("MyEgress.ina_results", JOB) == len(workers)


def test_a_modified_group_keeps_its_copies_in_place_and_appends_new_ones(target):
    """MODIFY of a group: the ids it keeps stay where they were, new ids follow in the new list's hash order."""
    workers = _workers_on({i: 4 for i in range(7)})
    group = _install(target, workers)
    target.set_multicast_group(group, [(4, 0), (4, 1), (4, 2), (4, 3)])
    assert _round(target, workers, slot=0) == {4: [3, 2, 1, 0]}
    target.set_multicast_group(group, [(4, 3), (4, 5), (4, 1), (4, 6)])
    assert _round(target, workers, slot=1) == {4: [3, 1, 6, 5]}
