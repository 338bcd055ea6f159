"""In-process switches and controllers for tests and demos: no processes, no root.

``LocalSwitch`` is ina-switch's data plane (``InaPipeline``) behind its real P4Runtime gRPC server on
127.0.0.1:0; ``Harness`` starts a controller with its admission service over a star topology of such
switches, and can kill and restart the controller on the same database. ``Harness.stub`` carries the
admin credential the controller wrote; ``Harness.job_stub(secret)`` a tenant's. Frames go through
``pipeline.process`` directly (``tests.support.frames.grant_gradient``, ``parse_result``).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Self

import grpc

from controller.config import ControllerConfig
from controller.core import Controller
from controller.service import serve
from controller.topology import Topology
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.credentials import admission_channel, read_credential_file
from tests.support.frames import HostAddr

__all__ = ["Harness", "LocalSwitch", "star_topology", "worker", "write_admin_credential"]


def write_admin_credential(path: Path) -> Path:
    """A fresh admin credential in ``path`` (mode 0600), for ``ina-controller --admin-credential``: a test
    then knows it before the controller starts."""
    import os

    from inaproto.credentials import new_secret

    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(new_secret() + "\n")
    return path


class LocalSwitch:
    """An InaPipeline with ina-switch's P4Runtime server, listening on 127.0.0.1 (a free port); over TLS with
    ``server_credentials``."""

    def __init__(self, device_id: int = 1, server_credentials: grpc.ServerCredentials | None = None) -> None:
        from softswitch.p4runtime_server import P4RuntimeServer
        from softswitch.pipeline import InaPipeline

        self.device_id = device_id
        self.server_credentials = server_credentials
        self.pipeline = InaPipeline()
        self.server = P4RuntimeServer(self.pipeline, device_id=device_id, address="127.0.0.1:0",
                                      server_credentials=server_credentials)
        self.port = self.server.start()
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        """A switch process that died and came back on the same address: empty, no pipeline."""
        from softswitch.p4runtime_server import P4RuntimeServer
        from softswitch.pipeline import InaPipeline

        self.server.stop()
        self.pipeline = InaPipeline()
        self.server = P4RuntimeServer(self.pipeline, device_id=self.device_id, address=self.address,
                                      server_credentials=self.server_credentials)
        self.server.start()

    def entries(self, table: str) -> dict:
        """match -> (action, params) of one table, read from the pipeline itself."""
        with self.pipeline.lock:
            return {m: (e.action, e.params) for m, e in self.pipeline.tables[table].entries.items()}

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return self.pipeline.process(port, frame)


def star_topology(switches: dict[str, LocalSwitch], hosts_per_switch: int = 4, pool: int = 64) -> dict:
    """A topology.json document: switch sK has hosts hK1..hKn on ports 1..n (10.0.K.i, 02:00:00:00:0K:0i),
    switches are chained on port 100 (next) and 101 (previous)."""
    doc: dict = {"hosts": {}, "switches": {}, "links": []}
    names = list(switches)
    for k, name in enumerate(names, start=1):
        sw = switches[name]
        doc["switches"][name] = {
            "grpc": sw.address, "device_id": sw.device_id, "pool": pool, "rack": f"r{k}",
            "switch_ip": f"10.0.{k}.254", "switch_mac": f"02:00:00:00:{k:02x}:fe",
        }
        for i in range(1, hosts_per_switch + 1):
            h = f"h{k}{i}"
            doc["hosts"][h] = {"ip": f"10.0.{k}.{i}/24", "mac": f"02:00:00:00:{k:02x}:{i:02x}"}
            doc["links"].append([h, f"{name}-p{i}"])
    for a, b in itertools.pairwise(names):
        doc["links"].append([f"{a}-p100", f"{b}-p101"])
    return doc


def worker(worker_id: int, host: str, udp_port: int | None = None) -> pb.Worker:
    """A Worker message whose ip and mac the controller fills from the topology host."""
    return pb.Worker(worker_id=worker_id, host=host, udp_port=udp_port or 40000 + worker_id)


class Harness:
    """Switches + controller + admission service in this process. Use as a context manager."""

    def __init__(self, db_path: Path, n_switches: int = 1, *, hosts_per_switch: int = 4, pool: int = 64,
                 topology_doc: dict | Callable[[dict], dict] | None = None, **options) -> None:
        self.switches = {f"s{k}": LocalSwitch(device_id=k) for k in range(1, n_switches + 1)}
        if callable(topology_doc):  # a document made from the switches' addresses
            topology_doc = topology_doc(self.switches)
        self.doc = topology_doc or star_topology(self.switches, hosts_per_switch, pool)
        self.topology = Topology.from_dict(self.doc)
        options.setdefault("heartbeat_timeout", 0)
        options.setdefault("sync_timeout", 5.0)
        options.setdefault("connect_timeout", 5.0)
        options.setdefault("monitor_interval", 0.1)
        self.options = ControllerConfig(db_path=Path(db_path), **options)
        self.controller: Controller | None = None
        self.server: grpc.Server | None = None
        self.channel: grpc.Channel | None = None
        self.stub: pb_grpc.AdmissionStub | None = None
        self.address = ""
        self.start_controller()

    def start_controller(self, **changes) -> Controller:
        options = replace(self.options, **changes) if changes else self.options
        self.controller = Controller(self.topology, options)
        self.controller.start()
        self.server, port = serve(self.controller, "127.0.0.1:0", max_workers=64)
        self.address = f"127.0.0.1:{port}"
        self.admin_credential = read_credential_file(self.controller.authority.path)
        self.channel = admission_channel(self.address, self.admin_credential)
        self.stub = pb_grpc.AdmissionStub(self.channel)
        self._tenant_channels: list[grpc.Channel] = []
        return self.controller

    def job_stub(self, secret: str | None) -> pb_grpc.AdmissionStub:
        """A stub that sends ``secret`` (None: no credential); closed with the controller."""
        channel = admission_channel(self.address, secret)
        self._tenant_channels.append(channel)
        return pb_grpc.AdmissionStub(channel)

    def stop_controller(self) -> None:
        """Stop the controller as abruptly as an in-process test can: no release of anything."""
        if self.controller is not None:
            self.controller.stop()
        if self.server is not None:
            self.server.stop(0).wait()
        if self.channel is not None:
            self.channel.close()
        for c in getattr(self, "_tenant_channels", ()):
            c.close()
        self.controller = self.server = self.channel = self.stub = None

    def restart_controller(self, **changes) -> Controller:
        self.stop_controller()
        return self.start_controller(**changes)

    def host(self, name: str, udp_port: int) -> HostAddr:
        h = self.topology.hosts[name]
        return HostAddr(h.ip, h.mac, udp_port)

    def close(self) -> None:
        self.stop_controller()
        for sw in self.switches.values():
            sw.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
