"""A job's switch entries: the one mapping from a job to its ``ina_job`` / ``ina_binding`` / ``ina_worker``
entries and multicast group.

p4src/ina.p4 learns a job from four things the control plane writes (docs/protocol.md, "Control plane"):
``MyIngress.ina_job`` (``set_job``: the job's slot range, worker bitmap, worker count, multicast group,
generation and owner epoch), one ``MyIngress.ina_binding`` entry per worker (``bind_member``: the switch port,
source MAC, IPv4 address and UDP port its packets must come from), one ``MyEgress.ina_worker`` entry per
worker (``set_worker_addr``: where its results go), and the job's multicast group (one replica per worker:
switch port, rid = worker id). The controller, the test doubles, the demo and the benches all build them with
:func:`job_entries`, so the layout is written once.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

__all__ = ["GENERATIONS", "MCAST_OFFSET", "BindingEntry", "JobEntries", "JobEntry", "JobGroup", "WorkerAddress",
           "WorkerEntry", "job_entries", "job_group", "split_generation"]

MCAST_OFFSET = 1  # a job's multicast group on every switch: job_id + MCAST_OFFSET (group 0 is not a group)
GENERATIONS = 0xFFFF  # wire generations cycle 1..65535 (bit<16>; 0 is never handed out)


def split_generation(serial: int) -> tuple[int, int]:
    """A controller's generation serial (1, 2, ... never reused) as (wire generation 1..65535, owner epoch).

    Packets carry the 16-bit generation; the owner epoch (how often it wrapped) goes only into ``set_job``, so
    that a slot's owner tag (epoch ++ job ++ generation) never repeats although the wire generation does.
    """
    if serial < 1:  # a job not yet given a generation
        return 0, 0
    epoch, rest = divmod(serial - 1, GENERATIONS)
    return rest + 1, epoch


def job_group(job_id: int) -> int:
    """The multicast group id of a job (the same on every switch)."""
    return job_id + MCAST_OFFSET


@dataclass(frozen=True)
class WorkerAddress:
    """One worker as a switch sees it: its switch port and where its results go (mac: "aa:bb:.."/bytes/int)."""

    worker_id: int
    port: int
    mac: str | bytes | int
    ip: str | bytes | int
    udp_port: int


@dataclass(frozen=True)
class JobEntry:
    """``MyIngress.ina_job``: job_id -> ``set_job``."""

    table: ClassVar[str] = "MyIngress.ina_job"
    action: ClassVar[str] = "MyIngress.set_job"

    job_id: int
    base_slot: int
    num_slots: int
    worker_mask: int
    num_workers: int
    mcast_grp: int
    generation: int
    owner_epoch: int = 0

    @property
    def match(self) -> tuple[int]:
        return (self.job_id,)

    @property
    def params(self) -> tuple[int, int, int, int, int, int, int]:
        return (self.base_slot, self.num_slots, self.worker_mask, self.num_workers, self.mcast_grp, self.generation,
                self.owner_epoch)


@dataclass(frozen=True)
class BindingEntry:
    """``MyIngress.ina_binding``: (job_id, member_id) -> ``bind_member``: where that member's packets must come
    from. A worker's member id is its worker id (0..31); ids 32..255 are free for other members of a job
    (a switch contributing its subtree's partial sums is bound the same way, by its own member id)."""

    table: ClassVar[str] = "MyIngress.ina_binding"
    action: ClassVar[str] = "MyIngress.bind_member"

    job_id: int
    member_id: int
    port: int
    mac: int
    ip: int
    udp_port: int

    @property
    def match(self) -> tuple[int, int]:
        return (self.job_id, self.member_id)

    @property
    def params(self) -> tuple[int, int, int, int]:
        return (self.port, self.mac, self.ip, self.udp_port)


@dataclass(frozen=True)
class WorkerEntry:
    """``MyEgress.ina_worker``: (job_id, worker_id) -> ``set_worker_addr``."""

    table: ClassVar[str] = "MyEgress.ina_worker"
    action: ClassVar[str] = "MyEgress.set_worker_addr"

    job_id: int
    worker_id: int
    mac: int
    ip: int
    udp_port: int

    @property
    def match(self) -> tuple[int, int]:
        return (self.job_id, self.worker_id)

    @property
    def params(self) -> tuple[int, int, int]:
        return (self.mac, self.ip, self.udp_port)


@dataclass(frozen=True)
class JobGroup:
    """The job's multicast group: one replica (switch port, rid = worker id) per worker."""

    group_id: int
    replicas: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class JobEntries:
    """Everything one switch holds for one job."""

    job: JobEntry
    workers: tuple[WorkerEntry, ...]
    group: JobGroup
    bindings: tuple[BindingEntry, ...] = ()

    @property
    def table_entries(self) -> tuple[JobEntry | BindingEntry | WorkerEntry, ...]:
        """Every table entry, in a valid write order (the job entry last: the job is live once all else is)."""
        return (*self.bindings, *self.workers, self.job)

    def insert_into(self, target: Any) -> None:
        """Insert everything into a fresh ``target`` that has ``insert_entry(table, match, action, params)`` and
        ``set_multicast_group(group, replicas)`` (the pipeline model, the test P4Runtime client, test targets)."""
        target.insert_entry(self.job.table, self.job.match, self.job.action, self.job.params)
        target.set_multicast_group(self.group.group_id, list(self.group.replicas))
        for e in (*self.bindings, *self.workers):
            target.insert_entry(e.table, e.match, e.action, e.params)


def _mac(mac: str | bytes | int) -> int:
    if isinstance(mac, int):
        return mac
    if isinstance(mac, bytes):
        return int.from_bytes(mac, "big")
    return int(mac.replace(":", ""), 16)


def job_entries(job_id: int, workers: Iterable[WorkerAddress], *, base_slot: int, num_slots: int, generation: int,
                mcast_grp: int | None = None, owner_epoch: int = 0) -> JobEntries:
    """The entries and group of ``job_id`` on a switch where ``workers`` sit and it holds slots
    ``[base_slot, base_slot + num_slots)`` (``num_slots`` 0: none) under ``generation`` (bit<16>) and
    ``owner_epoch`` (see :func:`split_generation`). Every worker is bound to its port and addresses."""
    workers = tuple(workers)
    grp = job_group(job_id) if mcast_grp is None else mcast_grp
    return JobEntries(
        job=JobEntry(job_id, base_slot, num_slots, sum(1 << w.worker_id for w in workers), len(workers), grp,
                     generation & 0xFFFF, owner_epoch),
        workers=tuple(WorkerEntry(job_id, w.worker_id, _mac(w.mac), int(ipaddress.IPv4Address(w.ip)), w.udp_port)
                      for w in workers),
        group=JobGroup(grp, tuple((w.port, w.worker_id) for w in workers)),
        bindings=tuple(BindingEntry(job_id, w.worker_id, w.port, _mac(w.mac), int(ipaddress.IPv4Address(w.ip)), w.udp_port)
                       for w in workers),
    )
