"""Admission checks: a RegisterJobRequest is checked completely, against the topology and the registered jobs,
before anything changes (docs/controller.md)."""
from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable

import grpc

from controller.errors import Refusal
from controller.store import Job
from controller.topology import Topology
from controller.trees import tree_layout
from inaproto import admission_pb2 as pb
from inaproto import wire

__all__ = ["check_member_ids", "validate_registration"]


def validate_registration(
    req: pb.RegisterJobRequest, topology: Topology, jobs: Iterable[Job]
) -> tuple[pb.RegisterJobRequest, tuple[tuple[int, str, int], ...]]:
    """Check a registration completely before anything changes; fill ip/mac from the topology.

    Returns the completed request and the placement ``(worker_id, switch, port)`` of every worker;
    raises Refusal (INVALID_ARGUMENT, or ALREADY_EXISTS against the registered ``jobs``).
    """

    def bad(msg: str) -> Refusal:
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, msg)

    if not req.workers:
        raise bad("a job needs at least one worker")
    if len(req.workers) > wire.MAX_WORKERS:
        raise bad(f"{len(req.workers)} workers: the worker bitmap holds at most {wire.MAX_WORKERS}")
    if req.tensor_elements < 1:
        raise bad("tensor_elements must be at least 1")
    if req.requested_slots > wire.NUM_SLOTS:
        raise bad(f"requested_slots {req.requested_slots} exceeds the switch pool of {wire.NUM_SLOTS} slots")
    if req.min_slots > wire.NUM_SLOTS:
        raise bad(f"min_slots {req.min_slots} exceeds the switch pool of {wire.NUM_SLOTS} slots")
    if req.requested_slots and req.min_slots > req.requested_slots:
        raise bad(f"min_slots {req.min_slots} is larger than requested_slots {req.requested_slots}")
    if not (math.isfinite(req.weight) and req.weight >= 0):
        raise bad(f"weight {req.weight} must be a finite number >= 0")
    if len(req.name) > 200:
        raise bad("name is longer than 200 characters")
    out = pb.RegisterJobRequest()
    out.CopyFrom(req)
    placement = []
    seen_ids: set[int] = set()
    seen_addrs: set[tuple[str, int]] = set()
    for w in out.workers:
        if w.worker_id >= wire.MAX_WORKERS:
            raise bad(f"worker_id {w.worker_id} is beyond the {wire.MAX_WORKERS}-bit worker bitmap (0..{wire.MAX_WORKERS - 1})")
        if w.worker_id in seen_ids:
            raise bad(f"worker_id {w.worker_id} appears twice")
        seen_ids.add(w.worker_id)
        if not w.host:  # an agent that knows only its address: find its host in the topology
            w.host = next((h.name for h in topology.hosts.values() if w.ip and h.ip == w.ip), "")
        if not w.host:
            raise bad(
                f"worker {w.worker_id}: host is empty and ip {w.ip!r} is no topology host's "
                "(name a topology host like h1, or a switch port like s1-p3)"
            )
        try:
            switch, port = topology.locate(w.host)
        except ValueError as exc:
            raise bad(f"worker {w.worker_id}: {exc}") from None
        host = topology.hosts.get(w.host)
        if not w.ip and host is not None:
            w.ip = host.ip
        if not w.mac and host is not None:
            w.mac = host.mac
        try:
            ipaddress.IPv4Address(w.ip)
        except ValueError:
            raise bad(f"worker {w.worker_id}: ip {w.ip!r} is not an IPv4 address") from None
        parts = w.mac.split(":")
        if len(parts) != 6 or not all(len(p) == 2 and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts):
            raise bad(f"worker {w.worker_id}: mac {w.mac!r} is not a MAC address")
        w.mac = w.mac.lower()
        if not 1 <= w.udp_port <= 65535:
            raise bad(f"worker {w.worker_id}: udp_port {w.udp_port} is not a port number")
        if w.udp_port == wire.INA_UDP_PORT:
            raise bad(f"worker {w.worker_id}: udp_port {w.udp_port} is the INA port: results sent to it would "
                      "be taken for gradients by every switch on the way")
        if (w.ip, w.udp_port) in seen_addrs:
            raise bad(f"worker {w.worker_id}: address {w.ip}:{w.udp_port} is used by another worker of the job")
        seen_addrs.add((w.ip, w.udp_port))
        placement.append((w.worker_id, switch, port))
    for job in jobs:
        if out.name and job.request.name == out.name:
            raise Refusal(grpc.StatusCode.ALREADY_EXISTS, f"a job named {out.name!r} is already registered (job {job.job_id})")
        for w in job.request.workers:
            if (w.ip, w.udp_port) in seen_addrs:
                raise Refusal(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"worker address {w.ip}:{w.udp_port} is already registered by job {job.job_id}",
                )
    return out, tuple(placement)


def check_member_ids(topology: Topology, job: Job, *, trees: bool, chains: bool) -> None:
    """Refuse (INVALID_ARGUMENT) a job whose layout across switches needs more member ids than the worker mask has.

    A switch that aggregates for others is a member of the job under an id no worker of the job has (the ids its
    partials carry, and the bits ``upstream_mask`` sets): every ToR and the root of an aggregation tree
    (``trees``), every INA rack of Rina's ring on chains (``chains``). Workers and switch members share the
    ``wire.MAX_WORKERS``-bit mask, so such a job may have at most that many workers and switch members together.
    """
    switches = job.switches()
    if len(switches) < 2:
        return
    layouts = []
    if trees and (layout := tree_layout(topology, job)) is not None:
        layouts.append((len(layout.switches), f"its aggregation tree ({len(layout.tors)} ToRs and the root {layout.root})"))
    racks = sum(1 for sw in switches if topology.switches[sw].ina)
    if chains and racks:
        layouts.append((racks, f"Rina's ring on chains ({racks} INA racks)"))
    workers = len(job.worker_ids)
    for members, what in layouts:
        if workers + members > wire.MAX_WORKERS:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{workers} workers and the {members} switch members of {what} need {workers + members} member ids, "
                f"but the worker mask has {wire.MAX_WORKERS}: a job spanning these switches has at most "
                f"{wire.MAX_WORKERS - members} workers",
            )
