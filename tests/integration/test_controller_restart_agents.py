"""Agents ride out a controller restart: ``ina-controller`` (a process) is killed with SIGKILL while 8 agents
(4 jobs of 2) register, and restarted on the same database 2 s later; every job completes exact.

The switch is ina-switch's pipeline behind its P4Runtime server in this process (topologies.loopback.LocalSwitch),
bridged to loopback UDP (softswitch.udp.UdpSwitch); the agents are ``host_agent.agent.Agent`` threads. Jobs
a and b are admitted and all-reducing when the controller dies; their data plane keeps running (they
finish all-reduces while it is down). Job c starts registering as it is killed, job d right after: their
RegisterJob calls (and the joins of their second workers) meet a dead controller and are retried until it
is back.
(A worker waiting in its job's first generation barrier, SyncGeneration, waits for the controller: the
barrier is the controller's.)
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from controller.topology import Topology
from host_agent.agent import Agent, AgentOptions
from host_agent.options import StreamOptions
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.commands import Command, command_argv
from inaproto.credentials import admission_channel
from softswitch.udp import UdpSwitch
from topologies.experiments.testbed import free_port
from topologies.loopback import LocalSwitch, exact_sum, local_job, run_workers, star_topology, write_admin_credential
from topologies.netns import Process

HOSTS = {"a": ["h11", "h12"], "b": ["h13", "h14"], "c": ["h15", "h16"], "d": ["h17", "h18"]}
ELEMENTS = 3000


class Bed:
    """One switch (in process, bridged to UDP), a controller process started and killed at will."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.switch = LocalSwitch(device_id=1)
        doc = star_topology({"s1": self.switch}, hosts_per_switch=8, pool=64)
        self.ports = {host: Topology.from_dict(doc).locate(host)[1] for host in doc["hosts"]}
        self.macs = {host: h["mac"] for host, h in doc["hosts"].items()}
        self.topology = tmp / "topology.json"
        self.topology.write_text(json.dumps(doc))
        self.admin = write_admin_credential(tmp / "admin.credential")
        self.listen = f"127.0.0.1:{free_port()}"
        self.channel = admission_channel(self.listen, self.admin.read_text().strip())
        self.stub = pb_grpc.AdmissionStub(self.channel)
        self.bridge = UdpSwitch("s1", pipeline=self.switch.pipeline)
        self.controller: Process | None = None
        self.procs: list[Process] = []

    def start_controller(self) -> None:
        argv = [*command_argv(Command.CONTROLLER), "--topology", str(self.topology), "--db", str(self.tmp / "ctl.db"),
                "--listen", self.listen, "--set", f"admin_credential={self.admin}", "--set", "sync_timeout=20"]
        self.controller = Process(argv, self.tmp / f"controller-{len(self.procs)}.log")
        self.procs.append(self.controller)
        self.controller.wait_until(self._serving, 30, "ina-controller serving")

    def _serving(self) -> bool:
        try:
            self.stub.GetPolicy(pb.GetPolicyRequest(), timeout=0.5)
            return True
        except grpc.RpcError:
            return False

    def kill_controller(self) -> None:
        self.controller.popen.kill()  # SIGKILL: no cleanup of any kind
        self.controller.popen.wait(5)
        self.controller.stop()

    def jobs(self) -> list[pb.JobInfo]:
        return list(self.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs)

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        self.channel.close()
        self.bridge.close()
        self.switch.stop()


@pytest.fixture
def bed(tmp_path):
    b = Bed(tmp_path)
    try:
        yield b
    finally:
        b.close()


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_agents_ride_out_a_controller_killed_during_registration(bed):
    bed.start_controller()
    jobs = {}
    for name, hosts in HOSTS.items():
        spec, sockets = local_job(2, name, hosts=hosts, backend="ina")
        jobs[name] = replace(spec, requested_slots=16), sockets  # 4 x 16 of the 64 slots: no job waits
    for name, (spec, sockets) in jobs.items():
        for host, (udp, _) in zip(HOSTS[name], sockets):
            # the host's port and its NIC's MAC: what the controller binds the worker to (ingress binding)
            bed.bridge.attach("127.0.0.1", udp.getsockname()[1], bed.ports[host], mac=bed.macs[host])
    opts = AgentOptions(stream=StreamOptions(op_timeout=30.0), close_timeout=10.0, controller_retry=30.0,
                        switch_addresses={"s1": bed.bridge.address})
    rng = np.random.default_rng(7)
    inputs = {name: [rng.standard_normal(ELEMENTS).astype(np.float32) for _ in range(2)] for name in jobs}
    down = threading.Event()
    restarted = threading.Event()
    during_outage = {name: 0 for name in jobs}
    all_reducing = {name: threading.Event() for name in jobs}
    calls = {name: {"floor": 0, "limit": None} for name in jobs}
    calls_lock = threading.Lock()

    def another_call(name: str, done: int) -> bool:
        """One decision per job, which both workers follow: a and b all-reduce until the controller is back (and at
        least 3 times), c and d 3 times. A worker that decided to go on commits its peer to that call too (decided
        apart, one worker could start a call its peer, seeing the restart a moment later, never joins)."""
        with calls_lock:
            c = calls[name]
            if c["limit"] is None:
                enough = done >= 3 and (name not in "ab" or restarted.is_set())
                if not enough or done < c["floor"]:
                    c["floor"] = max(c["floor"], done + 1)
                    return True
                c["limit"] = done
            return done < c["limit"]

    def run_job(name: str) -> list:
        spec, sockets = jobs[name]

        def worker(i: int):
            agent = Agent(spec, i, controller=bed.listen, sock=sockets[i][0], listener=sockets[i][1], options=opts)
            try:
                outs = []
                while another_call(name, len(outs)):
                    outs.append(agent.allreduce(inputs[name][i]))
                    all_reducing[name].set()
                    if down.is_set() and not restarted.is_set() and i == 0:
                        during_outage[name] += 1
                return agent.backend, outs
            finally:
                agent.close()

        return run_workers(2, worker, timeout=120)

    results: dict[str, list] = {}

    def launch(name: str) -> threading.Thread:
        t = threading.Thread(target=lambda: results.__setitem__(name, run_job(name)), name=f"job-{name}", daemon=True)
        t.start()
        return t

    threads = [launch("a"), launch("b")]
    wait_for(lambda: all_reducing["a"].is_set() and all_reducing["b"].is_set(), 60, "jobs a and b all-reducing")
    threads.append(launch("c"))
    bed.kill_controller()  # while c registers (its call may be in flight: then its retry is recognised by its key)
    down.set()
    threads.append(launch("d"))  # d's RegisterJob surely meets the dead controller
    time.sleep(2.0)  # the scenario: the controller is down for 2 s
    wait_for(lambda: during_outage["a"] > 0 and during_outage["b"] > 0, 60,
             "jobs a and b all-reducing through the switch while the controller is down")
    bed.start_controller()
    restarted.set()
    for t in threads:
        t.join(150)
    assert not any(t.is_alive() for t in threads)
    for name in jobs:
        want = exact_sum(inputs[name])
        for i, result in enumerate(results[name]):
            assert not isinstance(result, BaseException), f"job {name} worker {i}: {result!r}"
            backend, outs = result
            assert backend == "ina"
            assert all(o.tobytes() == want.tobytes() for o in outs), f"job {name} worker {i}: a sum is not exact"
    wait_for(lambda: bed.jobs() == [], 30, "every job released by its registrant")
