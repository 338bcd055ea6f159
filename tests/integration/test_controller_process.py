"""``ina-controller`` and switch processes on 127.0.0.1 (control plane only: no interfaces, no namespaces).

The switch is ``ina-switch --no-p4`` (no ``-i``) when softswitch/cli.py exists, else a stand-in process
running the same P4Runtime server over an InaPipeline. The test reads the switch back over P4Runtime as
a backup client (lower election id: reads only), exactly as p4runtime-shell would.
"""
from __future__ import annotations

import importlib.util
import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from controller.p4entity import Schema
from controller.switch import Switch, SwitchOptions
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.commands import Command, command_argv
from inaproto.credentials import admission_channel
from tests.support.ports import free_port
from topologies.loopback import write_admin_credential
from topologies.netns import Process, wait_until

REPO = Path(__file__).resolve().parents[2]
SCHEMA = Schema.from_file(REPO / "p4src" / "ina.p4info.txt")
STAND_IN = """
import sys, signal, threading
from p4src.ina_model import InaPipeline
from softswitch.p4runtime_server import P4RuntimeServer
server = P4RuntimeServer(InaPipeline(), device_id=int(sys.argv[1]), address=sys.argv[2])
server.start()
print("stand-in switch on", sys.argv[2], flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: done.set())
done.wait()
server.stop()
"""



class Bench:
    """Switch processes, a topology, and ina-controller processes started and killed at will."""

    def __init__(self, tmp: Path, n_switches: int = 1, pool: int = 16):
        self.tmp = tmp
        self.procs: list[Process] = []
        self.switches: dict[str, str] = {}
        doc: dict = {"hosts": {}, "switches": {}, "links": []}
        for k in range(1, n_switches + 1):
            addr = f"127.0.0.1:{free_port()}"
            if importlib.util.find_spec("softswitch.cli") is not None:
                argv = [*command_argv(Command.SWITCH), "--device-id", str(k), "--no-p4", "-L", "warn", "--log-console", "--",
                        "--grpc-server-addr", addr]
            else:
                argv = [sys.executable, "-c", STAND_IN, str(k), addr]
            proc = self.track(Process(argv, tmp / f"s{k}.log"))
            self.switches[f"s{k}"] = addr
            proc.wait_until(lambda a=addr: _port_open(a), 20, f"switch s{k} on {addr}")
            doc["switches"][f"s{k}"] = {"grpc": addr, "device_id": k, "pool": pool}
            for i in range(1, 5):
                doc["hosts"][f"h{k}{i}"] = {"ip": f"10.0.{k}.{i}/24", "mac": f"02:00:00:00:{k:02x}:{i:02x}"}
                doc["links"].append([f"h{k}{i}", f"s{k}-p{i}"])
        self.topology = tmp / "topology.json"
        self.topology.write_text(json.dumps(doc, indent=2))
        self.db = tmp / "ctl.db"
        self.listen = f"127.0.0.1:{free_port()}"
        self.controller: Process | None = None
        self.admin = write_admin_credential(tmp / "admin.credential")  # the controller reads it (--admin-credential)
        self.channel = admission_channel(self.listen, self.admin.read_text().strip())
        self.stub = pb_grpc.AdmissionStub(self.channel)

    def track(self, proc: Process) -> Process:
        self.procs.append(proc)
        return proc

    def start_controller(self, *extra: str, wait: bool = True, listen: str | None = None) -> Process:
        argv = [*command_argv(Command.CONTROLLER), "--topology", str(self.topology), "--db", str(self.db),
                "--listen", listen or self.listen, "--set", "heartbeat_timeout=0", "--log-level", "info",
                "--set", f"admin_credential={self.admin}", *extra]
        log_path = self.tmp / f"controller-{len(self.procs)}.log"
        proc = self.track(Process(argv, log_path))
        if wait:
            self.controller = proc
            # Serving, and it is this process that serves: its own log says it bound the address (a port
            # freed by a killed controller may be taken by anyone meanwhile).
            proc.wait_until(lambda: "listening on" in log_path.read_text(errors="replace") and self._ready(), 30,
                            "ina-controller serving")
        return proc

    def _ready(self) -> bool:
        try:
            self.stub.GetPolicy(pb.GetPolicyRequest(), timeout=0.5)
            return True
        except grpc.RpcError:
            return False

    def kill_controller(self) -> None:
        self.controller.popen.kill()  # SIGKILL: no cleanup of any kind
        self.controller.popen.wait(5)
        self.controller.stop()

    def reader(self, name: str = "s1") -> Switch:
        sw = Switch(SwitchOptions(name, self.switches[name], int(name[1:]), election_id=(0, 1), connect_timeout=5), SCHEMA)
        sw.connect()
        return sw

    def switch_jobs(self, name: str = "s1") -> dict:
        with self.reader(name) as sw:
            jobs = {e.match[0]: e.params for e in sw.read_table("MyIngress.ina_job")}
            workers = {e.match: e.params for e in sw.read_table("MyEgress.ina_worker")}
            bindings = {e.match: e.params for e in sw.read_table("MyIngress.ina_binding")}
            groups = {g.group_id: g.replicas for g in sw.read_groups()}
        return {"jobs": jobs, "workers": workers, "bindings": bindings, "groups": groups}

    def close(self) -> None:
        self.channel.close()
        for p in reversed(self.procs):
            p.stop()


