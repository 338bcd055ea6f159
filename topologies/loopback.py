"""INA in one process on loopback, without root: the controller core over switches that are models.

``LocalSwitch`` is ina-switch's data plane (``InaPipeline``) behind its real P4Runtime gRPC server on
127.0.0.1:0. ``LocalControlPlane`` runs the controller core (``controller.core.Controller``) with its admission
service over a topology of such switches, and can kill and restart the controller on the same database; its
``stub`` carries the admin credential the controller wrote, ``job_stub(secret)`` a tenant's. Frames reach its
switches through ``pipeline.process`` directly.

``LoopbackCluster`` adds what agents need: every rack's switch bridged to UDP (``softswitch.udp.UdpSwitch``) on
the switch's own address, every host on an address of its own, all in one 127.x.y.0/24, so the controller's
entries (jobs, chains between racks, host members) work as they are, and runs agents against it in threads.
Tests and benchmarks (bench/sender_bench.py) use it.
"""
from __future__ import annotations

import itertools
import random
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

import grpc
import numpy as np

from controller.config import ControllerConfig
from controller.core import Controller
from controller.service import serve
from controller.topology import Topology
from host_agent.agent import Agent, AgentOptions, bind_worker_sockets
from host_agent.fixedpoint import dequantize, quantize
from host_agent.grant import JobSpec, Worker
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto import wire
from inaproto.credentials import admission_channel, new_secret, read_credential_file
from softswitch.udp import Faults, UdpSwitch

__all__ = ["HostAddr", "LocalControlPlane", "LocalSwitch", "LoopbackCluster", "exact_sum", "local_job", "run_workers",
           "star_topology", "worker", "write_admin_credential"]


def write_admin_credential(path: Path) -> Path:
    """A fresh admin credential in ``path`` (mode 0600), for ``ina-controller --admin-credential``: a test
    then knows it before the controller starts."""
    import os

    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(new_secret() + "\n")
    return path


class LocalSwitch:
    """An InaPipeline with ina-switch's P4Runtime server, listening on 127.0.0.1 (a free port); over TLS with
    ``server_credentials``."""

    def __init__(self, device_id: int = 1, server_credentials: grpc.ServerCredentials | None = None) -> None:
        from p4src.ina_model import InaPipeline
        from softswitch.p4runtime_server import P4RuntimeServer

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
        from p4src.ina_model import InaPipeline
        from softswitch.p4runtime_server import P4RuntimeServer

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


@dataclass(frozen=True)
class HostAddr:
    """Where a worker sends from: its host's addresses and its UDP port."""

    ip: str
    mac: str
    udp_port: int


def worker(worker_id: int, host: str, udp_port: int | None = None) -> pb.Worker:
    """A Worker message whose ip and mac the controller fills from the topology host."""
    return pb.Worker(worker_id=worker_id, host=host, udp_port=udp_port or 40000 + worker_id)


class LocalControlPlane:
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


# ----------------------------------------------------------------------------- agents on loopback


def local_job(n: int, name: str = "job", *, backend: str = "auto", hosts: list[str] | None = None,
              ips: list[str] | None = None, requested_slots: int = 0) -> tuple[JobSpec, list[tuple[socket.socket, socket.socket]]]:
    """A job of ``n`` workers with their sockets bound (worker i at ``ips[i]``, default 127.0.0.1, on host
    ``hosts[i]``, default "h{i}") and a fresh secret."""
    ips = ips or ["127.0.0.1"] * n
    sockets = [bind_worker_sockets(ips[i]) for i in range(n)]
    hosts = hosts or [f"h{i}" for i in range(n)]
    workers = tuple(Worker(i, ips[i], s[0].getsockname()[1], "", hosts[i]) for i, s in enumerate(sockets))
    return JobSpec(name, workers, backend=backend, secret=new_secret(), requested_slots=requested_slots), sockets


