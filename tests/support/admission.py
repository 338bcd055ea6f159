"""Admission requests the controller tests send through a LocalControlPlane's stub."""
from __future__ import annotations

from inaproto import admission_pb2 as pb
from topologies.loopback import LocalControlPlane, worker


def register(h: LocalControlPlane, name: str, hosts: list[str], requested: int = 8, **kw) -> pb.JobGrant:
    """RegisterJob of one worker per host (ids in host order), for a 10,000-element tensor."""
    workers = [worker(i, host) for i, host in enumerate(hosts)]
    return h.stub.RegisterJob(pb.RegisterJobRequest(name=name, workers=workers, tensor_elements=10_000,
                                                    requested_slots=requested, **kw))
