"""A job's switch entries: the one mapping from a job to its ``ina_job`` / ``ina_worker`` entries and multicast group.

p4src/ina.p4 learns a job from three things the control plane writes (docs/protocol.md, "Control plane"):
``MyIngress.ina_job`` (``set_job``: the job's slot range, worker bitmap, worker count, multicast group and
generation), one ``MyEgress.ina_worker`` entry per worker (``set_worker_addr``: where its results go), and
the job's multicast group (one replica per worker: switch port, rid = worker id). The controller, the test
doubles, the demo and the benches all build them with :func:`job_entries`, so the layout is written once.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

__all__ = ["MCAST_OFFSET", "JobEntries", "JobEntry", "JobGroup", "WorkerAddress", "WorkerEntry", "job_entries",
           "job_group"]

MCAST_OFFSET = 1  # a job's multicast group on every switch: job_id + MCAST_OFFSET (group 0 is not a group)


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

    @property
    def match(self) -> tuple[int]:
        return (self.job_id,)

    @property
    def params(self) -> tuple[int, int, int, int, int, int]:
        return (self.base_slot, self.num_slots, self.worker_mask, self.num_workers, self.mcast_grp, self.generation)


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

    def insert_into(self, target: Any) -> None:
        """Insert everything into a fresh ``target`` that has ``insert_entry(table, match, action, params)`` and
        ``set_multicast_group(group, replicas)`` (the pipeline model, the test P4Runtime client, test targets)."""
        target.insert_entry(self.job.table, self.job.match, self.job.action, self.job.params)
        target.set_multicast_group(self.group.group_id, list(self.group.replicas))
        for e in self.workers:
            target.insert_entry(e.table, e.match, e.action, e.params)


def _mac(mac: str | bytes | int) -> int:
    if isinstance(mac, int):
        return mac
    if isinstance(mac, bytes):
        return int.from_bytes(mac, "big")
    return int(mac.replace(":", ""), 16)


def job_entries(job_id: int, workers: Iterable[WorkerAddress], *, base_slot: int, num_slots: int, generation: int,
                mcast_grp: int | None = None) -> JobEntries:
    """The entries and group of ``job_id`` on a switch where ``workers`` sit and it holds slots
    ``[base_slot, base_slot + num_slots)`` (``num_slots`` 0: none) under ``generation`` (bit<16>)."""
    workers = tuple(workers)
    grp = job_group(job_id) if mcast_grp is None else mcast_grp
    return JobEntries(
        job=JobEntry(job_id, base_slot, num_slots, sum(1 << w.worker_id for w in workers), len(workers), grp,
                     generation & 0xFFFF),
        workers=tuple(WorkerEntry(job_id, w.worker_id, _mac(w.mac), int(ipaddress.IPv4Address(w.ip)), w.udp_port)
                      for w in workers),
        group=JobGroup(grp, tuple((w.port, w.worker_id) for w in workers)),
    )
