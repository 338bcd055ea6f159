"""Controller + ina-switch processes with real traffic: hosts in network namespaces send INA packets.

Topology: one namespace per host (h11..h14, ``eth0``, 10.0.1.i, TX offload off) wired to ina-switch's
namespace (ports 1..4). The switch's gRPC port is forwarded to 127.0.0.1 of the test, where
``ina-controller`` runs. Each worker is a minimal agent: a UDP socket in its host namespace, stop-and-wait
chunks (chunk k in slot k mod S, shadow (k div S) mod 2), a WatchJob stream for new grants and
SyncGeneration after each generation change, exactly as docs/controller.md describes for agents.
"""
from __future__ import annotations

import importlib.util
import json
import queue
import socket
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto import wire
from inaproto.commands import Command, command_argv
from inaproto.credentials import admission_channel
from tests.support.ports import free_port
from topologies.loopback import write_admin_credential
from topologies.netns import Network, Process, TcpForward, wait_until

pytestmark = pytest.mark.skipif(importlib.util.find_spec("softswitch.cli") is None, reason="ina-switch is not there yet")

SWITCH_IP, SWITCH_MAC = "10.0.1.254", "02:00:00:00:01:fe"
GRPC_PORT = 9559



def lanes_of(worker: int, chunk: int) -> np.ndarray:
    return (np.arange(wire.LANES, dtype=np.int64) * (chunk + 1) + 1000 * worker + chunk).astype(np.int32)