def _port_open(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, int(port))) == 0


@pytest.fixture
def bench(tmp_path):
    b = Bench(tmp_path)
    try:
        yield b
    finally:
        b.close()


def register(stub, name, hosts, slots, **kw):
    workers = [pb.Worker(worker_id=i, host=h, udp_port=40000 + i) for i, h in enumerate(hosts)]
    return stub.RegisterJob(pb.RegisterJobRequest(name=name, workers=workers, tensor_elements=4096, requested_slots=slots, **kw), timeout=10)


def expected(grants) -> dict:
    """What the switch must hold for these grants (single switch s1, hosts hK i on port i)."""
    jobs, workers, groups = {}, {}, {}
    for g in grants:
        s = g.switches[0]
        mask = sum(1 << w for w in s.worker_ids)
        jobs[g.job_id] = (s.base_slot, s.num_slots, mask, len(s.worker_ids), s.mcast_grp, g.generation, 0)
        groups[s.mcast_grp] = None
        for w in s.worker_ids:
            workers[(g.job_id, w)] = None
    return {"jobs": jobs, "workers": workers, "groups": groups}


def test_admission_installs_the_exact_entries_in_the_switch_process(bench):
    bench.start_controller()
    a = register(bench.stub, "a", ["h11", "h12"], 8)
    b = register(bench.stub, "b", ["h13", "h14"], 16)
    state = bench.switch_jobs()
    assert state["jobs"] == {
        a.job_id: (0, 8, 0b11, 2, a.job_id + 1, a.generation, 0),
        b.job_id: (8, 8, 0b11, 2, b.job_id + 1, b.generation, 0),
    }
    assert state["workers"][(b.job_id, 1)] == (0x020000000104, 0x0A000104, 40001)
    assert state["bindings"][(b.job_id, 1)] == (4, 0x020000000104, 0x0A000104, 40001)  # h14's port and addresses
    assert set(state["bindings"]) == set(state["workers"])
    assert state["groups"] == {a.job_id + 1: ((1, 0), (2, 1)), b.job_id + 1: ((3, 0), (4, 1))}
    # reallocation: a's release upgrades b in the switch under a new generation
    bench.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=a.job_id), timeout=10)
    g = bench.stub.GetJob(pb.GetJobRequest(job_id=b.job_id), timeout=10).grant
    assert g.generation != b.generation
    assert bench.switch_jobs()["jobs"] == {b.job_id: (0, 16, 0b11, 2, b.job_id + 1, g.generation, 0)}
    # inactl against the daemon
    out = subprocess.run([*command_argv(Command.CTL), "--controller", bench.listen, "--credential-file", str(bench.admin), "memory", "--json"], capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0 and json.loads(out.stdout)["switches"][0]["used"] == 16


def test_kill_9_mid_run_and_restart_loses_nothing(bench):
    bench.start_controller()
    confirmed: dict[int, pb.JobGrant] = {}  # what agents were told, and not released
    released: set[int] = set()
    releasing: set[int] = set()  # a release whose reply the kill cut off: done or not, both are right
    stop = threading.Event()
    rng = random.Random(3)

    def churn():
        n = 0
        while not stop.is_set():
            try:
                if confirmed and rng.random() < 0.4:
                    job_id = rng.choice(sorted(confirmed))
                    releasing.add(job_id)
                    bench.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=job_id), timeout=2)
                    released.add(job_id)
                    confirmed.pop(job_id)
                    releasing.discard(job_id)
                else:
                    host = f"h1{1 + n % 4}"
                    g = register(bench.stub, f"job{n}", [host], rng.choice([2, 4, 8]))
                    confirmed[g.job_id] = g
                n += 1
            except grpc.RpcError:
                time.sleep(0.05)  # controller down, or a host in use: keep trying
                n += 1

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    wait_until(lambda: len(confirmed) + len(released) >= 6, 60, message="the churn admitted fewer than 6 jobs in 60 s")
    bench.kill_controller()  # mid-run: requests in flight fail, nothing confirmed may be lost
    stop.set()
    t.join(10)
    assert confirmed, "the churn never got a job admitted"

    bench.start_controller()
    listed = {j.job_id: j.grant for j in bench.stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs}
    for job_id in set(confirmed) - releasing:
        assert job_id in listed, f"job {job_id} was confirmed to its agent but is gone after kill -9"
    assert not (released & set(listed)), "a released job came back"
    # the switch holds exactly what the controller reloaded (an admission cut short by the kill is either
    # wholly there or wholly gone), and the restart itself moved no job: agents keep their generation
    state = bench.switch_jobs()
    exp = expected(listed.values())
    assert state["jobs"] == exp["jobs"]
    assert set(state["workers"]) == set(exp["workers"]) and set(state["groups"]) == set(exp["groups"])
    # (a job whose switch entry the kill left half-changed is renewed: a new generation, the same slots)
    moved = [g.job_id for g in listed.values() if "controller restarted" in g.reason and not g.reason.startswith("renewed")]
    assert not moved


