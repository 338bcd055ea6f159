"""Switch programming: what every INA switch must hold for a set of jobs, and writing it there all-or-nothing.

A switch holds its forwarding entries (from the topology) and, per job with workers under it, the job's
entries from :func:`inaproto.job_entries.job_entries` (``ina_binding`` and ``ina_worker`` entries and multicast
group, then the ``ina_job`` entry; ``num_slots`` 0 where the job has no slots there). A worker is bound to the
switch port its topology host hangs off and the MAC, IPv4 address and UDP port of its registration. The controller computes the state
before and after a change and hands both to :class:`controller.switch.Switch`, which writes the difference.
A Rina job's ring (:func:`controller.chains.plan_rina`) adds its chain entries, groups and
transit entries (docs/switch.md, "Chains"), and binds the members a switch receives chain packets under to the
inter-switch link they come in on (``bind_link``, docs/security.md, "Data plane: ingress binding").
A tree job (``Backend.TREE``, :func:`controller.trees.plan_tree`) adds its root's job entries and every
member's chain entries.

Install protocol (:meth:`SwitchProgrammer.write`): a change is written in two passes over the switches. The
first, the fence, writes on every switch only the changed ``ina_job`` entries, which carry the new
generation: once it is done no switch processes the job's old-generation packets any more. The second writes
everything else (chains, bindings, groups). No agent knows the new generation before both passes are done on
every switch (the controller commits to its database and tells the agents only then), so no switch ever
aggregates a packet under a configuration another switch of the job does not share. A controller that dies
in between restarts from its database: reconcile puts each switch back to the stored state, and every job
whose entries had to be repaired gets a new generation, written with the same two passes.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import grpc

from controller.chains import plan_rina
from controller.errors import Refusal
from controller.p4entity import MulticastGroup, Schema, TableEntry
from controller.store import Job
from controller.switch import Switch, SwitchError, SwitchState
from controller.topology import Topology
from controller.trees import plan_tree
from inaproto import wire
from inaproto.backends import Backend
from inaproto.job_entries import (
    BindingEntry,
    ChainEntry,
    JobEntry,
    TransitEntry,
    WorkerAddress,
    WorkerEntry,
    job_entries,
    job_group,
    split_generation,
)

__all__ = ["FIRST_JOB_ID", "SwitchProgrammer"]

log = logging.getLogger("controller.core")

FIRST_JOB_ID = 1  # job ids 1..MAX_JOBS-1; 0 stays unused so that an unset job_id is never a job
T_LPM = "MyIngress.ipv4_lpm"


class SwitchProgrammer:
    """The INA switches' expected state and the writes that move them from one set of jobs to another.

    ``switches`` is the controller's own (name -> connected Switch), shared, not copied.
    """

    def __init__(self, topology: Topology, switches: Mapping[str, Switch], *, trees: bool = False) -> None:
        self.topology = topology
        self.switches = switches
        self.trees = trees  # tree jobs (Backend.TREE) are only granted with it on; their entries are written anyway
        self._forwarding: dict[str, tuple[list[TableEntry], list[MulticastGroup]]] = {}

    @property
    def ina_switches(self) -> list[str]:
        return [name for name, info in self.topology.switches.items() if info.ina]

    def load_forwarding(self, name: str, schema: Schema) -> None:
        """The topology's forwarding state of ``name``; its multicast groups must leave the job groups free."""
        self._forwarding[name] = self.topology.forwarding(name, schema)
        lo, hi = job_group(FIRST_JOB_ID), job_group(wire.MAX_JOBS - 1)
        for g in self._forwarding[name][1]:
            if lo <= g.group_id <= hi:
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"switch {name}: multicast group {g.group_id} of its runtime JSON collides with job groups {lo}..{hi}",
                )

    def tables(self, switch: str) -> list[str]:
        """Tables the controller owns on `switch`, in write order (entries may use what precedes them)."""
        tables = []
        for e in self._forwarding.get(switch, ([], []))[0]:
            if e.table not in tables and e.table not in (BindingEntry.table, WorkerEntry.table, JobEntry.table):
                tables.append(e.table)
        if self.topology.manages_forwarding and T_LPM not in tables:
            tables.insert(0, T_LPM)
        return tables + [BindingEntry.table, WorkerEntry.table, TransitEntry.table, ChainEntry.table, JobEntry.table]

    def expected(self, switch: str, jobs: Mapping[int, Job]) -> SwitchState:
        """What `switch` must hold for `jobs`: forwarding entries, then per job its entries (num_slots 0
        when the job has no slots there)."""
        entries, groups = self._forwarding.get(switch, ([], []))
        entries, groups = list(entries), list(groups)
        for job in jobs.values():
            workers = job.workers_on(switch)
            if not workers:
                continue
            rng = job.range_on(switch)
            by_id = {w.worker_id: w for w in job.request.workers}
            generation, owner_epoch = split_generation(job.generation)
            # Ingress binding: the port is the topology's (the worker's host's switch port), the addresses
            # the registration's (validated; ip and mac filled from the topology host when left empty).
            job_state = job_entries(
                job.job_id, [WorkerAddress(wid, port, by_id[wid].mac, by_id[wid].ip, by_id[wid].udp_port) for wid, port in workers],
                base_slot=rng.base if rng else 0, num_slots=rng.size if rng else 0, generation=generation,
                owner_epoch=owner_epoch,
            )
            entries += [TableEntry(e.table, e.match, e.action, e.params) for e in job_state.table_entries]
            groups.append(MulticastGroup(job_state.group.group_id, job_state.group.replicas))
        for job in jobs.values():
            if job.backend != Backend.TREE:
                continue
            plan = plan_tree(self.topology, job)
            if plan is None:
                raise ValueError(f"job {job.job_id}: granted a tree the topology does not give")
            if switch in plan.chains:
                if not job.workers_on(switch):  # the root: its job entries (no workers), the ToRs' are above
                    state = plan.states[switch]
                    entries += [TableEntry(e.table, e.match, e.action, e.params) for e in state.table_entries]
                    groups.append(MulticastGroup(state.group.group_id, state.group.replicas))
                chain = plan.chains[switch]
                entries += [TableEntry(e.table, e.match, e.action, e.params) for e in chain.table_entries]
                groups += [MulticastGroup(g.group_id, g.replicas) for g in chain.groups]
        for job in jobs.values():
            if job.backend != Backend.RINA:
                continue
            plan = plan_rina(self.topology, job)
            if plan is None:
                raise ValueError(f"job {job.job_id}: granted Rina chains the topology does not give")
            chain = plan.chains.get(switch)
            if chain is not None:
                entries += [TableEntry(e.table, e.match, e.action, e.params) for e in chain.table_entries]
                groups += [MulticastGroup(g.group_id, g.replicas) for g in chain.groups]
            transit = plan.transit.get(switch)
            if transit is not None:
                entries.append(TableEntry(transit.table, transit.match, transit.action, transit.params))
        return SwitchState.of(entries, groups)

    @staticmethod
    def fence(before: SwitchState, after: SwitchState) -> SwitchState:
        """``before`` with the ``ina_job`` entries that ``after`` changes (a new generation) already changed:
        the first pass of the install protocol (module docstring)."""
        entries = dict(before.entries)
        for key, e in after.entries.items():
            if e.table == JobEntry.table and key in entries and entries[key] != e:
                entries[key] = e
        return SwitchState(entries, dict(before.groups))

    def write(self, old: Mapping[int, Job], new: Mapping[int, Job]) -> None:
        """Bring every INA switch from `old`'s expected state to `new`'s in two passes (the fence on every
        switch, then the rest; module docstring); on failure put back what was written and raise
        UNAVAILABLE."""
        done: list[str] = []
        states = {}
        for name in self.ina_switches:
            before, after = self.expected(name, old), self.expected(name, new)
            if before.entries != after.entries or before.groups != after.groups:
                states[name] = (before, self.fence(before, after), after)
        passes = [(name, before, fenced) for name, (before, fenced, _) in states.items() if fenced != before]
        passes += [(name, fenced, after) for name, (_, fenced, after) in states.items()]
        for name, current, target in passes:
            sw = self.switches.get(name)
            try:
                if sw is None:
                    raise SwitchError(name, "write", grpc.StatusCode.UNAVAILABLE, "not connected")
                if name not in done:
                    done.append(name)
                sw.apply(current, target, self.tables(name))
            except SwitchError as exc:
                for back in done:
                    back_sw = self.switches.get(back)  # the monitor thread may have dropped a lost session meanwhile
                    if back_sw is None:
                        log.error("%s: could not put back the previous state: not connected (reconciled on reconnect)", back)
                        continue
                    try:
                        back_sw.reconcile(self.expected(back, old), self.tables(back))
                    except SwitchError as exc2:
                        log.error("%s: could not put back the previous state: %s", back, exc2)
                code = grpc.StatusCode.UNAVAILABLE
                raise Refusal(code, f"switch write failed, nothing applied: {exc}") from None

    def reconcile(self, name: str, jobs: Mapping[int, Job], switch: Switch | None = None):
        """Read back switch `name` (``switch``: one not yet connected in ``switches``) and repair its
        differences from `jobs`' expected state; returns the Switch's reconcile report."""
        sw = switch if switch is not None else self.switches[name]
        return sw.reconcile(self.expected(name, jobs), self.tables(name))