def run_workers(n: int, fn: Callable[[int], object], *, timeout: float = 60.0) -> list:
    """``fn(i)`` in n threads; results in order; the first exception is raised after all have ended."""
    results: list = [None] * n

    def target(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # reported below  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=target, args=(i,), name=f"worker-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise TimeoutError(f"workers still running after {timeout}s: {alive}")
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def exact_sum(arrays: list, scale: float = float(2**16)) -> np.ndarray:
    """What every agent must return: float32(exact int64 sum of rint(x * scale) / scale), saturated like quantize."""
    total = np.sum(np.stack([quantize(np.asarray(a).reshape(-1), scale).astype(np.int64) for a in arrays]), axis=0)
    return dequantize(total, scale).reshape(np.asarray(arrays[0]).shape)


SPARE_HOSTS = 4  # hosts per rack for jobs a test or benchmark registers beside its agents' (LoopbackCluster.admit)


class LoopbackCluster:
    """The controller core, every rack's switch on UDP, and one job's workers, on loopback in this process.

    Worker i is on host ``h{i}`` in rack ``racks[i]``; each rack is a switch (its ``slots`` pool shared by the
    controller's policy), under a spine without INA when there are several. Every host and switch has an address
    of its own in a 127.x.y.0/24 of this cluster; switches listen on the INA port, as on a real network.

    Args:
        racks: the rack of each worker.
        ina_racks: racks whose switch does INA (default: all); the others' hosts are Rina's host members.
        slots: what each job asks of each INA rack (0: the racks have no slots at all: the ring).
        pool: each INA rack's slots, shared by the jobs as the controller's policy decides.
        scale: the controller's fixed-point scale.
        faults, seed: fault injection on every INA switch (``softswitch.udp.Faults``).
        backend: requested backend of the job.
        options: the agents' options.
        name: the job's name.
        link_mbps: the rate of every host's link (the grants' path round-trip floor comes from it).
        settings: further ``ControllerConfig`` fields (policy, trees, heartbeat_timeout, ...).
    """

    def __init__(self, racks: list[str], *, ina_racks: set[str] | None = None, slots: int = 64,
                 scale: float = float(2**16), faults: Faults | None = None, seed: int = 0, backend: str = "auto",
                 options: AgentOptions | None = None, name: str = "job", pool: int = wire.NUM_SLOTS,
                 link_mbps: float | None = None, **settings) -> None:
        self.racks = list(racks)
        self.rack_names = sorted(set(racks))
        self.ina_racks = set(self.rack_names) if ina_racks is None else set(ina_racks)
        self.slots = slots
        self.pool = pool if slots else 0
        self.options = options or AgentOptions()
        self._tmp = tempfile.TemporaryDirectory(prefix="ina-loopback-")
        settings.setdefault("sync_timeout", 30.0)
        settings.setdefault("scale", scale)
        self.local_switches = {r: LocalSwitch(device_id=k) for k, r in enumerate(self.rack_names, start=1)
                               if r in self.ina_racks}
        self.switches: dict[str, UdpSwitch | None] = {}
        self.control: LocalControlPlane | None = None
        try:
            self._bind_switches(faults, seed, link_mbps)
            self.control = LocalControlPlane(Path(self._tmp.name) / "ctl.db", topology_doc=self.doc, **settings)
            self.spec, self.sockets = self.new_job(name, backend)
        except BaseException:
            self.close()
            raise

    # --- the network ------------------------------------------------------------------------------------
    def _bind_switches(self, faults: Faults | None, seed: int, link_mbps: float | None) -> None:
        """A free 127.x.y.0/24, then every INA rack's switch on (its address, the INA port)."""
        rng = random.Random()
        for _ in range(50):
            self.subnet = f"127.{rng.randrange(64, 255)}.{rng.randrange(256)}"
            self.doc = self._topology(link_mbps)
            try:
                for r, local in self.local_switches.items():
                    info = self.doc["switches"][r]
                    self.switches[r] = UdpSwitch(r, info["switch_ip"], wire.INA_UDP_PORT, faults=faults, seed=seed,
                                                 pipeline=local.pipeline)
            except OSError:  # another cluster holds this subnet's switch addresses
                for sw in self.switches.values():
                    if sw is not None:
                        sw.close()
                self.switches.clear()
                continue
            self.switches.update({r: None for r in self.rack_names if r not in self.ina_racks})
            self.topology = Topology.from_dict(self.doc)
            for r, sw in self.switches.items():
                if sw is None:
                    continue
                # hosts on their ports; other racks' hosts (Rina's host members) and switches behind the uplink
                for host in self.topology.hosts.values():
                    sw.attach_host(host.ip, host.port if host.switch == r else self.UPLINK, host.mac)
                for other, info in self.topology.switches.items():
                    if other != r:
                        sw.attach_host(info.switch_ip, self.UPLINK, info.switch_mac)
            return
        raise OSError("no free 127.x.y.0/24 for the switches of a loopback cluster")

    UPLINK = 100  # each rack's port towards the spine

    def _topology(self, link_mbps: float | None) -> dict:
        doc: dict = {"hosts": {}, "switches": {}, "links": []}
        for k, r in enumerate(self.rack_names, start=1):
            local = self.local_switches.get(r)
            doc["switches"][r] = {
                "grpc": local.address if local else "127.0.0.1:1", "device_id": k, "ina": local is not None,
                "pool": self.pool, "rack": r, "switch_ip": f"{self.subnet}.{200 + k}",
                "switch_mac": f"02:00:00:00:{k:02x}:fe",
            }
            members = [i for i, rack in enumerate(self.racks) if rack == r]
            names = [f"h{i}" for i in members] + [f"{r}-x{j}" for j in range(SPARE_HOSTS)]
            for port, h in enumerate(names, start=1):
                spare = port - len(members) - 1
                ip = f"{self.subnet}.{1 + members[port - 1]}" if spare < 0 else f"{self.subnet}.{100 + 10 * k + spare}"
                doc["hosts"][h] = {"ip": f"{ip}/24", "mac": f"02:00:00:00:{k:02x}:{port:02x}"}
                doc["links"].append([h, f"{r}-p{port}"] + (["0ms", link_mbps] if link_mbps else []))
        if len(self.rack_names) > 1:
            doc["switches"]["spine"] = {"ina": False, "grpc": "127.0.0.1:1", "device_id": len(self.rack_names) + 1,
                                        "switch_ip": f"{self.subnet}.250", "switch_mac": "02:00:00:00:ff:fe"}
            for k, r in enumerate(self.rack_names, start=1):
                doc["links"].append([f"{r}-p{self.UPLINK}", f"spine-p{k}"])
        return doc

    def host_ip(self, host: str) -> str:
        return self.topology.hosts[host].ip

    # --- jobs -------------------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """The admission service."""
        assert self.control is not None
        return self.control.address

    def new_job(self, name: str, backend: str = "auto", workers: list[int] | None = None):
        """Another job on the same hosts: (spec, sockets); ``workers`` picks hosts (default: all)."""
        idx = list(range(len(self.racks))) if workers is None else workers
        hosts = [f"h{i}" for i in idx]
        spec, sockets = local_job(len(idx), name, backend=backend, hosts=hosts,
                                  ips=[self.host_ip(h) for h in hosts], requested_slots=self.slots)
        return spec, sockets

    def switch(self, rack: str | None = None) -> UdpSwitch:
        """The UDP switch of ``rack`` (default: the first INA rack)."""
        return next(s for r, s in sorted(self.switches.items()) if s is not None and (rack is None or r == rack))

    def job(self, name: str) -> pb.JobInfo:
        """The newest job called ``name`` the controller holds (KeyError if none)."""
        assert self.control is not None
        jobs = [j for j in self.control.stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs if j.name == name]
        if not jobs:
            raise KeyError(name)
        return max(jobs, key=lambda j: j.job_id)

    def admit(self, name: str, rack: str, slots: int, *, priority: int = 0, min_slots: int = 1) -> pb.JobGrant:
        """Another job, of one worker on a spare host of ``rack``, asking ``slots`` there (as admin): what moves,
        shrinks or revokes other jobs' slots, as the policy decides."""
        assert self.control is not None
        host = next(f"{rack}-x{j}" for j in range(SPARE_HOSTS)
                    if not any(w.host == f"{rack}-x{j}" for info in self.control.stub.ListJobs(pb.ListJobsRequest()).jobs
                               for w in info.request.workers))
        request = pb.RegisterJobRequest(name=name, workers=[worker(0, host)], tensor_elements=slots * wire.LANES,
                                        requested_slots=slots, priority=priority, min_slots=min_slots)
        return self.control.stub.RegisterJob(request, timeout=10)

    def release(self, job_id: int) -> None:
        assert self.control is not None
        self.control.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=job_id), timeout=10)

    def run(self, fn: Callable[[Agent], object], *, spec: JobSpec | None = None, sockets=None, timeout: float = 60.0,
            controller: bool = True, options: AgentOptions | None = None) -> list:
        """``fn(agent)`` on every worker of the job (threads); agents are closed after it; results in order."""
        spec = spec or self.spec
        sockets = sockets or self.sockets

        def one(i: int):
            agent = Agent(spec, spec.workers[i].worker_id, controller=self.address if controller else None,
                          sock=sockets[i][0], listener=sockets[i][1], options=options or self.options)
            try:
                return fn(agent)
            finally:
                agent.close()

        return run_workers(len(spec.workers), one, timeout=timeout)

    def close(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        for sw in self.switches.values():
            if sw is not None:
                sw.close()
        for local in self.local_switches.values():
            local.stop()
        self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