def test_restart_repairs_switch_entries_changed_while_the_controller_was_down(bench):
    bench.start_controller()
    a = register(bench.stub, "a", ["h11", "h12"], 8)
    before = bench.switch_jobs()
    bench.kill_controller()
    from controller.p4entity import TableEntry

    with Switch(SwitchOptions("s1", bench.switches["s1"], 1, election_id=(0, 99), connect_timeout=5), SCHEMA) as vandal:
        assert vandal.connect()
        vandal.delete(TableEntry("MyIngress.ina_job", (a.job_id,), "MyIngress.set_job", (0, 8, 3, 2, a.job_id + 1, a.generation, 0)))
        vandal.insert(TableEntry("MyIngress.ina_job", (200,), "MyIngress.set_job", (0, 4, 1, 1, 201, 1, 0)))
    bench.start_controller()
    after = bench.switch_jobs()
    assert after["workers"] == before["workers"] and after["groups"] == before["groups"]
    assert set(after["jobs"]) == set(before["jobs"])  # the stray job 200 is gone, job a is back
    params, old_params = after["jobs"][a.job_id], before["jobs"][a.job_id]
    assert params[:5] == old_params[:5]
    # Its entry had been deleted, so its slot state cannot be trusted: it is renewed with a new generation.
    grant = bench.stub.GetJob(pb.GetJobRequest(job_id=a.job_id), timeout=10).grant
    assert grant.generation == params[5] != a.generation and grant.reason.startswith("renewed")


def test_second_controller_with_lower_election_id_cannot_write(bench):
    bench.start_controller()
    register(bench.stub, "a", ["h11", "h12"], 8)
    before = bench.switch_jobs()
    other = bench.start_controller("--set", "election_id=[0, 5]", "--db", str(bench.tmp / "other.db"),
                                   wait=False, listen=f"127.0.0.1:{free_port()}")
    wait_until(lambda: not other.alive(), 30, message=lambda: other.describe())
    assert other.popen.returncode != 0
    assert "another controller is primary" in other.log_tail()
    assert bench.switch_jobs() == before
    assert register(bench.stub, "b", ["h13"], 4).backend == "ina"  # the primary is unaffected
