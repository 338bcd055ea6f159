"""A job's workers, the controller's grant, and the plan every worker derives from them, as plain values.

Classes mirror the admission service's messages (inaproto/admission.proto): ``Worker``,
``SwitchGrant`` and ``Grant`` are frozen copies of ``Worker``, ``SwitchGrant`` and ``JobGrant``.
``plan_for`` turns a grant and the requested backend into a ``Plan``: which workers aggregate in which
switch, which of them form the ring, who represents a rack. Every worker computes the same plan from
the same grant, so no further coordination is needed. See docs/agent.md ("Backends").
"""
from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inaproto import wire
from inaproto.backends import Backend, BackendChoice
from inaproto.rina_ring import Rack as RingRack
from inaproto.rina_ring import Ring, ring_of

__all__ = [
    "Grant",
    "JobSpec",
    "Plan",
    "Rack",
    "SwitchGrant",
    "Worker",
    "host_rack_name",
    "parse_workers",
    "plan_for",
]



def _choice(value: str) -> BackendChoice:
    try:
        return BackendChoice(value)
    except ValueError:
        raise ValueError(f"backend must be one of {', '.join(BackendChoice)}, got {value!r}") from None


@dataclass(frozen=True)
class Worker:
    """One worker of a job (proto ``Worker``). Its ring listens on TCP ``ip:udp_port`` (same number as its INA socket)."""

    worker_id: int
    ip: str
    udp_port: int
    mac: str = ""
    host: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.worker_id < wire.MAX_WORKERS:
            raise ValueError(f"worker id {self.worker_id} out of range 0..{wire.MAX_WORKERS - 1}")
        try:
            ipaddress.IPv4Address(self.ip)
        except ValueError:
            raise ValueError(f"worker {self.worker_id}: {self.ip!r} is not an IPv4 address") from None
        if not 0 <= self.udp_port < 65536:
            raise ValueError(f"worker {self.worker_id}: port {self.udp_port} out of range")

    @property
    def address(self) -> tuple[str, int]:
        return (self.ip, self.udp_port)

    def to_proto(self):
        from inaproto import admission_pb2 as pb

        return pb.Worker(worker_id=self.worker_id, ip=self.ip, udp_port=self.udp_port, mac=self.mac, host=self.host)

    @classmethod
    def from_proto(cls, msg: Any) -> Worker:
        return cls(int(msg.worker_id), msg.ip, int(msg.udp_port), msg.mac, msg.host)


def parse_workers(text: str) -> tuple[Worker, ...]:
    """Workers from ``IP:PORT[/MAC][@HOST],...``; worker ids are the positions in the list.

    Raises ValueError naming the bad item.
    """
    out = []
    for i, item in enumerate(x.strip() for x in text.split(",")):
        if not item:
            raise ValueError(f"worker {i}: empty entry in worker list {text!r}")
        rest, _, host = item.partition("@")
        rest, _, mac = rest.partition("/")
        ip, sep, port = rest.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"worker {i}: {item!r} is not IP:PORT[/MAC][@HOST]")
        out.append(Worker(i, ip, int(port), mac, host))
    return tuple(out)


@dataclass(frozen=True)
class JobSpec:
    """What every worker of a job is started with (the same on all of them).

    ``name`` is the rendezvous key: the worker with the lowest id registers the job, the others find
    it by name (docs/agent.md, "Joining a job"). ``backend`` is a ``BackendChoice`` (a string is converted).
    ``tensor_elements`` (elements all-reduced per step) sizes the job at the controller: with
    ``requested_slots`` 0 it asks for ceil(tensor_elements / 32) slots, as many as the policy allows.
    """

    name: str
    workers: tuple[Worker, ...]
    backend: BackendChoice = BackendChoice.AUTO
    tensor_elements: int = 1_000_000
    priority: int = 0
    requested_slots: int = 0
    weight: float = 0.0
    min_slots: int = 0
    secret: str = field(default="", repr=False, compare=False)  # the job's credential (docs/security.md)

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(sorted(self.workers, key=lambda w: w.worker_id)))
        if not self.name:
            raise ValueError("a job needs a name")
        if not self.workers:
            raise ValueError(f"job {self.name!r} has no workers")
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"job {self.name!r}: worker ids must be unique, got {ids}")
        object.__setattr__(self, "backend", _choice(self.backend))
        if self.tensor_elements < 1:
            raise ValueError(f"tensor_elements (elements all-reduced per step, a sizing hint) must be >= 1, "
                             f"got {self.tensor_elements}")

    @property
    def worker_ids(self) -> tuple[int, ...]:
        return tuple(w.worker_id for w in self.workers)

    def worker(self, worker_id: int) -> Worker:
        for w in self.workers:
            if w.worker_id == worker_id:
                return w
        raise KeyError(f"job {self.name!r} has no worker {worker_id} (workers: {list(self.worker_ids)})")

    def register_request(self):
        from inaproto import admission_pb2 as pb

        return pb.RegisterJobRequest(
            name=self.name, workers=[w.to_proto() for w in self.workers], tensor_elements=self.tensor_elements,
            priority=self.priority, requested_slots=self.requested_slots, weight=self.weight, min_slots=self.min_slots,
        )

    def to_json(self) -> str:
        return json.dumps({
            "name": self.name, "backend": self.backend, "tensor_elements": self.tensor_elements,
            "priority": self.priority, "requested_slots": self.requested_slots, "weight": self.weight,
            "min_slots": self.min_slots, **({"secret": self.secret} if self.secret else {}),
            "workers": [{"worker_id": w.worker_id, "ip": w.ip, "udp_port": w.udp_port, "mac": w.mac, "host": w.host}
                        for w in self.workers],
        }, indent=2)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        d = json.loads(text)
        if not isinstance(d, dict) or "workers" not in d or "name" not in d:
            raise ValueError("a job file is a JSON object with 'name' and 'workers'")
        workers = tuple(Worker(int(w["worker_id"]), str(w["ip"]), int(w["udp_port"]), str(w.get("mac", "")),
                               str(w.get("host", ""))) for w in d["workers"])
        keys = ("backend", "tensor_elements", "priority", "requested_slots", "weight", "min_slots", "secret")
        return cls(str(d["name"]), workers, **{k: d[k] for k in keys if k in d})


