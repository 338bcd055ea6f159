"""The soak (``make soak``, not in CI): concurrent jobs for a long time under faults and controller failures.

    python bench/soak.py [--duration 600] [--jobs 8] [--loss 0.01] [--switch process|in-process] [--json summary.json]

Two set-ups (``--switch``):

- ``process`` (the default; root): the real ``ina-switch`` process in a network namespace with its own
  seeded ``--fault-drop/--fault-dup/--fault-reorder`` (each INA packet into and out of the switch), every
  worker an agent *process* in a namespace of its own joined to the switch by a veth pair
  (bench/soak_net.py); ``ina-controller`` a process in the root namespace.
- ``in-process`` (no root): ina-switch's pipeline behind its P4Runtime server in this process, bridged to
  UDP by ``softswitch.udp.UdpSwitch`` with the bridge's seeded faults; the agents are
  ``host_agent.agent.Agent`` threads of this process, all on 127.0.0.1.

Either way: ``--loss`` drop, ``--duplicate``, ``--reorder`` (default 1 % each, each way); ``ina-controller``
as a process (policy first-fit); ``--jobs`` jobs of ``--workers`` agents (backend ``auto``: INA where the
job has slots, else the ring), each job all-reducing fresh random arrays of ``--elements`` float32 again
and again. Every worker derives every worker's array from a shared seed, so each checks its result bit for
bit against the exact fixed-point sum. Events, at fixed fractions of the run: the controller is killed with
SIGKILL and restarted 2 s later at 1/3 and 2/3, and the policy is set to ``equal`` (every job reallocated:
new generation, barrier, resend) at 1/2.

The summary counts all-reduces, wrong results (any bit differing), lost chunks (chunks of all-reduces that
failed or never finished) and the agents' recovery work (retransmissions per chunk sent, split into early
resends, timer expiries and spurious resends; resyncs, replayed chunks).
A job stops once every worker has seen the deadline: the last element of each all-reduce is a vote.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import grpc
import numpy as np
from soak_net import SwitchBed, SwitchFaults, exact_sum, inputs, write_config

from controller.config import ControllerConfig
from controller.config import LogLevel as ControllerLogLevel
from host_agent.agent import Agent, AgentOptions, bind_worker_sockets
from host_agent.grant import JobSpec, Worker
from host_agent.options import StreamOptions
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto import wire
from inaproto.commands import Command, command_argv
from inaproto.credentials import admission_channel, new_secret
from p4src.ina_model import InaPipeline
from softswitch.p4runtime_server import P4RuntimeServer
from softswitch.udp import Faults, UdpSwitch
from topologies.daemons import write_config as write_daemon_config


class SwitchMode(str, Enum):
    """Where the switch and the agents run."""

    PROCESS = "process"  # ina-switch process in a namespace, agents as processes in namespaces (root)
    IN_PROCESS = "in-process"  # pipeline + UDP bridge in this process, agents as threads (no root)


@dataclass(frozen=True)
class SoakOptions:
    duration: float = 600.0
    jobs: int = 8
    workers: int = 2
    elements: int = 4096
    slots: int = 200  # requested per job: first-fit gives 5 jobs 200, one the 24 left, two none (ring);
    # the policy change to equal gives every job 128 (1024 / 8): every job moves (new generation, barrier)
    loss: float = 0.01
    duplicate: float = 0.01
    reorder: float = 0.01
    kills: int = 2
    outage: float = 2.0  # seconds the controller stays down
    seed: int = 1
    folder: Path | None = None
    switch: SwitchMode = SwitchMode.PROCESS


@dataclass
class JobTally:
    name: str
    allreduces: int = 0
    wrong: int = 0
    failed_calls: int = 0
    lost_chunks: int = 0
    errors: list = field(default_factory=list)
    chunks: int = 0  # chunks the workers sent (first transmissions)
    retransmits: int = 0
    early_resends: int = 0  # resent before the timer: found lost (RACK) or tail probes
    timeouts: int = 0  # retransmission timer expiries
    spurious_resends: int = 0  # resent chunks whose original had reached the switch
    resyncs: int = 0
    replayed_chunks: int = 0
    generations: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, opts: SoakOptions) -> None:
        self.opts = opts
        self.folder = Path(opts.folder or tempfile.mkdtemp(prefix="ina-soak-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pipeline: InaPipeline | None = None
        self.p4rt: P4RuntimeServer | None = None
        self.bridge: UdpSwitch | None = None
        self.bed: SwitchBed | None = None
        controller_port = _free_port()
        n_hosts = opts.jobs * opts.workers
        if opts.switch is SwitchMode.PROCESS:
            faults = SwitchFaults(opts.loss, opts.duplicate, opts.reorder, opts.seed)
            self.bed = SwitchBed(n_hosts, self.folder, faults, controller_port)
            doc = self.bed.topology()
        else:
            self.pipeline = InaPipeline()
            self.p4rt = P4RuntimeServer(self.pipeline, device_id=1, address="127.0.0.1:0")
            grpc_port = self.p4rt.start()
            self.bridge = UdpSwitch("s1", pipeline=self.pipeline, seed=opts.seed,
                                    faults=Faults(drop=opts.loss, duplicate=opts.duplicate, reorder=opts.reorder))
            doc = {"hosts": {}, "switches": {"s1": {"grpc": f"127.0.0.1:{grpc_port}", "device_id": 1, "pool": wire.NUM_SLOTS,
                                                    "switch_ip": "10.0.0.254", "switch_mac": "02:00:00:00:00:fe"}},
                   "links": []}
            for i in range(1, n_hosts + 1):
                doc["hosts"][f"h{i}"] = {"ip": f"10.0.{i // 250}.{i % 250 + 1}/16", "mac": f"02:00:00:00:{i // 256:02x}:{i % 256:02x}"}
                doc["links"].append([f"h{i}", f"s1-p{i}"])
        self.topology = self.folder / "topology.json"
        self.topology.write_text(json.dumps(doc, indent=2))
        self.admin = self.folder / "admin.credential"
        with os.fdopen(os.open(self.admin, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(new_secret() + "\n")
        self.listen = f"127.0.0.1:{controller_port}"
        self.channel = admission_channel(self.listen, self.admin.read_text().strip())
        self.stub = pb_grpc.AdmissionStub(self.channel)
        self.controller: subprocess.Popen | None = None
        self.starts = 0
        self.events: list[tuple[float, str]] = []
        self.t0 = time.monotonic()

    # --- the controller -----------------------------------------------------------------------------------
    def start_controller(self) -> None:
        self.starts += 1
        log = (self.folder / f"controller-{self.starts}.log").open("w")
        config = ControllerConfig(topology=self.topology, db_path=self.folder / "ctl.db", listen=self.listen,
                                  admin_credential=self.admin, log_level=ControllerLogLevel.WARNING)
        path = write_daemon_config(config, self.folder / "controller.toml", "ina-controller --config: the soak's controller")
        argv = [*command_argv(Command.CONTROLLER), "--config", str(path)]
        self.controller = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.stub.GetPolicy(pb.GetPolicyRequest(), timeout=0.5)
                break
            except grpc.RpcError:
                if self.controller.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ina-controller did not start (log: {log.name})") from None
                time.sleep(0.05)
        self.event("controller started" if self.starts == 1 else "controller restarted")

    def kill_controller(self) -> None:
        if self.controller is not None and self.controller.poll() is None:
            os.killpg(self.controller.pid, signal.SIGKILL)
            self.controller.wait(10)
        self.event("controller killed (SIGKILL)")

    def event(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.t0, 1), what))
        print(f"soak: {time.monotonic() - self.t0:7.1f} s  {what}", flush=True)

    # --- the jobs -----------------------------------------------------------------------------------------
    def run_job(self, k: int, deadline: float, tally: JobTally) -> None:
        if self.bed is not None:
            self.run_job_processes(k, deadline, tally)
        else:
            self.run_job_threads(k, deadline, tally)

    def run_job_processes(self, k: int, deadline: float, tally: JobTally) -> None:
        """The job's workers as processes in their namespaces (bench/soak_net.py); their tallies added up."""
        o = self.opts
        assert self.bed is not None
        hosts = [k * o.workers + i + 1 for i in range(o.workers)]
        secret = new_secret()
        wall_deadline = time.time() + (deadline - time.monotonic())
        procs = []
        for i, port in enumerate(hosts):
            config = self.folder / f"soak-{k}-w{i}.json"
            write_config(config, {"name": f"soak-{k}", "job": k, "worker": i, "hosts": hosts, "secret": secret,
                                  "elements": o.elements, "slots": o.slots, "seed": o.seed, "deadline": wall_deadline,
                                  "controller": self.listen, "result": str(self.folder / f"soak-{k}-w{i}.result.json")})
            procs.append(self.bed.start_worker(port, config, self.folder / f"soak-{k}-w{i}.log"))
        chunks = math.ceil((o.elements + 1) / wire.LANES)
        for i, proc in enumerate(procs):
            try:
                proc.popen.wait(max(60.0, deadline - time.monotonic() + 120.0))
            except subprocess.TimeoutExpired:
                proc.stop()
            result_path = self.folder / f"soak-{k}-w{i}.result.json"
            try:
                r = json.loads(result_path.read_text())
            except (OSError, ValueError):
                r = {"error": f"no result (exit {proc.popen.returncode}; log {proc.log_path})"}
            if i == 0:
                tally.allreduces += r.get("allreduces", 0)
            tally.wrong += r.get("wrong", 0)
            if r.get("error"):
                tally.failed_calls += 1
                tally.lost_chunks += chunks
                tally.errors.append(f"worker {i}: {r['error']}")
            for name in ("chunks", "retransmits", "early_resends", "timeouts", "spurious_resends", "resyncs", "replayed_chunks"):
                setattr(tally, name, getattr(tally, name) + r.get(name, 0))
            tally.generations = max(tally.generations, r.get("generations", 0))

    def run_job_threads(self, k: int, deadline: float, tally: JobTally) -> None:
        """The job's workers as Agent threads of this process, behind the UDP bridge."""
        o = self.opts
        assert self.bridge is not None
        sockets = [bind_worker_sockets("127.0.0.1") for _ in range(o.workers)]
        workers = tuple(Worker(i, "127.0.0.1", s[0].getsockname()[1], "", f"h{k * o.workers + i + 1}")
                        for i, s in enumerate(sockets))
        for i, (udp, _) in enumerate(sockets):
            port = k * o.workers + i + 1  # host h<port>: its NIC's MAC is what the controller binds (ingress binding)
            self.bridge.attach("127.0.0.1", udp.getsockname()[1], port, mac=f"02:00:00:00:{port // 256:02x}:{port % 256:02x}")
        spec = JobSpec(f"soak-{k}", workers, backend="auto", tensor_elements=o.elements, requested_slots=o.slots,
                       secret=new_secret())
        opts = AgentOptions(stream=StreamOptions(op_timeout=60.0), rendezvous_timeout=60.0, close_timeout=15.0,
                            switch_addresses={"s1": self.bridge.address})
        chunks = math.ceil((o.elements + 1) / wire.LANES)
        lock = threading.Lock()

        def worker(i: int) -> None:
            agent = None
            try:
                agent = Agent(spec, i, controller=self.listen, sock=sockets[i][0], listener=sockets[i][1], options=opts)
                call = 0
                while True:
                    arrays = inputs(o.seed, k, call, o.workers, o.elements)
                    vote = np.float32(1.0 if time.monotonic() < deadline else 0.0)
                    out = agent.allreduce(np.append(arrays[i], vote))
                    want = exact_sum(arrays)
                    with lock:
                        if i == 0:
                            tally.allreduces += 1
                        if out[:-1].tobytes() != want.tobytes():
                            tally.wrong += 1
                    if out[-1] < o.workers - 0.5:  # someone has seen the deadline: this was the last call
                        break
                    call += 1
                s = agent.stats
                with lock:
                    for name in ("chunks", "retransmits", "early_resends", "timeouts", "spurious_resends", "resyncs",
                                 "replayed_chunks"):
                        setattr(tally, name, getattr(tally, name) + getattr(s, name))
                    tally.generations = max(tally.generations, len(s.generation_history))
            except Exception as exc:  # a failed call: its chunks (and the job's remaining work) are lost  # noqa: BLE001
                with lock:
                    tally.failed_calls += 1
                    tally.lost_chunks += chunks
                    tally.errors.append(f"worker {i}: {type(exc).__name__}: {exc}")
            finally:
                if agent is not None:
                    agent.close()

        threads = [threading.Thread(target=worker, args=(i,), name=f"soak-{k}-w{i}", daemon=True) for i in range(o.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def run(self) -> dict:
        o = self.opts
        self.start_controller()
        t_start = time.monotonic()
        deadline = t_start + o.duration
        tallies = [JobTally(f"soak-{k}") for k in range(o.jobs)]
        jobs = [threading.Thread(target=self.run_job, args=(k, deadline, tallies[k]), name=f"soak-{k}", daemon=True)
                for k in range(o.jobs)]
        for t in jobs:
            t.start()
        schedule = sorted([(t_start + o.duration * (n + 1) / (o.kills + 1), "kill") for n in range(o.kills)]
                          + [(t_start + o.duration / 2, "policy")])
        for at, what in schedule:
            time.sleep(max(0.0, at - time.monotonic()))
            if what == "kill":
                self.kill_controller()
                time.sleep(o.outage)
                self.start_controller()
            else:
                self.stub.SetPolicy(pb.SetPolicyRequest(policy="equal"), timeout=10)
                self.event("policy set to equal")
        for t in jobs:
            t.join(max(60.0, o.duration))
        hung = [t.name for t in jobs if t.is_alive()]
        elapsed = time.monotonic() - t_start
        self.event("jobs ended")
        leftover = [j.name for j in self.stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs]
        return {
            "options": {k: (v.value if isinstance(v, Enum) else str(v) if isinstance(v, Path) else v)
                        for k, v in asdict(o).items()},
            "folder": str(self.folder),
            "seconds": round(elapsed, 1),
            "allreduces": sum(t.allreduces for t in tallies),
            "wrong_results": sum(t.wrong for t in tallies),
            "lost_chunks": sum(t.lost_chunks for t in tallies),
            "failed_calls": sum(t.failed_calls for t in tallies),
            "hung_jobs": hung,
            "jobs_left_registered": leftover,
            "chunks_sent": sum(t.chunks for t in tallies),
            "retransmits": sum(t.retransmits for t in tallies),
            "early_resends": sum(t.early_resends for t in tallies),
            "timeouts": sum(t.timeouts for t in tallies),
            "spurious_resends": sum(t.spurious_resends for t in tallies),
            "retransmits_per_chunk": round(sum(t.retransmits for t in tallies) / max(1, sum(t.chunks for t in tallies)), 4),
            "resyncs": sum(t.resyncs for t in tallies),
            "replayed_chunks": sum(t.replayed_chunks for t in tallies),
            "controller_starts": self.starts,
            "events": self.events,
            "jobs": [asdict(t) for t in tallies],
            "load": os.getloadavg(),
        }

    def close(self) -> None:
        if self.controller is not None and self.controller.poll() is None:
            self.controller.terminate()
            try:
                self.controller.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.controller.pid, signal.SIGKILL)
        self.channel.close()
        if self.bridge is not None:
            self.bridge.close()
        if self.p4rt is not None:
            self.p4rt.stop()
        if self.bed is not None:
            self.bed.switch.stop()  # SIGTERM: it logs its fault counters as it ends
            fault_lines = [line for line in self.bed.switch_log().splitlines() if "faults " in line]
            self.bed.close()
            for line in fault_lines:
                print(f"soak: ina-switch {line.split('] ')[-1]}", flush=True)


def summary_lines(s: dict) -> list[str]:
    o = s["options"]
    return [
        (f"soak: {o['jobs']} jobs x {o['workers']} workers, {o['elements']} elements per all-reduce, {s['seconds']} s, "
        f"faults loss {o['loss']:.0%} duplicate {o['duplicate']:.0%} reorder {o['reorder']:.0%} (each way), "
        f"{s['controller_starts'] - 1} controller kill(s) + restart(s), policy change"),
        (f"  all-reduces: {s['allreduces']}   wrong results: {s['wrong_results']}   lost chunks: {s['lost_chunks']}   "
        f"failed calls: {s['failed_calls']}   hung jobs: {len(s['hung_jobs'])}"),
        (f"  switch: {o['switch']}; recovery: {s['retransmits']} retransmissions of {s['chunks_sent']} chunks sent "
        f"({s['retransmits_per_chunk']:.3f} per chunk: {s['early_resends']} early, {s['timeouts']} timer expiries, "
        f"{s['spurious_resends']} spurious), {s['resyncs']} resyncs, {s['replayed_chunks']} replayed chunks"),
        f"  load average at the end: {' '.join(f'{x:.2f}' for x in s['load'])}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="soak", description=__doc__.splitlines()[0])
    d = SoakOptions()
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of all-reducing (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=d.jobs)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--elements", type=int, default=d.elements)
    p.add_argument("--loss", type=float, default=d.loss)
    p.add_argument("--duplicate", type=float, default=d.duplicate)
    p.add_argument("--reorder", type=float, default=d.reorder)
    p.add_argument("--kills", type=int, default=d.kills)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--switch", choices=[m.value for m in SwitchMode], default=d.switch.value,
                   help="process: the ina-switch process and agent processes in namespaces (root; default); "
                        "in-process: pipeline, UDP bridge and agent threads in this process")
    p.add_argument("--folder", type=Path, help="logs and database (default: a new folder under /tmp)")
    p.add_argument("--json", type=Path, help="write the summary as JSON here")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.jobs < 1 or args.workers < 1 or args.elements < 1:
        p.error("--duration, --jobs, --workers and --elements must be positive")
    opts = replace(d, duration=args.duration, jobs=args.jobs, workers=args.workers, elements=args.elements,
                   loss=args.loss, duplicate=args.duplicate, reorder=args.reorder, kills=args.kills, seed=args.seed,
                   folder=args.folder, switch=SwitchMode(args.switch))
    if opts.switch is SwitchMode.PROCESS and os.geteuid() != 0:
        p.error("--switch process needs root (network namespaces); use --switch in-process")
    soak = Soak(opts)
    try:
        result = soak.run()
    finally:
        soak.close()
    for line in summary_lines(result):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = result["wrong_results"] == 0 and result["lost_chunks"] == 0 and not result["hung_jobs"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
