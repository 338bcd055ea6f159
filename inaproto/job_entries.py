"""A job's switch entries: the one mapping from a job to its ``ina_job`` / ``ina_binding`` / ``ina_worker``
entries and multicast group.

p4src/ina.p4 learns a job from four things the control plane writes (docs/controller.md, "What the controller writes"):
``MyIngress.ina_job`` (``set_job``: the job's slot range, worker bitmap, worker count, multicast group,
generation and owner epoch), one ``MyIngress.ina_binding`` entry per worker (``bind_member``: the switch port,
source MAC, IPv4 address and UDP port its packets must come from), one ``MyEgress.ina_worker`` entry per
worker (``set_worker_addr``: where its results go), and the job's multicast group (one replica per worker:
switch port, rid = worker id). The controller, the test doubles, the demo and the benches all build them with
:func:`job_entries`, so the layout is written once.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from inaproto.wire import INA_UDP_PORT, MAX_JOBS

__all__ = ["GENERATIONS", "MCAST_OFFSET", "BindingEntry", "ChainEntries", "ChainEntry", "ChainHop", "ChainLink",
           "ChainPartition", "JobEntries", "JobEntry", "JobGroup", "LinkBindingEntry", "TransitEntry", "WorkerAddress",
           "WorkerEntry", "chain_entries", "job_entries", "job_group", "split_generation"]

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
class LinkBindingEntry:
    """``MyIngress.ina_binding``: (job_id, member_id) -> ``bind_link``: a chain's switch member, bound to the
    inter-switch link its packets come in on and the UDP port they come from (INA_UDP_PORT for a P4 switch),
    or to a second such pair (``next_*``: under a switch's own member id, its next hop answering a resent
    partial). Its source MAC and IPv4 address are not fixed: a switch sends a partial or a final sum from the
    address the packet that completed it was sent to, and a transit switch rewrites the MAC (docs/security.md,
    "Data plane: ingress binding")."""

    table: ClassVar[str] = "MyIngress.ina_binding"
    action: ClassVar[str] = "MyIngress.bind_link"

    job_id: int
    member_id: int
    port: int
    udp_port: int
    next_port: int
    next_udp_port: int

    @property
    def match(self) -> tuple[int, int]:
        return (self.job_id, self.member_id)

    @property
    def params(self) -> tuple[int, int, int, int]:
        return (self.port, self.udp_port, self.next_port, self.next_udp_port)


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


# --- Chains (Rina, aggregation trees): docs/switch.md, "Chains" --------------------------------------------------


def next_group(job_id: int) -> int:
    """The group with one replica towards a switch's next hop in the job's chains (rid = its member id)."""
    return job_id + MCAST_OFFSET + MAX_JOBS


def final_group(job_id: int) -> int:
    """The group for a final sum that goes beyond the switch's own workers: its workers plus those hops."""
    return job_id + MCAST_OFFSET + 2 * MAX_JOBS


@dataclass(frozen=True)
class ChainHop:
    """A member a switch sends to (a switch or a host ring member): its member id and address from this switch."""

    member_id: int
    port: int
    mac: str | bytes | int
    ip: str | bytes | int
    udp_port: int


@dataclass(frozen=True)
class ChainLink:
    """Where a member's chain packets reach this switch: the ingress port of the link and their UDP source port."""

    port: int
    udp_port: int = INA_UDP_PORT


@dataclass(frozen=True)
class ChainPartition:
    """This switch's place in the chain of one partition of the job's slots ``slot_prefix/prefix_len`` (bit<16>)."""

    slot_prefix: int
    prefix_len: int
    upstream: tuple[int, ...]  # member ids whose partial sums the copy waits for besides the local workers
    chain_end: bool  # the copy's completion is the final sum
    final_to: tuple[ChainHop, ...] = ()  # members beyond this switch that get the final sum from it


@dataclass(frozen=True)
class ChainEntry:
    """``MyIngress.ina_chain``: (job_id, slot lpm) -> ``set_chain``."""

    table: ClassVar[str] = "MyIngress.ina_chain"
    action: ClassVar[str] = "MyIngress.set_chain"

    job_id: int
    slot_prefix: int
    prefix_len: int
    member_id: int
    upstream_mask: int
    num_upstream: int
    chain_end: int
    next_grp: int
    final_grp: int

    @property
    def match(self) -> tuple[int, tuple[int, int]]:
        return (self.job_id, (self.slot_prefix, self.prefix_len))

    @property
    def params(self) -> tuple[int, int, int, int, int, int]:
        return (self.member_id, self.upstream_mask, self.num_upstream, self.chain_end, self.next_grp, self.final_grp)


@dataclass(frozen=True)
class TransitEntry:
    """``MyIngress.ina_transit``: a job whose INA packets this switch only routes."""

    table: ClassVar[str] = "MyIngress.ina_transit"
    action: ClassVar[str] = "MyIngress.transit"

    job_id: int

    @property
    def match(self) -> tuple[int]:
        return (self.job_id,)

    @property
    def params(self) -> tuple[()]:
        return ()


@dataclass(frozen=True)
class ChainEntries:
    """What one switch holds for its place in a job's chains, besides its JobEntries."""

    chains: tuple[ChainEntry, ...]
    workers: tuple[WorkerEntry, ...]  # where partials (rid = own member id) and passed-on results go
    groups: tuple[JobGroup, ...]
    bindings: tuple[LinkBindingEntry, ...] = ()  # the links upstream partials and final sums come in on

    @property
    def table_entries(self) -> tuple[ChainEntry | LinkBindingEntry | WorkerEntry, ...]:
        """Every table entry, in a valid write order (the chain entries last: they make the chain live)."""
        return (*self.bindings, *self.workers, *self.chains)

    def insert_into(self, target: Any) -> None:
        """Insert everything into ``target`` after the job's own entries (see JobEntries.insert_into)."""
        for g in self.groups:
            target.set_multicast_group(g.group_id, list(g.replicas))
        for e in self.table_entries:
            target.insert_entry(e.table, e.match, e.action, e.params)


def chain_entries(job: JobEntries, member_id: int, next_hop: ChainHop | None,
                  partitions: Iterable[ChainPartition], sources: Mapping[int, ChainLink]) -> ChainEntries:
    """The chain entries of a switch holding ``job`` (its local workers) as member ``member_id``.

    ``sources`` maps every member id this switch receives chain packets under to the link they come in on:
    each upstream member (its partials) and, where some partition does not end here, ``member_id`` itself (the
    final sums passed on to this switch carry the recipient's id; the next hop's answers to a resent partial
    do too, so that id is bound to ``next_hop``'s link as well). Each becomes a :class:`LinkBindingEntry`; a
    member id without a link is an error, since the binding would drop its packets.

    Partials go to ``next_hop`` (none where every partition ends here); a partition's final sum goes to the
    local workers and its ``final_to`` hops. A switch passes final sums on to at most one set of hops (its ring
    successor in Rina, its children at a tree's root), so it needs at most two groups besides the job's.
    """
    job_id = job.job.job_id
    partitions = tuple(partitions)
    hops = {frozenset(p.final_to) for p in partitions if p.final_to}
    if len(hops) > 1:
        raise ValueError(f"job {job_id}: member {member_id} passes final sums to more than one set of hops")
    local = {w.worker_id for w in job.workers}
    addresses: dict[int, ChainHop] = {}
    groups: list[JobGroup] = []
    if next_hop is not None:
        addresses[member_id] = next_hop
        groups.append(JobGroup(next_group(job_id), ((next_hop.port, member_id),)))
    final_to = tuple(sorted(next(iter(hops)), key=lambda h: h.member_id)) if hops else ()
    for h in final_to:
        addresses[h.member_id] = h
    if final_to:
        groups.append(JobGroup(final_group(job_id), job.group.replicas + tuple((h.port, h.member_id) for h in final_to)))
    if local & set(addresses):
        raise ValueError(f"job {job_id}: member ids {sorted(local & set(addresses))} are also local worker ids")
    chains = []
    for p in partitions:
        if not p.chain_end and next_hop is None:
            raise ValueError(f"job {job_id}: partition {p.slot_prefix}/{p.prefix_len} goes on but there is no next hop")
        mask = sum(1 << m for m in p.upstream)
        chains.append(ChainEntry(job_id, p.slot_prefix, p.prefix_len, member_id, mask, len(p.upstream), int(p.chain_end),
                                 next_group(job_id) if next_hop is not None else 0,
                                 final_group(job_id) if p.final_to else job.group.group_id))
    workers = tuple(WorkerEntry(job_id, rid, _mac(h.mac), int(ipaddress.IPv4Address(h.ip)), h.udp_port)
                    for rid, h in sorted(addresses.items()))
    incoming = {m for p in partitions for m in p.upstream}
    if any(not p.chain_end for p in partitions):  # final sums passed on to this switch
        incoming.add(member_id)
    missing = sorted(incoming - set(sources))
    if missing:
        raise ValueError(f"job {job_id}: member {member_id} receives chain packets from member ids {missing} "
                         "but has no link for them (sources)")
    bindings = []
    for m in sorted(incoming):
        link = sources[m]
        again = ChainLink(next_hop.port, next_hop.udp_port) if m == member_id and next_hop is not None else link
        bindings.append(LinkBindingEntry(job_id, m, link.port, link.udp_port, again.port, again.udp_port))
    return ChainEntries(tuple(chains), workers, tuple(groups), tuple(bindings))