class Bed:
    def __init__(self, net: Network, tmp: Path, n_hosts: int = 4, pool: int = 16):
        self.net, self.tmp = net, tmp
        self.sw = net.add_namespace("sw")
        self.hosts = {}
        doc: dict = {"hosts": {}, "switches": {}, "links": []}
        ifaces = []
        for i in range(1, n_hosts + 1):
            name, mac, ip = f"h1{i}", f"02:00:00:00:01:{i:02x}", f"10.0.1.{i}"
            ns = net.add_namespace(name)
            net.add_veth(ns, "eth0", self.sw, f"p{i}", tx_off=[ns])
            ns.ip("link", "set", "eth0", "down")
            ns.ip("link", "set", "eth0", "address", mac)
            ns.ip("link", "set", "eth0", "up")
            ns.ip("addr", "add", f"{ip}/24", "dev", "eth0")
            ns.ip("neigh", "replace", SWITCH_IP, "lladdr", SWITCH_MAC, "dev", "eth0", "nud", "permanent")
            self.hosts[name] = (ns, ip, mac)
            doc["hosts"][name] = {"ip": f"{ip}/24", "mac": mac}
            doc["links"].append([name, f"s1-p{i}"])
            ifaces += ["-i", f"{i}@p{i}"]
        self.switch = net.track(Process(
            [*command_argv(Command.SWITCH), "--device-id", "1", *ifaces, "--no-p4", "-L", "warn", "--log-console", "--",
             "--grpc-server-addr", f"127.0.0.1:{GRPC_PORT}"],
            tmp / "switch.log", namespace=self.sw))
        self.switch.wait_until(lambda: self.sw.tcp_port_open(GRPC_PORT), 20, "ina-switch gRPC")
        self.forward = TcpForward(self.sw, GRPC_PORT)
        doc["switches"]["s1"] = {"grpc": self.forward.address, "device_id": 1, "pool": pool,
                                 "switch_ip": SWITCH_IP, "switch_mac": SWITCH_MAC}
        self.topology = tmp / "topology.json"
        self.topology.write_text(json.dumps(doc, indent=2))
        self.listen = f"127.0.0.1:{free_port()}"
        self.admin = write_admin_credential(tmp / "admin.credential")  # the controller reads it (--admin-credential)
        self.channel = admission_channel(self.listen, self.admin.read_text().strip())
        self.stub = pb_grpc.AdmissionStub(self.channel)
        self.controller: Process | None = None

    def start_controller(self) -> None:
        self.controller = self.net.track(Process(
            [*command_argv(Command.CONTROLLER), "--topology", str(self.topology), "--db", str(self.tmp / "ctl.db"), "--listen", self.listen,
             "--set", "heartbeat_timeout=0", "--set", "sync_timeout=20", "--set", f"admin_credential={self.admin}"],
            self.tmp / f"controller-{time.monotonic_ns()}.log"))

        def ready():
            try:
                return self.stub.GetPolicy(pb.GetPolicyRequest(), timeout=0.5)
            except grpc.RpcError:
                return False

        self.controller.wait_until(ready, 30, "ina-controller serving")

    def kill_controller(self) -> None:
        self.controller.popen.kill()
        self.controller.stop()

    def inactl(self, *argv: str) -> str:
        out = subprocess.run([*command_argv(Command.CTL), "--controller", self.listen, "--credential-file", str(self.admin), *argv], capture_output=True, text=True, timeout=30, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def close(self) -> None:
        self.channel.close()
        self.forward.close()


class Agent(threading.Thread):
    """One worker: stop-and-wait all-reduce of `chunks` chunks, following grants and generations."""

    def __init__(self, bed: Bed, job_id: int, worker_id: int, host: str, chunks: int, pace: float = 0.0):
        super().__init__(daemon=True)
        self.bed, self.job_id, self.worker_id, self.chunks, self.pace = bed, job_id, worker_id, chunks, pace
        ns, self.ip, _ = bed.hosts[host]
        self.port = 40000 + worker_id
        self.sock = ns.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.ip, self.port))
        self.sock.settimeout(0.1)
        self.grants: queue.Queue = queue.Queue()
        self.results: dict[int, np.ndarray] = {}
        self.generations: list[int] = []
        self.resumes: list[int] = []
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        """WatchJob, reconnecting while the controller is down (the stream restarts with the current grant)."""
        while not self._done.is_set():
            try:
                for ev in self.bed.stub.WatchJob(pb.WatchJobRequest(job_id=self.job_id, worker_id=self.worker_id)):
                    self.grants.put(ev.grant)
            except grpc.RpcError:
                time.sleep(0.1)

    def _call(self, fn, *args, **kw):
        deadline = time.monotonic() + 30
        while True:
            try:
                return fn(*args, **kw)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _send(self, grant: pb.JobGrant, chunk: int, flags: int = 0) -> None:
        s = grant.switches[0].num_slots
        header = wire.InaHeader(wire.MsgType.GRADIENT, flags, self.job_id, grant.generation, chunk % s, chunk,
                                self.worker_id, (chunk // s) % 2)
        self.sock.sendto(wire.encode_payload(header, lanes_of(self.worker_id, chunk)), (SWITCH_IP, wire.INA_UDP_PORT))

    def run(self) -> None:
        try:
            grant = self.grants.get(timeout=30)
            self.generations.append(grant.generation)
            chunk = 0
            while chunk < self.chunks:
                assert grant.backend == "ina", grant
                self._send(grant, chunk)
                got = False
                while not got:
                    try:
                        data = self.sock.recv(2048)
                        header, lanes = wire.decode_payload(data)
                        if header.msg_type == wire.MsgType.RESULT and header.seq == chunk and header.generation == grant.generation:
                            self.results[chunk] = lanes
                            got = True
                        continue
                    except TimeoutError:
                        pass
                    newer = None
                    while not self.grants.empty():
                        newer = self.grants.get()
                    if newer is not None and newer.generation != grant.generation:
                        grant = newer
                        self.generations.append(grant.generation)
                        first_missing = next(k for k in range(len(self.results) + 1) if k not in self.results)
                        r = self._call(self.bed.stub.SyncGeneration, pb.SyncGenerationRequest(
                            job_id=self.job_id, worker_id=self.worker_id, generation=grant.generation,
                            first_missing_chunk=first_missing), timeout=25)
                        self.resumes.append(r.resume_chunk)
                        chunk = r.resume_chunk
                        break
                    self._send(grant, chunk, wire.Flags.RETRANSMIT)
                else:
                    chunk += 1
                    if self.pace:
                        time.sleep(self.pace)
        except BaseException as exc:  # reported by the test  # noqa: BLE001
            self.error = exc
        finally:
            self._done.set()

    def __repr__(self) -> str:
        return (f"Agent(worker {self.worker_id}: {len(self.results)} results, generations {self.generations}, "
                f"resumes {self.resumes}, error {self.error!r})")

    def check(self, n_workers: int) -> None:
        assert self.error is None, repr(self.error)
        assert sorted(self.results) == list(range(self.chunks))
        for k, lanes in self.results.items():
            expected = sum(lanes_of(w, k).astype(np.int64) for w in range(n_workers)).astype(np.int32)
            assert np.array_equal(lanes, expected), f"worker {self.worker_id} chunk {k}: wrong sum"


@pytest.fixture
def bed(tmp_path):
    with Network("ctl") as net:
        b = Bed(net, tmp_path)
        try:
            yield b
        finally:
            b.close()


def register(bed, name, hosts, slots):
    workers = [pb.Worker(worker_id=i, host=h, udp_port=40000 + i) for i, h in enumerate(hosts)]
    return bed.stub.RegisterJob(pb.RegisterJobRequest(name=name, workers=workers, tensor_elements=10_000, requested_slots=slots), timeout=10)


def test_two_jobs_aggregate_concurrently_through_their_ranges(bed):
    bed.start_controller()
    a = register(bed, "a", ["h11", "h12"], 8)
    b = register(bed, "b", ["h13", "h14"], 8)
    assert (a.switches[0].base_slot, b.switches[0].base_slot) == (0, 8)
    agents = [Agent(bed, a.job_id, 0, "h11", 40), Agent(bed, a.job_id, 1, "h12", 40),
              Agent(bed, b.job_id, 0, "h13", 40), Agent(bed, b.job_id, 1, "h14", 40)]
    for ag in agents:
        ag.start()
    for ag in agents:
        ag.join(40)
    for ag in agents:
        ag.check(2)
    stats = json.loads(bed.inactl("stats", "--json"))["stats"]
    assert {s["job_id"]: int(s["aggregated"]) for s in stats} == {a.job_id: 80, b.job_id: 80}


def test_reallocation_and_controller_kill_mid_stream_lose_and_double_count_nothing(bed):
    bed.start_controller()
    a = register(bed, "a", ["h11", "h12"], 8)
    b = register(bed, "b", ["h13", "h14"], 16)
    assert (b.switches[0].base_slot, b.switches[0].num_slots) == (8, 8)
    endless = 10**9  # until the test sets where to stop
    agents = [Agent(bed, b.job_id, 0, "h13", endless, pace=0.002), Agent(bed, b.job_id, 1, "h14", endless, pace=0.002)]
    for ag in agents:
        ag.start()
    wait_until(lambda: len(agents[0].results) > 40, 20, message="job b is not aggregating")

    bed.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=a.job_id), timeout=10)  # b: 16 slots at 0, new generation
    wait_until(lambda: all(len(ag.resumes) == 1 for ag in agents), 20, message=lambda: f"agents did not follow the upgrade: {agents}")
    n = len(agents[0].results)
    bed.kill_controller()  # kill -9 mid-stream: the switch keeps aggregating
    wait_until(lambda: len(agents[0].results) > n + 40, 20, message=lambda: f"training stopped with the controller: {agents}")
    bed.start_controller()
    n = len(agents[0].results)
    wait_until(lambda: len(agents[0].results) > n + 20, 20, message=lambda: f"training stopped after the restart: {agents}")
    out = bed.inactl("policy", "set", "equal")  # the restarted controller writes: b shrinks, new generation
    assert out.startswith("policy: equal")
    register(bed, "c", ["h11"], 8)  # equal split of 16 between b and c: b goes to 8
    wait_until(lambda: all(len(ag.resumes) == 2 for ag in agents), 20, message=lambda: f"agents did not follow the shrink: {agents}")
    stop_at = max(len(ag.results) for ag in agents) + 50
    for ag in agents:
        ag.chunks = stop_at
    for ag in agents:
        ag.join(60)
    for ag in agents:
        ag.check(2)
    assert agents[0].resumes == agents[1].resumes  # every barrier gave both workers the same chunk
    job = json.loads(bed.inactl("job", "show", str(b.job_id), "--json"))
    assert job["grant"]["switches"][0]["num_slots"] == 8
    stats = json.loads(bed.inactl("stats", str(b.job_id), "--json"))["stats"][0]
    assert int(stats["aggregated"]) >= 2 * stop_at
    assert int(stats["drops"]["stale_generation"]) >= 0  # old-generation packets in flight at each change