@dataclass(frozen=True)
class SwitchGrant:
    """The job's slots on one switch (proto ``SwitchGrant``)."""

    switch: str
    switch_ip: str
    switch_mac: str = ""
    base_slot: int = 0
    num_slots: int = 0
    mcast_grp: int = 0
    worker_ids: tuple[int, ...] = ()
    rack: str = ""
    path_rtt_floor: float = 0.0  # seconds: the shortest round trip of its workers' path (controller/path_floor.py)

    @classmethod
    def from_proto(cls, msg: Any) -> SwitchGrant:
        return cls(msg.switch, msg.switch_ip, msg.switch_mac, int(msg.base_slot), int(msg.num_slots),
                   int(msg.mcast_grp), tuple(int(w) for w in msg.worker_ids), msg.rack, float(msg.path_rtt_floor))


@dataclass(frozen=True)
class Grant:
    """The controller's grant for a job (proto ``JobGrant``)."""

    job_id: int
    generation: int
    backend: Backend
    switches: tuple[SwitchGrant, ...] = ()
    scale: float = float(2**16)
    ina_port: int = wire.INA_UDP_PORT
    lanes: int = wire.LANES
    reason: str = ""
    chain_rtt_floor: float = 0.0  # Rina: the chains' mean round trip at the links' rates, seconds (0: unknown)

    @classmethod
    def from_proto(cls, msg: Any) -> Grant:
        return cls(int(msg.job_id), int(msg.generation), Backend(msg.backend or Backend.RING),
                   tuple(SwitchGrant.from_proto(s) for s in msg.switches),
                   float(msg.scale) if msg.scale > 0 else float(2**16),
                   int(msg.ina_port) or wire.INA_UDP_PORT, int(msg.lanes) or wire.LANES, msg.reason,
                   max(0.0, float(msg.chain_rtt_floor)))

    def path_rtt_floor(self, worker_id: int) -> float:
        """The path round-trip floor the controller sized for ``worker_id``: its switch's, where that switch holds
        slots for the job (0: none, or the worker aggregates nowhere)."""
        return next((sg.path_rtt_floor for sg in self.switches if sg.num_slots > 0 and worker_id in sg.worker_ids),
                    0.0)

    @classmethod
    def ring_only(cls, job_id: int = 0, generation: int = 0, scale: float = float(2**16)) -> Grant:
        """The grant a job without a controller works under: ring all-reduce, no switch."""
        return cls(job_id, generation, Backend.RING, (), scale, reason="no controller")


@dataclass(frozen=True)
class Rack:
    """Workers that aggregate in one switch (or a host member's copy of the chain): slots ``[0, num_slots)`` of the
    job's range there."""

    switch: str
    address: tuple[str, int]  # where INA packets go: (switch_ip, ina_port)
    num_slots: int
    worker_ids: tuple[int, ...]
    # Rina on chains: the chain (partition) of every slot of the ring's range, each answered over a chain of its own
    # length; (): one path. The sender's RACK and timers keep one class per chain (``chains``).
    slot_chains: tuple[int, ...] = ()

    @property
    def chains(self) -> int:
        """How many chains answer this rack's slots (1: one path)."""
        return len(set(self.slot_chains)) or 1


