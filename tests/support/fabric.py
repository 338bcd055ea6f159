"""Switches linked by the test (chains across switches, docs/switch.md "Chains"): the links between their
ports, each switch's job and chain entries, and the check that every worker got exactly its results.

The test carries the frames between the switches' linked ports, so the same cases run on the model, on
ina-switch and on BMv2 (tests/packet/test_chains.py, test_trees.py, test_loss_signals.py).
"""
from __future__ import annotations

import numpy as np

from inaproto import wire
from inaproto.job_entries import ChainHop, ChainLink, ChainPartition, WorkerAddress, chain_entries, job_entries
from inaproto.scapy_layer import INA
from tests.support.frames import Worker, dissect

__all__ = ["CHAIN_JOB", "L9", "L10", "MEMBER", "NUM_SLOTS", "Fabric", "check_results", "hop", "install_member",
           "two_switches"]

CHAIN_JOB = 5
NUM_SLOTS = 4
MEMBER = 20  # switch s is member MEMBER + s in the job's worker-id space
L9, L10 = ChainLink(9), ChainLink(10)  # a switch's chain packets on port 9 / 10, from INA_UDP_PORT


def hop(switch: int, port: int) -> ChainHop:
    """Switch ``switch`` as its neighbour sees it, reached out of the neighbour's ``port``."""
    return ChainHop(MEMBER + switch, port, f"02:00:00:00:ee:{switch + 1:02x}", f"10.0.254.{switch + 1}", wire.INA_UDP_PORT)


def install_member(target, workers: list[Worker], member: int, next_hop, partitions, sources: dict[int, ChainLink],
             base: int = 0) -> None:
    """Job ``CHAIN_JOB``'s entries for ``workers`` and its chain entries as member ``member``; ``sources``: member id -> the link its chain packets come in on (the ingress binding's bind_link)."""
    job = job_entries(CHAIN_JOB, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in workers],
                      base_slot=base, num_slots=NUM_SLOTS, generation=0)
    job.insert_into(target)
    chain_entries(job, member, next_hop, partitions, sources).insert_into(target)


class Fabric:
    """Switches and the links between their ports; ``run`` delivers frames until the fabric is quiet."""

    def __init__(self, switches: list, links: dict[tuple[int, int], tuple[int, int]]) -> None:
        self.switches = switches
        self.links = dict(links)
        self.links.update({b: a for a, b in links.items()})
        self.carried: list[tuple[int, int, bytes]] = []  # (switch, port, frame) sent over a link

    def send(self, switch: int, port: int, frame: bytes) -> None:
        self.switches[switch].send(port, frame)

    def run(self, drop=lambda switch, port, frame: False) -> dict[tuple[int, int], list]:
        """Every frame that left towards a worker, as {(switch, port): [dissected]}; ``drop`` loses link frames."""
        delivered: dict[tuple[int, int], list] = {}
        busy = set(range(len(self.switches)))
        while busy:
            outputs = [(s, self.switches[s].receive()) for s in sorted(busy)]
            busy = set()
            for s, out in outputs:
                for port, frame in out:
                    peer = self.links.get((s, port))
                    if peer is None:
                        delivered.setdefault((s, port), []).append(dissect(frame))
                        continue
                    self.carried.append((s, port, frame))
                    if drop(s, port, frame):
                        continue
                    self.switches[peer[0]].send(peer[1], frame)
                    busy.add(peer[0])
        return delivered


def check_results(delivered, workers_at: dict[int, list[Worker]], expected: dict[int, np.ndarray], seq_of: dict[int, int],
           flags: int = 0) -> None:
    """Every worker got exactly one result per slot in ``expected``, exact, addressed to it."""
    for s, workers in workers_at.items():
        for w in workers:
            got = delivered.get((s, w.port), [])
            by_slot = {}
            for pkt in got:
                ina = pkt[INA]
                assert ina.msg_type == wire.MsgType.RESULT
                assert ina.worker_id == w.wid and pkt.dst == w.mac and pkt["UDP"].dport == w.udp_port
                assert ina.slot not in by_slot, f"two results for slot {ina.slot} at worker {w.wid}"
                by_slot[ina.slot] = pkt
            assert sorted(by_slot) == sorted(expected), f"worker {w.wid} on switch {s}: slots {sorted(by_slot)}"
            for slot, pkt in by_slot.items():
                assert pkt[INA].seq == seq_of[slot]
                assert int(pkt[INA].flags) == flags
                assert pkt[INA].lanes == [int(v) for v in expected[slot]]
    extra = set(delivered) - {(s, w.port) for s, ws in workers_at.items() for w in ws}
    assert not extra, f"frames to ports without workers: {sorted(extra)}"


def two_switches(switches):
    """S0 (workers 0, 1) sends its partial out of port 9 to S1 (workers 2, 3), which ends the chain and sends the
    final sum back to S0: a one-level tree, or Rina's ring of two racks for one partition."""
    s0, s1 = switches(2)
    w0 = [Worker(0, 1), Worker(1, 2)]
    w1 = [Worker(2, 1), Worker(3, 2)]
    install_member(s0, w0, MEMBER, hop(1, 9), [ChainPartition(0, 0, (), False)], {MEMBER: L9})
    install_member(s1, w1, MEMBER + 1, None, [ChainPartition(0, 0, (MEMBER,), True, (hop(0, 9),))], {MEMBER: L9})
    return Fabric([s0, s1], {(0, 9): (1, 9)}), {0: w0, 1: w1}
