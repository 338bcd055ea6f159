"""Targets for the packet-level suite: frames in at a port, frames out at ports, control by P4Info names.

The same tests run against the in-process model (``model``), the ``ina-switch`` process and BMv2
(tests/packet/conftest.py); a target only has to offer the few methods of ``Target``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import raw

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from inaproto.scapy_layer import INA
from softswitch.pipeline import InaPipeline

SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"


class Target(Protocol):
    def insert_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None: ...
    def modify_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None: ...
    def set_multicast_group(self, group: int, replicas: list[tuple[int, int]]) -> None: ...
    def read_counter(self, name: str, index: int) -> int: ...
    def send(self, port: int, frame: bytes) -> None: ...
    def receive(self, expect: int | None = None, timeout: float = 2.0) -> list[tuple[int, bytes]]: ...
    def close(self) -> None: ...


class ModelTarget:
    """The executable model in this process: outputs are available as soon as send() returns."""

    ports = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

    def __init__(self) -> None:
        self.pipeline = InaPipeline()
        self._pending: list[tuple[int, bytes]] = []

    def insert_entry(self, table, match, action, params=()):
        self.pipeline.insert_entry(table, match, action, params)

    def modify_entry(self, table, match, action, params=()):
        self.pipeline.modify_entry(table, match, action, params)

    def set_multicast_group(self, group, replicas):
        self.pipeline.set_multicast_group(group, replicas)

    def read_counter(self, name, index):
        return self.pipeline.counter(name)[index]

    def send(self, port, frame):
        self._pending += self.pipeline.process(port, frame)

    def receive(self, expect=None, timeout=2.0):
        out, self._pending = self._pending, []
        return out

    def register_snapshot(self):
        return self.pipeline.register_snapshot()

    def close(self):
        pass


@dataclass(frozen=True)
class Worker:
    wid: int
    port: int

    @property
    def mac(self) -> str:
        return f"02:00:00:00:{self.wid // 256:02x}:{self.wid % 256 + 1:02x}"

    @property
    def ip(self) -> str:
        return f"10.0.{1 + self.wid // 200}.{self.wid % 200 + 1}"

    @property
    def udp_port(self) -> int:
        return 40000 + self.wid


def make_workers(k: int, first_port: int = 1) -> list[Worker]:
    return [Worker(wid=i, port=first_port + i) for i in range(k)]


def install_job(
    target: Target, job_id: int, workers: list[Worker], base: int, num_slots: int, generation: int = 0, mcast_grp: int | None = None
) -> int:
    """The table entries and multicast group the controller writes for one job; returns the group id."""
    entries = job_entries(job_id, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in workers],
                          base_slot=base, num_slots=num_slots, generation=generation, mcast_grp=mcast_grp)
    entries.insert_into(target)
    return entries.group.group_id


def gradient(
    worker: Worker,
    job_id: int,
    slot: int,
    lanes,
    *,
    seq: int = 0,
    shadow: int = 0,
    generation: int = 0,
    msg_type: int = wire.MsgType.GRADIENT,
    flags: int = 0,
    reserved: int = 0,
) -> bytes:
    """A worker's INA frame to the switch, built with scapy."""
    return raw(
        Ether(src=worker.mac, dst=SWITCH_MAC)
        / IP(src=worker.ip, dst=SWITCH_IP)
        / UDP(sport=worker.udp_port, dport=wire.INA_UDP_PORT)
        / INA(
            msg_type=msg_type, flags=flags, job_id=job_id, generation=generation, slot=slot, seq=seq,
            worker_id=worker.wid, reserved=reserved, shadow=shadow, lanes=[int(v) for v in lanes],
        )
    )


def dissect(frame: bytes) -> Ether:
    return Ether(frame)


def register_state(target: Target):
    """The target's registers, where it can show them (the model can; BMv2 through P4Runtime is not read here)."""
    snap = getattr(target, "register_snapshot", None)
    return snap() if snap else None


def assert_same_registers(before, after) -> None:
    """Malformed, foreign and query frames must leave every register as it was."""
    if before is None:
        return
    *scalars_before, lanes_before = before
    *scalars_after, lanes_after = after
    assert scalars_before == scalars_after
    assert (lanes_before == lanes_after).all()