@dataclass(frozen=True)
class Plan:
    """How the job's all-reduce runs under one generation.

    kind ``Backend.INA``: every worker sends its chunks to one rack (its switch, or its own copy of Rina's chain)
        whose results are final: one switch, a tree's ToRs, or Rina's chains.
    kind ``Backend.RING``: every worker is a member of one TCP ring (``ring``), no switch.
    """

    kind: Backend
    generation: int
    racks: tuple[Rack, ...] = ()
    ring: tuple[int, ...] = ()  # worker ids of the ring members, ascending (rank order)
    reason: str = ""

    def rack_of(self, worker_id: int) -> Rack | None:
        return next((r for r in self.racks if worker_id in r.worker_ids), None)

    def describe(self) -> str:
        if self.kind == Backend.RING:
            return f"ring of {len(self.ring)}"
        racks = ", ".join(f"{r.switch}: workers {list(r.worker_ids)} on {r.num_slots} slots" for r in self.racks)
        return f"ina ({racks})"


def _effective(requested: BackendChoice, granted: Backend) -> Backend:
    if requested == BackendChoice.RING or granted not in (Backend.INA, Backend.RINA, Backend.TREE):
        return Backend.RING
    if requested == BackendChoice.INA:
        return Backend.INA if granted in (Backend.INA, Backend.TREE) else Backend.RING
    return Backend(granted)  # rina or auto: what the grant offers


def host_rack_name(worker_id: int) -> str:
    """The name of a host member's "rack" in a plan (its copy, host_agent/host_member.py; ``plan_for`` looks
    its address up by it)."""
    return f"host-copy-{worker_id}"


def plan_for(grant: Grant, worker_ids: Iterable[int], requested: BackendChoice | str = BackendChoice.AUTO,
             addresses: Mapping[str, tuple[str, int]] | None = None) -> Plan:
    """The plan of every worker of the job under ``grant`` for the requested backend.

    ``ina`` runs only where one switch with slots holds every worker (or a tree), and falls back to the ring
    otherwise; ``rina`` and ``auto`` take what the grant offers; ``ring`` never uses a switch. ``addresses``
    overrides where a switch's INA packets go (switch name -> (ip, port)), e.g. for a relay; by default
    ``(switch_ip, ina_port)``.

    A ``rina`` grant is Rina on chains across its racks' switches (docs/switch.md, "Chains"): each worker of an
    INA rack is plain INA towards its own rack's switch over the ring's partitioned slots, each worker of a rack
    without INA (a host member) plain INA towards its own copy (a rack of its own named ``host-copy-<id>``, at
    ``addresses`` under that name); a rina grant that makes no ring (``chain_ring``) runs on the ring.

    A ``tree`` grant (the controller's two-level tree, docs/controller.md, "Aggregation trees") is followed
    by every choice but ``ring``: each worker is plain INA towards its own ToR, which returns the final sum
    (one rack per ToR; the root's grant has no workers and is not a rack).
    """
    ids = tuple(sorted(worker_ids))
    requested = _choice(requested)
    if grant.lanes != wire.LANES:
        raise ValueError(f"grant uses {grant.lanes} lanes per packet; this agent speaks {wire.LANES}")
    kind = _effective(requested, grant.backend)
    addresses = addresses or {}
    if kind == Backend.RING:
        return Plan(Backend.RING, grant.generation, (), ids, grant.reason)
    racks: list[Rack] = []
    seen: set[int] = set()
    for sg in grant.switches:
        members = tuple(sorted(w for w in sg.worker_ids if w in ids and w not in seen))
        if sg.num_slots > 0 and members:
            racks.append(Rack(sg.switch, addresses.get(sg.switch, (sg.switch_ip, grant.ina_port)), sg.num_slots,
                              members))
            seen.update(members)
    ring = chain_ring(grant, hosts=True) if kind == Backend.RINA else None
    if ring is not None:
        racks = [replace(r, num_slots=ring.num_slots, slot_chains=ring.slot_partitions) for r in racks]
        for m in ring.members:  # a host member: plain INA towards its own copy (host_agent/host_member.py)
            if not m.is_switch and m.member_id in ids:
                name = host_rack_name(m.member_id)
                racks.append(Rack(name, addresses.get(name, ("0.0.0.0", 0)), ring.num_slots, (m.member_id,),
                                  ring.slot_partitions))
        return Plan(Backend.INA, grant.generation, tuple(racks), (), grant.reason)
    if seen == set(ids) and (len(racks) == 1 or grant.backend == Backend.TREE):
        return Plan(Backend.INA, grant.generation, tuple(racks), (), grant.reason)
    return Plan(Backend.RING, grant.generation, (), ids, grant.reason)


def chain_ring(grant: Grant, *, hosts: bool = False) -> Ring | None:
    """The Rina ring the controller runs as chains for ``grant`` (``inaproto.rina_ring.ring_of``): with
    ``hosts``, also where some members are hosts (workers of racks without INA, each keeping its copy in its
    agent: host_agent/host_member.py); without, only where every member is an INA rack."""
    ring = ring_of(RingRack(sg.switch, tuple(sg.worker_ids), sg.num_slots, bool(sg.switch_ip)) for sg in grant.switches)
    if ring is None or not (hosts or all(m.is_switch for m in ring.members)):
        return None
    return ring
