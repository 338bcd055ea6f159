"""One experiment testbed: topology and switches, the controller, and agents in the hosts; stopped whatever happens.

    with Testbed(StarTopo(4, bw=2), run_dir=path, target="ina-switch", pool=64, policy="equal") as bed:
        results = bed.run_jobs([AgentJob("j1", ("h1", "h2"), "allreduce", backend="ina", args=(...))])

``InaNetwork`` builds the topology, starts the switches and writes the plan (``topology.json``) into the
run directory. ``ina-controller`` runs in the root namespace on 127.0.0.1 with its own database in the run
directory and a copy of the plan's topology (``controller-topology.json``, with the switches' slot
``pool``). Agents (``ina-agent``) run inside the Mininet hosts and reach the controller at the same
127.0.0.1 address through :class:`~topologies.netns.LoopbackForward`; each writes its
results as JSON into the run directory. Every daemon's whole configuration is built here as its configuration
dataclass, written into ``config/`` as the TOML file it reads (``--config``; its command line adds only what
names this run: addresses, files, worker id), and kept in :attr:`Testbed.daemons` for results.json
(``topologies.daemons``). ``stop()`` (also on errors, Ctrl-C and SIGTERM) ends the agents,
the controller (recorded in the run state, so ``make stop`` finds it after a crash) and the network.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from controller.config import ControllerConfig
from controller.config import LogLevel as ControllerLogLevel
from host_agent.options import AgentOptions, StreamOptions
from inaproto.commands import REPO, Command, command_argv
from inaproto.credentials import new_secret
from topologies import state as run_state
from topologies.daemons import DaemonRecord, write_config
from topologies.errors import ExperimentError, TopologiesError
from topologies.netns import LoopbackForward

__all__ = ["REPO", "AgentFailure", "AgentJob", "Testbed", "agent_command", "free_port"]

BMV2_PROGRAM = REPO / "build" / "ina.json"
# Agents' UDP/TCP port (the switch's INA port is 47000). Below Linux's ephemeral range (32768-60999): inside
# it, an earlier run's connection in TIME_WAIT on the same port could make a later agent's bind fail.
INA_UDP_BASE = 21000
EXIT_GRACE = 15.0  # seconds an agent may take to exit after writing its results
AGENT_PROGRESS_TIMEOUT = 60.0  # an agent's longest wait without progress (its op and rendezvous timeouts)


# Agents share 2 cores with the switch and each other: one BLAS thread each (OpenBLAS would otherwise spin
# a thread per core in every worker, and a busy machine turns a millisecond of numpy into tens).
# An agent started ahead of its job (Testbed.prestart): the lab's launcher, which runs ina-agent's main once it reads
# the job's arguments.
WARM_AGENT = (sys.executable, "-m", "topologies.experiments.warm_agent")
AGENT_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_command() -> list[str]:
    return command_argv(Command.AGENT)


class AgentFailure(TopologiesError, RuntimeError):
    """A job's agents failed or timed out; ``job`` names it, the message quotes the agent's log."""

    def __init__(self, job: str, message: str) -> None:
        super().__init__(f"job {job}: {message}")
        self.job = job


@dataclass(frozen=True)
class AgentJob:
    """One job: its workers (Mininet host names, worker id = position) and the ``ina-agent`` command.

    Args:
        name: job name (the rendezvous key at the controller).
        hosts: one host per worker.
        command: ``allreduce`` or ``train``.
        backend: ``ina``, ``ring``, ``rina`` or ``auto``.
        args: more ``ina-agent`` options of the command (``--elements``...), the same for every worker.
        worker_args: per worker id, options for that worker only (``--speed 0.5``).
        options: the agents' configuration (None: the testbed's, :meth:`Testbed.agent_options`).
        requested_slots: slots asked of the switch (None: the agent's default).
        udp_port: the workers' UDP (INA) and TCP (ring) port.
        priority, weight, min_slots: what the job tells the controller's policy (job file fields).
    """

    name: str
    hosts: tuple[str, ...]
    command: str = "allreduce"
    backend: str = "auto"
    args: tuple[str, ...] = ()
    worker_args: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    requested_slots: int | None = None
    udp_port: int = INA_UDP_BASE
    priority: int = 0
    weight: float = 0.0
    min_slots: int = 0
    tensor_elements: int = 0
    options: AgentOptions | None = None


class Testbed:
    """A started topology with a controller, for running agents.

    Args:
        topo: a topology (``StarTopo``, ``LeafSpineTopo``...).
        run_dir: where the plan, logs, controller database and agent results go.
        target: ``ina-switch`` or ``bmv2``.
        switch_opts: more switch options (``faults``, ``pcap``...: :class:`~topologies.nodes.P4Switch`'s);
            ``log_level`` is set from ``log_level``.
        pool: slots the controller hands out per switch (None: all 1024).
        policy: the controller's allocation policy.
        controller: start the controller (False: agents run ring-only, without one).
        controller_settings: more fields of the controller's configuration (``{"trees": True}``).
        agent_timeout: longest wait for one job's agents.
        progress: where progress lines go.
        on_linger: called with "<job> worker <id>" when an agent had to be stopped after writing its results.
        on_daemons: called with :attr:`daemons` (as results.json records it) whenever a daemon started.
    """

    def __init__(
        self,
        topo: Any,
        *,
        run_dir: Path,
        target: str = "ina-switch",
        switch_opts: Mapping[str, Any] | None = None,
        pool: int | None = None,
        policy: str = "first-fit",
        controller: bool = True,
        log_level: str = "warn",
        agent_timeout: float = 180.0,
        heartbeat_timeout: float = 15.0,
        progress: Callable[[str], None] | None = None,
        on_linger: Callable[[str], None] | None = None,
        controller_settings: Mapping[str, Any] | None = None,
        on_daemons: Callable[[dict], None] | None = None,
    ) -> None:
        self.topo = topo
        self.run_dir = Path(run_dir).resolve()  # handed to child processes, which run elsewhere
        self.target = target
        self.switch_opts = dict(switch_opts or {})
        self.switch_opts.setdefault("log_level", log_level)
        self.pool = pool
        self.policy = policy
        self.want_controller = controller
        self.agent_timeout = agent_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.progress = progress or (lambda text: None)
        self.on_linger = on_linger or (lambda worker: None)
        self.on_daemons = on_daemons or (lambda record: None)
        self.daemons = DaemonRecord()  # every daemon's whole configuration, as results.json records it
        self.job_secrets: dict[str, str] = {}  # job name -> its secret, in its job file (docs/security.md)
        self.net = None
        self.controller: subprocess.Popen | None = None
        self.controller_port: int | None = None
        self.forward: LoopbackForward | None = None
        self._agents: list[subprocess.Popen] = []
        self._launched: dict[str, float] = {}
        self._warm: dict[tuple[str, int], subprocess.Popen] = {}  # (job, worker) -> its agent, started ahead (prestart)
        self.lingered: list[str] = []  # workers stopped after writing their results (see run_jobs)
        self._exited: dict[int, float] = {}
        self._controller_count = 0
        self.device_config: Path | None = None
        if target == "bmv2":
            if self.switch_opts.get("faults"):
                raise ExperimentError("fault injection (--fault-*) exists only on ina-switch; run this experiment with --switch ina-switch")
            if not BMV2_PROGRAM.exists():
                raise ExperimentError(f"--switch bmv2 needs the compiled program {BMV2_PROGRAM.relative_to(REPO)} (run `make p4` where p4c is installed)")
            self.switch_opts.setdefault("program", str(BMV2_PROGRAM))
            self.device_config = BMV2_PROGRAM
        elif target != "ina-switch":
            raise ExperimentError(f"unknown switch target {target!r}: choose ina-switch or bmv2")
        try:  # the settings of every controller start; each start adds its topology, database and address
            self.controller_config = ControllerConfig(
                heartbeat_timeout=heartbeat_timeout, log_level=ControllerLogLevel.WARNING,
                device_config=self.device_config, **dict(controller_settings or {}))
        except (TypeError, ValueError) as exc:
            raise ExperimentError(f"controller settings: {exc}") from None
        timeout = min(AGENT_PROGRESS_TIMEOUT, agent_timeout)
        self.agent_options = AgentOptions(stream=StreamOptions(op_timeout=timeout), rendezvous_timeout=timeout)

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> Testbed:
        from topologies.network import InaNetwork
        from topologies.nodes import SwitchStartupError

        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.net = InaNetwork(self.topo, target=self.target, run_dir=self.run_dir, switch_opts=self.switch_opts)
            try:
                self.net.start()
            except (SwitchStartupError, FileNotFoundError) as exc:
                raise ExperimentError(str(exc).splitlines()[0]) from exc
            for sw in self.net.switches:
                self.daemons.add_switch(sw.name, sw.switch_config())
            self.on_daemons(self.daemons.as_dict())
            if self.want_controller:
                self.controller_port = free_port()
                self.forward = LoopbackForward([h.pid for h in self.net.hosts], self.controller_port)
                self.start_controller(pool=self.pool, policy=self.policy)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Agents, controller, forwarder, network: each stopped even if another step fails (the first
        failure is raised once everything was tried)."""
        agents, self._agents = self._agents, []
        forward, self.forward = self.forward, None
        net, self.net = self.net, None
        steps = [*(lambda p=p: _end(p) for p in agents), self.stop_controller]
        if forward is not None:
            steps.append(forward.close)
        if net is not None:
            steps.append(net.stop)
        first: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - keep stopping the rest, then raise
                first = first or exc
        if first is not None:
            raise first

    # --- controller ------------------------------------------------------------------------------------
    @property
    def controller_address(self) -> str:
        return f"127.0.0.1:{self.controller_port}"

    def controller_topology(self, pool: int | None) -> Path:
        """The plan's topology.json with the slot pool the controller should hand out."""
        doc = json.loads((self.run_dir / "topology.json").read_text())
        if pool is not None:
            for sw in doc["switches"].values():
                sw["pool"] = int(pool)
        path = self.run_dir / "controller-topology.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return path

    def start_controller(self, *, pool: int | None = None, policy: str | None = None, timeout: float = 30.0) -> None:
        """(Re)start ``ina-controller`` with this pool and policy.

        The database (``controller.db``) is kept across restarts on purpose: the controller's job-id and
        generation counters then keep counting, so a new job never takes the (job id, generation) of a job
        whose state is still in the switch's registers. A restart with another pool reallocates; the
        policy is set over the admission service (a stored policy wins over ``--policy``).
        """
        self.stop_controller()
        self.pool, self.policy = pool, policy or self.policy
        self._controller_count += 1
        k = self._controller_count
        log_path = self.run_dir / "logs" / f"controller-{k}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.controller_command(k, pool)
        with log_path.open("w") as log:
            log.write("# " + " ".join(argv) + "\n")
            log.flush()
            self.controller = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True, cwd=str(self.run_dir))
        state = run_state.current_state()
        state.add_process(run_state.ProcessRecord(
            self.controller.pid, run_state.process_start_time(self.controller.pid), "controller", "ina-controller",
            group=True, log=str(log_path)))
        deadline = time.monotonic() + timeout
        while True:
            text = log_path.read_text(errors="replace")
            if "listening on" in text:
                break
            if self.controller.poll() is not None:
                last = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
                self.stop_controller()
                raise ExperimentError(f"ina-controller exited: {last[-1] if last else 'no output'} (log: {log_path})")
            if time.monotonic() > deadline:
                self.stop_controller()
                raise ExperimentError(f"ina-controller did not start within {timeout:g} s (log: {log_path})")
            time.sleep(0.05)
        self.set_policy(self.policy)

    def controller_command(self, start: int, pool: int | None) -> list[str]:
        """The controller's ``start``-th command line with this pool (and the testbed's policy): its whole
        configuration written as ``config/controller-<start>.toml`` and recorded in :attr:`daemons`; the command line
        adds its topology, database and address (the same values), which name this run."""
        config = dataclasses.replace(self.controller_config, topology=self.controller_topology(pool),
                                     db_path=self.run_dir / "controller.db", listen=self.controller_address,
                                     policy=self.policy)
        path = write_config(config, self.run_dir / "config" / f"controller-{start}.toml",
                            f"ina-controller --config: the controller's whole configuration, start {start}")
        self.daemons.add_controller(start, config)
        self.on_daemons(self.daemons.as_dict())
        return [*command_argv(Command.CONTROLLER), "--config", str(path), "--topology", str(config.topology),
                "--db", str(config.db_path), "--listen", config.listen]

    def set_policy(self, policy: str) -> None:
        import grpc

        from inaproto import admission_pb2 as pb

        channel, stub = self.stub()
        try:
            stub.SetPolicy(pb.SetPolicyRequest(policy=policy), timeout=10)
        except grpc.RpcError as exc:
            raise ExperimentError(f"ina-controller refused policy {policy!r}: {exc.details()}") from None
        finally:
            channel.close()

    def stop_controller(self) -> None:
        p, self.controller = self.controller, None
        if p is None:
            return
        _end(p, group=True)
        run_state.current_state().remove_process(p.pid)

    def stub(self, credential: str | None = None):
        """An admission-service stub for the running controller (root namespace, 127.0.0.1), with the admin
        credential it wrote beside its database unless another ``credential`` is given."""
        from inaproto import admission_pb2_grpc as pb_grpc
        from inaproto.credentials import admission_channel, read_credential_file

        if credential is None:
            credential = read_credential_file(self.run_dir / "controller.db.admin")
        channel = admission_channel(self.controller_address, credential)
        return channel, pb_grpc.AdmissionStub(channel)

    def controller_state(self) -> dict:
        """Jobs (with grants) and the memory map, as JSON-able dicts (empty when unreachable)."""
        import grpc
        from google.protobuf import json_format

        from inaproto import admission_pb2 as pb

        channel, stub = self.stub()
        try:
            jobs = stub.ListJobs(pb.ListJobsRequest(), timeout=5)
            memory = stub.GetMemory(pb.GetMemoryRequest(), timeout=5)
            conv = lambda m: json_format.MessageToDict(m, preserving_proto_field_name=True)
            return {"jobs": conv(jobs).get("jobs", []), "memory": conv(memory).get("switches", [])}
        except grpc.RpcError:
            return {}
        finally:
            channel.close()

    # --- agents ----------------------------------------------------------------------------------------
    def host_addresses(self, hosts: Sequence[str]) -> list[tuple[str, str, str]]:
        """``(ip, mac, host)`` of each host, from the plan's topology.json."""
        doc = json.loads((self.run_dir / "topology.json").read_text())
        out = []
        for h in hosts:
            info = doc["hosts"][h]
            out.append((info["ip"].split("/")[0], info["mac"], h))
        return out

    def job_file(self, job: AgentJob) -> Path:
        """The job as ``ina-agent --job-file`` reads it (host_agent.grant.JobSpec's JSON)."""
        doc = {
            "name": job.name, "backend": job.backend, "priority": job.priority, "weight": job.weight,
            "min_slots": job.min_slots, "requested_slots": job.requested_slots or 0,
            "secret": self.job_secrets.setdefault(job.name, new_secret()),
            **({"tensor_elements": job.tensor_elements} if job.tensor_elements > 0 else {}),
            "workers": [{"worker_id": i, "ip": ip, "udp_port": job.udp_port, "mac": mac, "host": h}
                        for i, (ip, mac, h) in enumerate(self.host_addresses(job.hosts))],
        }
        path = self.run_dir / "agents" / f"{job.name}.job.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: an agent already given its arguments (a warm start reads at once) must never
        # read the file half-written while the next worker's arguments rewrite it.
        tmp = path.with_name(path.name + ".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
        return path

    def register(self, job: AgentJob) -> int:
        """Register ``job`` at the controller from here (a launcher); its job id for ``ina-agent --job-id``."""
        import grpc

        from host_agent.grant import JobSpec

        spec = JobSpec.from_json(self.job_file(job).read_text())
        channel, stub = self.stub(spec.secret)
        try:
            return int(stub.RegisterJob(spec.register_request(), timeout=10).job_id)
        except grpc.RpcError as exc:
            raise AgentFailure(job.name, f"RegisterJob refused: {exc.code().name}: {exc.details()}") from None
        finally:
            channel.close()

    def release(self, job_id: int) -> None:
        import grpc

        from inaproto import admission_pb2 as pb

        channel, stub = self.stub()
        try:
            stub.ReleaseJob(pb.ReleaseJobRequest(job_id=job_id), timeout=10)
        except grpc.RpcError:
            pass  # already released (the agents' registrant does it) or the controller is gone
        finally:
            channel.close()

    def agent_config(self, job: AgentJob) -> Path:
        """The agents' configuration of ``job`` (the same for all its workers) as the file ``ina-agent --config`` reads,
        recorded in :attr:`daemons` for its workers."""
        options = job.options or self.agent_options
        path = write_config(options, self.run_dir / "config" / f"agent-{job.name}.toml",
                            f"ina-agent --config: the whole configuration of job {job.name}'s agents")
        self.daemons.add_agents(job.name, range(len(job.hosts)), options)
        self.on_daemons(self.daemons.as_dict())
        return path

    def job_argv(self, job: AgentJob, worker_id: int, job_id: int | None = None, config: Path | None = None) -> list[str]:
        """One worker's command line: its configuration file (``config``, else :meth:`agent_config`'s), then what names
        this run (job file, worker id, results file, controller address) and the command's own options."""
        argv = [*agent_command(), job.command, "--config", str(config or self.agent_config(job)),
                "--job-file", str(self.job_file(job)), "--worker-id", str(worker_id),
                "--job-name", job.name, "--backend", job.backend, "--quiet", "--json", str(self.result_path(job, worker_id))]
        if self.controller is not None:
            argv += ["--controller", self.controller_address]
        if job.requested_slots is not None:
            argv += ["--requested-slots", str(job.requested_slots)]
        if job_id is not None:
            argv += ["--job-id", str(job_id)]
        return argv + list(job.args) + list(job.worker_args.get(worker_id, ()))

    def result_path(self, job: AgentJob, worker_id: int) -> Path:
        return self.run_dir / "agents" / f"{job.name}-w{worker_id}.json"

    def log_path(self, job: AgentJob, worker_id: int) -> Path:
        return self.run_dir / "logs" / f"agent-{job.name}-w{worker_id}.log"

    def prestart(self, jobs: Sequence[AgentJob], *, timeout: float = 60.0) -> None:
        """Start every worker's agent process of ``jobs`` ahead of its job (``topologies.experiments.warm_agent``) and
        wait until each has done its imports; :meth:`launch` then hands it its arguments instead of starting a process.

        A cluster's workers each start on a host of their own; on this 2-core testbed 16 agents' start-up (0.5-0.7
        CPU-s each) made every arriving job's completion time carry its own and slowed the jobs already running.
        Raises :class:`AgentFailure` when an agent exits or is not ready within ``timeout`` seconds."""
        assert self.net is not None, "the testbed is not started"
        ready: dict[tuple[str, int], Path] = {}
        named = {job.name: job for job in jobs}
        for job in jobs:
            for wid, host in enumerate(job.hosts):
                log_path = self.log_path(job, wid)
                log_path.parent.mkdir(parents=True, exist_ok=True)
                flag = log_path.with_suffix(".ready")
                flag.unlink(missing_ok=True)
                argv = [*WARM_AGENT, str(flag)]
                log_path.write_text("# " + " ".join(argv) + "\n")
                with log_path.open("a") as log:  # appending: launch() adds the arguments' line to it later
                    p = self.net.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, env=AGENT_ENV)
                self._agents.append(p)
                self._warm[(job.name, wid)] = p
                ready[(job.name, wid)] = flag
        deadline = time.monotonic() + timeout
        try:
            while ready:
                for key, flag in list(ready.items()):
                    if flag.exists():
                        flag.unlink(missing_ok=True)
                        del ready[key]
                    elif self._warm[key].poll() is not None:
                        raise AgentFailure(key[0], f"worker {key[1]}'s agent exited before its job started: "
                                                   f"{self._last_line(named[key[0]], key[1])}")
                if ready and time.monotonic() > deadline:
                    raise AgentFailure(next(iter(ready))[0], f"{len(ready)} agent(s) not ready within {timeout:g} s")
                time.sleep(0.02)
        except BaseException:
            self.end_warm(jobs)  # none of them will be handed a job
            raise

    def launch(self, job: AgentJob, job_id: int | None = None) -> list[subprocess.Popen]:
        """Start every worker of ``job`` in its host (or hand a :meth:`prestart` agent its arguments); returns the
        processes (also stopped by ``stop()``)."""
        assert self.net is not None, "the testbed is not started"
        (self.run_dir / "agents").mkdir(parents=True, exist_ok=True)
        procs = []
        self._launched[job.name] = time.monotonic()
        config = self.agent_config(job)
        for wid, host in enumerate(job.hosts):
            self.result_path(job, wid).unlink(missing_ok=True)
            argv = self.job_argv(job, wid, job_id, config)
            log_path = self.log_path(job, wid)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            warm = self._warm.pop((job.name, wid), None)
            if warm is not None:
                # a prestarted agent that died is this job's failure (its log kept), not a silent cold start
                if warm.poll() is not None or warm.stdin is None:
                    raise AgentFailure(job.name, f"worker {wid}'s prestarted agent exited before its job arrived: "
                                                 f"{self._last_line(job, wid)}")
                with log_path.open("a") as log:
                    log.write("# arguments: " + " ".join(argv) + "\n")
                try:
                    warm.stdin.write((json.dumps(argv[len(agent_command()):]) + "\n").encode())
                    warm.stdin.close()
                except OSError as exc:  # it died since the check: a broken pipe
                    raise AgentFailure(job.name, f"worker {wid}'s prestarted agent did not take its arguments "
                                                 f"({exc.strerror or exc}): {self._last_line(job, wid)}") from None
                procs.append(warm)
                continue
            with log_path.open("w") as log:
                log.write("# " + " ".join(argv) + "\n")
                log.flush()
                p = self.net.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=AGENT_ENV)
            procs.append(p)
            self._agents.append(p)
        return procs

    def run_jobs(self, jobs: Sequence[AgentJob], *, timeout: float | None = None, register_first: bool = False,
                 on_admitted: Callable[[], None] | None = None) -> dict[str, list[dict]]:
        """Run jobs concurrently to completion; every worker's results JSON, per job name.

        ``register_first``: register the jobs here, in order (a deterministic admission order, which
        first-fit and priority depend on), then start every agent at once with ``--job-id`` (so the jobs
        really run at the same time), and release the jobs at the end. ``on_admitted`` is called once
        every job is registered, before any agent starts. Raises :class:`AgentFailure` if a worker fails or
        the jobs take longer than ``timeout``; the other agents are stopped first.
        """
        timeout = timeout or self.agent_timeout
        started = time.monotonic()
        running: dict[str, list[subprocess.Popen]] = {}
        job_ids: dict[str, int] = {}
        try:
            if register_first and self.controller is not None:
                for job in jobs:
                    job_ids[job.name] = self.register(job)
            if on_admitted is not None:
                on_admitted()
            for job in jobs:
                running[job.name] = self.launch(job, job_ids.get(job.name))
            next_note = time.monotonic() + 10.0
            while True:
                self._check(jobs, running)
                now = time.monotonic()
                for job in jobs:
                    for wid, p in enumerate(running.get(job.name, [])):
                        if p.pid not in self._exited and p.poll() is not None:
                            self._exited[p.pid] = now
                        elif p.poll() is None and self._lingers(job, wid, now):
                            # Its results are written and it has not exited: a hang at exit (seen: gRPC's
                            # stream finalizer at interpreter shutdown). Its work is done; stop it.
                            self._exited[p.pid] = now
                            self.lingered.append(f"{job.name} worker {wid}")
                            self.on_linger(f"{job.name} worker {wid}")
                            self.progress(f"  {job.name} worker {wid} wrote its results but did not exit within "
                                          f"{EXIT_GRACE:g} s; stopping it")
                            _end(p)
                if all(p.poll() is not None for procs in running.values() for p in procs):
                    break
                now = time.monotonic()
                if now - started > timeout:
                    late = [j for j, procs in running.items() if any(p.poll() is None for p in procs)]
                    raise AgentFailure(",".join(late), f"still running after {timeout:g} s (logs: {self.run_dir / 'logs'})")
                if now > next_note:
                    busy = sum(p.poll() is None for procs in running.values() for p in procs)
                    self.progress(f"  ... {busy} agent(s) still running, {now - started:.0f} s")
                    next_note = now + 10.0
                time.sleep(0.02)
        finally:
            self._end_agents(running)
            self.end_warm(jobs)
            for job_id in job_ids.values():
                self.release(job_id)
        return self._collect(jobs, running, started)

    def run_trace(self, jobs: Sequence[AgentJob], arrivals: Mapping[str, float], *, timeout: float | None = None,
                  sample_every: float = 0.25, on_sample: Callable[[float], None] | None = None) -> dict[str, list[dict]]:
        """Run a job trace: each job is registered at the controller and its agents started at its arrival
        (seconds after the start), and released as soon as all its workers have exited, so that its slots
        go to the others at once. ``on_sample(t)`` is called every ``sample_every`` seconds (memory in use).
        Each worker's results get ``runner``: launched_s, exited_s, arrival_s (seconds after the start)."""
        timeout = timeout or self.agent_timeout
        started = time.monotonic()
        started_unix = time.time()
        pending = sorted(jobs, key=lambda j: (arrivals.get(j.name, 0.0), j.name))
        running: dict[str, list[subprocess.Popen]] = {}
        job_ids: dict[str, int] = {}
        released: set[str] = set()
        next_sample = started
        try:
            while True:
                now = time.monotonic()
                while pending and now - started >= arrivals.get(pending[0].name, 0.0):
                    job = pending.pop(0)
                    if self.controller is not None:
                        job_ids[job.name] = self.register(job)
                    running[job.name] = self.launch(job, job_ids.get(job.name))
                self._check(jobs, running)
                now = time.monotonic()
                for job in jobs:
                    procs = running.get(job.name, [])
                    for wid, p in enumerate(procs):
                        if p.pid not in self._exited and p.poll() is not None:
                            self._exited[p.pid] = now
                        elif p.poll() is None and self._lingers(job, wid, now):
                            self._exited[p.pid] = now
                            self.lingered.append(f"{job.name} worker {wid}")
                            self.on_linger(f"{job.name} worker {wid}")
                            _end(p)
                    if procs and job.name not in released and all(p.poll() is not None for p in procs):
                        released.add(job.name)
                        if job.name in job_ids:
                            self.release(job_ids[job.name])
                if on_sample is not None and now >= next_sample:
                    on_sample(now - started)
                    next_sample = now + sample_every
                if not pending and all(p.poll() is not None for procs in running.values() for p in procs):
                    break
                if now - started > timeout:
                    late = [j for j, procs in running.items() if any(p.poll() is None for p in procs)]
                    raise AgentFailure(",".join(late), f"still running after {timeout:g} s (logs: {self.run_dir / 'logs'})")
                time.sleep(0.02)
        finally:
            self._end_agents(running)
            self.end_warm(jobs)
            for name, job_id in job_ids.items():
                if name not in released:
                    self.release(job_id)
        return self._collect(jobs, running, started, arrivals, started_unix)

    def warm_pids(self) -> list[int]:
        """The processes of the :meth:`prestart` agents not yet handed a job."""
        return [p.pid for p in self._warm.values()]

    def end_warm(self, jobs: Sequence[AgentJob] | None = None) -> None:
        """End the :meth:`prestart` agents no job was handed to (their stdin closed, then SIGTERM): those of ``jobs``
        (a run's own), or every one."""
        names = None if jobs is None else {job.name for job in jobs}
        warm = {k: p for k, p in self._warm.items() if names is None or k[0] in names}
        for k in warm:
            del self._warm[k]
        for p in warm.values():
            if p.stdin is not None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            _end(p)
            if p in self._agents:
                self._agents.remove(p)

    def _end_agents(self, running: Mapping[str, list[subprocess.Popen]]) -> None:
        for procs in running.values():
            for p in procs:
                _end(p)
                if p in self._agents:
                    self._agents.remove(p)

    def _collect(self, jobs: Sequence[AgentJob], running: Mapping[str, list[subprocess.Popen]], started: float,
                 arrivals: Mapping[str, float] | None = None, started_unix: float | None = None) -> dict[str, list[dict]]:
        """Every worker's results, each with ``runner``: launched_s, exited_s (and arrival_s in a trace),
        stopped_after_results; in a trace also ``timeline_s``, the agent's ``timeline`` marks in seconds after
        the trace started."""
        results: dict[str, list[dict]] = {}
        for job in jobs:
            results[job.name] = []
            for wid in range(len(job.hosts)):
                try:
                    doc = json.loads(self.result_path(job, wid).read_text())
                except (OSError, ValueError) as exc:
                    raise AgentFailure(job.name, f"worker {wid} wrote no results ({exc}); {self._last_line(job, wid)}") from None
                p = running[job.name][wid]
                runner = {"launched_s": round(self._launched[job.name] - started, 3),
                          "exited_s": round(self._exited.get(p.pid, time.monotonic()) - started, 3)}
                if arrivals is not None:
                    runner["arrival_s"] = arrivals.get(job.name, 0.0)
                runner["stopped_after_results"] = f"{job.name} worker {wid}" in self.lingered
                if started_unix is not None and isinstance(doc.get("timeline"), dict):
                    runner["timeline_s"] = {k: None if v is None else round(float(v) - started_unix, 3)
                                            for k, v in doc["timeline"].items()}
                doc["runner"] = runner
                results[job.name].append(doc)
        return results

    def _lingers(self, job: AgentJob, wid: int, now: float) -> bool:
        try:
            written = self.result_path(job, wid).stat().st_mtime
        except OSError:
            return False
        return time.time() - written > EXIT_GRACE

    def _check(self, jobs: Sequence[AgentJob], running: Mapping[str, list[subprocess.Popen]]) -> None:
        for job in jobs:
            for wid, p in enumerate(running.get(job.name, [])):
                code = p.poll()
                if code not in (None, 0) and p.pid not in self._exited:
                    raise AgentFailure(job.name, f"worker {wid} on {job.hosts[wid]} exited with status {code}: "
                                                 f"{self._last_line(job, wid)}")

    def _last_line(self, job: AgentJob, wid: int) -> str:
        try:
            lines = [ln for ln in self.log_path(job, wid).read_text(errors="replace").splitlines()
                     if ln.strip() and not ln.startswith("#")]
        except OSError:
            lines = []
        return lines[-1] if lines else f"no output (log {self.log_path(job, wid)})"


def _end(p: subprocess.Popen, *, group: bool = False, timeout: float = 5.0) -> None:
    """SIGTERM (the process group with ``group``), then SIGKILL after ``timeout``; reap it."""
    if p.poll() is not None:
        return

    def send(sig: int) -> None:
        try:
            if group:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass
