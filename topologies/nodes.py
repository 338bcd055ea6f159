"""Mininet nodes for P4 switches: the switch (BMv2 or ina-switch, same flags), quiet hosts, veth links.

- :class:`P4Switch` launches ``simple_switch_grpc`` (BMv2) or ``ina-switch``, both named on their command line
  the same way (``--device-id``, ``-i PORT@IFACE``, the program, the P4Runtime gRPC server on 127.0.0.1, the
  CPU port). Its whole configuration is one ``softswitch.config.SwitchConfig`` (:meth:`P4Switch.switch_config`),
  written as ``<name>.toml`` beside the run's other files: ina-switch reads it (``--config``); BMv2, which
  reads no file, gets its settings (logging, pcaps) as its own flags. It waits until the gRPC port answers,
  and stops the switch with SIGTERM, then SIGKILL. A switch that does not come up raises
  :class:`SwitchStartupError` naming its log file and quoting the log's last lines. Like Mininet's own switches and p4lang/tutorials', the process runs in the root
  network namespace, so that its gRPC server is reachable on 127.0.0.1; its ports (``ina-s1-p1``...) are
  veth ends in the root namespace that are bridged to nothing, carry no address and have IPv6 and IPv4
  forwarding off.
- :class:`P4Host`: a Mininet host with IPv6 off (no router solicitations, MLD or DAD: switches see only
  the project's traffic), checksum offloads off (as P4 hosts need), static ARP entries for the switch's
  INA address and the other hosts (the P4 switch answers no ARP) and a default route via its switch.
- :class:`InaLink`: a ``TCLink`` (htb bandwidth limits work here; netem does not exist on this kernel,
  so delay and loss come from ina-switch's fault options) whose root-namespace ends are silenced before
  they come up, and recorded for cleanup.

BMv2 caveat: a ``simple_switch_grpc`` built with Thrift also listens on 0.0.0.0 (port ``--thrift-port``,
9090 by default) and has no option to bind it to 127.0.0.1. Each switch gets its own Thrift port here
(9090 + device id); on a machine where that matters, run BMv2 inside a namespace of its own and reach its
gRPC port through a forwarder (docs/topologies.md).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mininet.link import TCIntf, TCLink
from mininet.log import debug
from mininet.node import Host, Switch
from mininet.util import makeIntfPair

from inaproto import wire
from inaproto.commands import REPO, Command, command_argv
from inaproto.config import load
from p4src.p4info import P4INFO_PATH
from p4src.v1model import P4RUNTIME_PORT
from softswitch.config import FaultSettings, LogConfig, LogLevel, SwitchConfig
from topologies import state as run_state
from topologies.daemons import write_config
from topologies.errors import TopologiesError
from topologies.plan import Route

__all__ = [
    "DEFAULT_BMV2_JSON",
    "DEFAULT_P4INFO",
    "REPO_ROOT",
    "TARGETS",
    "InaIntf",
    "InaLink",
    "P4Host",
    "P4Switch",
    "SwitchStartupError",
    "bmv2_settings",
    "default_run_dir",
    "fault_settings",
    "resolve_target",
]

REPO_ROOT = REPO
DEFAULT_P4INFO = P4INFO_PATH
DEFAULT_BMV2_JSON = REPO_ROOT / "build" / "ina.json"
TARGETS = ("ina-switch", "bmv2", "auto")
DEFAULT_GRPC_PORT = P4RUNTIME_PORT
DEFAULT_THRIFT_PORT = 9090
CPU_PORT = wire.CPU_PORT
LOG_TAIL_LINES = 15


class SwitchStartupError(TopologiesError, RuntimeError):
    """A switch process that did not come up: why, where its log is, and the log's last lines."""

    def __init__(self, switch: str, reason: str, log_path: Path | None, tail: str = "") -> None:
        self.switch = switch
        self.reason = reason
        self.log_path = log_path
        self.tail = tail
        text = f"switch {switch}: {reason}"
        if log_path is not None:
            text += f"; see its log {log_path}"
        if tail.strip():
            text += "; last lines:\n" + "\n".join("    " + line for line in tail.rstrip().splitlines())
        super().__init__(text)


def resolve_target(target: str) -> tuple[str, list[str]]:
    """``(kind, argv prefix)`` for ``target``: ``ina-switch``, ``bmv2`` (``simple_switch_grpc``) or ``auto``
    (BMv2 when ``simple_switch_grpc`` is on PATH, else ina-switch)."""
    if target not in TARGETS:
        raise ValueError(f"unknown switch target {target!r}: choose one of {', '.join(TARGETS)}")
    bmv2 = shutil.which("simple_switch_grpc")
    if target == "bmv2" or (target == "auto" and bmv2):
        if not bmv2:
            raise FileNotFoundError("target bmv2: simple_switch_grpc is not on PATH (install BMv2, or use target ina-switch)")
        return "bmv2", [bmv2]
    return "ina-switch", command_argv(Command.SWITCH)


_run_dir: Path | None = None
_run_dir_lock = threading.Lock()


def default_run_dir() -> Path:
    """This process's run directory: ``$INA_RUN_DIR``, else ``/tmp/ina-testbed/runs/<time>-<pid>``."""
    global _run_dir
    with _run_dir_lock:
        if _run_dir is None:
            env = os.environ.get("INA_RUN_DIR")
            _run_dir = Path(env) if env else run_state.RUNS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        return _run_dir


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


_reserved_ports: set[int] = set()
_ports_lock = threading.Lock()


def _allocate_port(preferred: int) -> int:
    """The first port at or above ``preferred`` that is free on 127.0.0.1 and not reserved by this process."""
    with _ports_lock:
        port = preferred
        while port < 65535:
            if port not in _reserved_ports and _port_free(port):
                _reserved_ports.add(port)
                return port
            port += 1
    raise RuntimeError(f"no free TCP port at or above {preferred}")


def _release_port(port: int | None) -> None:
    with _ports_lock:
        _reserved_ports.discard(port)


def _log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _as_bool(value: Any) -> bool:
    """Booleans from Python or from ``mn --switch name,key=value`` strings."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def fault_settings(faults: FaultSettings | Mapping[str, Any] | None) -> FaultSettings:
    """ina-switch's fault settings from themselves or from a mapping of its ``--fault-*`` options without the
    prefix (``{"drop": 0.01, "seed": 1, "port": 2}``: a number or a list of them each); ValueError names a bad one."""
    if isinstance(faults, FaultSettings):
        return faults
    values: dict[str, Any] = {}
    for key, value in (faults or {}).items():
        many = list(value) if isinstance(value, (list, tuple)) else [value]
        if key in ("drop", "dup", "reorder"):
            values[key] = [str(v) for v in many]
        elif key in ("port", "ports"):
            values["ports"] = [int(v) for v in many]
        elif key in ("seed", "direction", "reorder_delay"):
            values[key] = value
        else:
            raise ValueError(f"unknown fault option {key!r} (drop, dup, reorder, seed, port, direction, reorder_delay)")
    return load(FaultSettings, None, values)


def bmv2_settings(config: SwitchConfig) -> list[str]:
    """The settings of ``config`` that BMv2's ``simple_switch_grpc`` has flags for (logging, pcaps): BMv2 reads no
    configuration file, and has neither link delay nor fault injection (refused before it starts)."""
    argv = ["--log-console", "-L", config.log.level.value] if config.log.console else []
    if config.pcap_dir:
        argv.append(f"--pcap={config.pcap_dir}")  # BMv2's --pcap takes its directory only after '='
    return argv


class P4Switch(Switch):
    """A P4 switch process (BMv2 ``simple_switch_grpc`` or ``ina-switch``) behind a Mininet switch node.

    Args:
        name: node name (``s1``); its ports become ``-i PORT@IFACE`` options.
        target: ``ina-switch``, ``bmv2`` or ``auto`` (BMv2 when on PATH).
        device_id: P4Runtime device id (default: the number in the name, ``s3`` -> 3).
        grpc_port: gRPC port on 127.0.0.1 (default: the first free port from 9559 + device_id - 1).
        cpu_port: the CPU port (``--cpu-port``).
        program: the compiled program (BMv2 JSON) to load at start; default for BMv2 ``build/ina.json``
            when it exists; without one the switch starts with ``--no-p4`` and waits for a pipeline.
        p4info: the P4Info that routes are installed with (default ``p4src/ina.p4info.txt``).
        log_dir: where ``<name>.log`` (the switch's console output) goes; default ``<run dir>/logs``.
        config_dir: where ``<name>.toml`` (its whole configuration) goes; default ``log_dir`` when given, else
            ``<run dir>/config``.
        pcap_dir: where per-port pcaps go when ``pcap`` is true; default ``<run dir>/pcaps``.
        log_level: ``--log-console -L LEVEL`` (None: no console logging, errors still reach the log).
        ready_timeout: seconds to wait for the gRPC port.
        routes: this switch's ``ipv4_lpm`` routes (from the topology's plan).
        install_routes: install ``routes`` over P4Runtime as soon as the switch is up (for ``mn --custom``,
            where no controller runs; leave False when a controller programs the switch).
        faults: ina-switch's fault injection: a ``FaultSettings`` or its ``--fault-*`` options as a mapping,
            e.g. ``{"drop": 0.01, "seed": 1, "port": 2}`` (BMv2 has none: refused there).
        link_delay_ms: ``{port: ms}`` held each way on those ports (``link_delay``; the topologies set it from
            ``rtt_ms``). BMv2 cannot delay frames: refused there.
        extra_args: more command-line options before the program argument.
        executable: the command to run instead of the target's (tests use a stand-in).
        ina_ip, ina_mac, ina, rack, role: the switch's INA address and role, kept for the controller.
    """

    def __init__(
        self,
        name: str,
        *,
        target: str = "auto",
        device_id: int | None = None,
        grpc_port: int | None = None,
        cpu_port: int | None = CPU_PORT,
        program: str | Path | None = None,
        p4info: str | Path | None = None,
        log_dir: str | Path | None = None,
        config_dir: str | Path | None = None,
        pcap_dir: str | Path | None = None,
        pcap: bool = False,
        log_level: str | None = "info",
        ready_timeout: float = 30.0,
        routes: Iterable[Route | Mapping] = (),
        install_routes: bool = False,
        faults: FaultSettings | Mapping[str, Any] | None = None,
        link_delay_ms: Mapping[int, float] | None = None,
        extra_args: Sequence[str] = (),
        executable: str | Sequence[str] | None = None,
        thrift_port: int | None = None,
        ina_ip: str | None = None,
        ina_mac: str | None = None,
        ina: bool = True,
        rack: int = 0,
        role: str = "tor",
        batch: bool = False,
        **params: Any,
    ) -> None:
        if params.get("inNamespace"):
            raise ValueError(f"{name}: a P4 switch runs in the root namespace (its gRPC server is on 127.0.0.1)")
        # Everything that can fail is checked before Mininet starts the node's shell.
        self.kind, command = resolve_target(target)
        if executable is not None:
            command = shlex.split(executable) if isinstance(executable, str) else list(executable)
        self.command = command
        self.faults = fault_settings(faults)
        if self.faults != FaultSettings() and self.kind == "bmv2":
            raise ValueError(f"{name}: fault options are an ina-switch feature; BMv2 has none")
        self.link_delay_ms = {int(p): float(ms) for p, ms in (link_delay_ms or {}).items() if float(ms) > 0}
        if self.link_delay_ms and self.kind == "bmv2":
            raise ValueError(f"{name}: link delay (rtt_ms) is an ina-switch feature; BMv2 cannot delay frames")
        self.device_id = int(device_id) if device_id is not None else self._device_id_from_name(name)
        self.routes = tuple(r if isinstance(r, Route) else Route(**r) for r in routes)
        self.cpu_port = int(cpu_port) if cpu_port is not None else None
        if program is None and self.kind == "bmv2" and DEFAULT_BMV2_JSON.exists():
            program = DEFAULT_BMV2_JSON
        self.program = Path(program) if program else None
        self.p4info = Path(p4info) if p4info else DEFAULT_P4INFO
        run_dir = default_run_dir()
        self.log_dir = Path(log_dir) if log_dir else run_dir / "logs"
        self.config_path = (Path(config_dir) if config_dir else self.log_dir if log_dir else run_dir / "config") / f"{name}.toml"
        self.pcap_dir = Path(pcap_dir) if pcap_dir else run_dir / "pcaps"
        self.pcap = _as_bool(pcap)
        if log_level is not None:
            LogLevel(log_level)  # a level BMv2 and ina-switch know (ValueError before anything starts)
        self.log_level = log_level
        self.log_path = self.log_dir / f"{name}.log"
        self.ready_timeout = float(ready_timeout)
        self.install_routes = _as_bool(install_routes)
        self.extra_args = list(extra_args)
        self.thrift_port = thrift_port
        self.ina_ip, self.ina_mac, self.ina, self.rack, self.role = ina_ip, ina_mac, _as_bool(ina), rack, role
        self.batch = batch
        self.process: subprocess.Popen | None = None
        self._proc_start: int | None = None
        self._ready = False
        self._explicit_grpc_port = grpc_port is not None
        self.grpc_port = int(grpc_port) if grpc_port is not None else _allocate_port(DEFAULT_GRPC_PORT + self.device_id - 1)
        params["inNamespace"] = False
        try:
            super().__init__(name, **params)
        except BaseException:
            if not self._explicit_grpc_port:
                _release_port(self.grpc_port)
            raise
        self._state = run_state.current_state()
        self._state.add_process(run_state.ProcessRecord(self.pid, run_state.process_start_time(self.pid), "switch-shell", name))

    @staticmethod
    def _device_id_from_name(name: str) -> int:
        digits = re.findall(r"\d+", name)
        if not digits:
            raise ValueError(f"switch {name!r}: give a device_id (no number in the name to derive one from)")
        return int(digits[0])

    def defaultDpid(self, dpid: str | None = None) -> str:
        """Switches here have P4Runtime device ids, not datapath ids; keep Mininet's field well-formed."""
        if dpid:
            return super().defaultDpid(dpid)
        digits = re.findall(r"\d+", self.name)
        return f"{int(digits[0]) if digits else 0:016x}"

    # --- command line ------------------------------------------------------------------------------
    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def data_ports(self) -> list[tuple[int, str]]:
        """``(port, interface)`` of every data port (not Mininet's ``lo`` control interface)."""
        return [(port, intf.name) for port, intf in sorted(self.intfs.items()) if intf.name != "lo" and port > 0]

    def switch_config(self) -> SwitchConfig:
        """The switch's whole configuration: its ports, program, P4Runtime address and CPU port, logging, pcaps,
        link delay and faults (what ``<name>.toml`` holds and the run's results record)."""
        level = LogLevel(self.log_level) if self.log_level else LogLevel.WARN  # no console: warnings on stderr (the log)
        return SwitchConfig(
            device_id=self.device_id, interfaces=tuple(f"{port}@{intf}" for port, intf in self.data_ports()),
            program=str(self.program) if self.program else "", grpc_server_addr=self.grpc_address,
            cpu_port=self.cpu_port or 0, pcap_dir=str(self.pcap_dir) if self.pcap else "",
            link_delay=tuple(f"{port}:{ms:g}" for port, ms in sorted(self.link_delay_ms.items())),
            log=LogConfig(console=bool(self.log_level), level=level), faults=self.faults,
        )

    def command_line(self) -> list[str]:
        """The switch's command line. Both targets are named the same way (device id, ports, program, gRPC
        address, CPU port: BMv2's own flags); ina-switch reads its settings from ``<name>.toml`` (``--config``),
        BMv2 gets them as its flags, with a Thrift port of its own."""
        config = self.switch_config()
        if self.kind == "bmv2":
            if self.thrift_port is None:
                self.thrift_port = _allocate_port(DEFAULT_THRIFT_PORT + self.device_id)
            settings = [*bmv2_settings(config), "--thrift-port", str(self.thrift_port)]
        else:
            settings = ["--config", str(self.config_path)]
        argv = [*self.command, *settings, "--device-id", str(config.device_id)]
        for interface in config.interfaces:
            argv += ["-i", interface]
        argv += self.extra_args
        argv += [config.program] if config.program else ["--no-p4"]
        argv += ["--", "--grpc-server-addr", config.grpc_server_addr]
        if config.cpu_port:
            argv += ["--cpu-port", str(config.cpu_port)]
        return argv

    # --- start ---------------------------------------------------------------------------------------
    def start(self, controllers: Sequence[Any] = ()) -> None:
        """Launch the switch process; unless Mininet starts switches in a batch, wait until it is ready."""
        if self.process is not None and self.process.poll() is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.pcap:
            self.pcap_dir.mkdir(parents=True, exist_ok=True)
        argv = self.command_line()
        what = f"switch {self.name}'s whole configuration, " + (
            "as ina-switch --config reads it" if self.kind == "ina-switch"
            else "given to simple_switch_grpc as its command line (BMv2 reads no file)")
        write_config(self.switch_config(), self.config_path, what)
        with open(self.log_path, "wb") as log:  # the switch writes to its own copy of the file descriptor
            log.write(f"# {shlex.join(argv)}\n".encode())
            log.flush()
            if not _port_free(self.grpc_port) or _port_answers(self.grpc_port):
                reason = f"gRPC port {self.grpc_address} is already in use by another process; not started"
                log.write(f"# {reason}\n".encode())
                log.flush()
                raise SwitchStartupError(self.name, reason, self.log_path, _log_tail(self.log_path))
            debug(f"{self.name}: {shlex.join(argv)}\n")
            try:
                self.process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, cwd=str(self.log_dir),
                )
            except OSError as exc:
                log.write(f"# cannot execute: {exc}\n".encode())
                raise SwitchStartupError(self.name, f"cannot execute {argv[0]}: {exc}", self.log_path) from exc
        self._proc_start = run_state.process_start_time(self.process.pid)
        self._state.add_process(run_state.ProcessRecord(
            self.process.pid, self._proc_start, "switch", self.name, group=True, log=str(self.log_path)))
        self._ready = False
        if not self.batch:
            self.wait_until_ready()
            if self.install_routes:
                self.install_table_entries()

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Poll until the switch's gRPC port answers; SwitchStartupError if it exits or times out first."""
        if self._ready:
            return
        if self.process is None:
            raise SwitchStartupError(self.name, "was never started", self.log_path)
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        delay = 0.01
        while True:
            code = self.process.poll()
            if code is not None:
                self._after_exit()
                raise SwitchStartupError(
                    self.name, f"{self.kind} exited with code {code} before its gRPC port {self.grpc_address} answered",
                    self.log_path, _log_tail(self.log_path))
            if _port_answers(self.grpc_port):
                if self.process.poll() is None:
                    self._ready = True
                    return
                continue
            if time.monotonic() >= deadline:
                tail = _log_tail(self.log_path)
                self.stop_process()
                raise SwitchStartupError(
                    self.name, f"{self.kind} did not answer on {self.grpc_address} within "
                    f"{self.ready_timeout if timeout is None else timeout:g} s", self.log_path, tail)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def install_table_entries(self) -> int:
        """Install this switch's routes over P4Runtime (pipeline first if the switch has none). A switch without
        INA (``ina=False``) also routes every job's INA packets as plain IPv4 (``ina_transit``), as a switch
        without the program would: Rina's host members send through it to the next INA switch.

        SwitchStartupError (naming the log) if the switch refuses them."""
        from inaproto import wire
        from inaproto.job_entries import TransitEntry
        from topologies import runtime

        try:
            with runtime.RouteInstaller(self.grpc_address, self.device_id) as installer:
                installer.ensure_pipeline(self.p4info, self.program)
                written = installer.install_routes(self.routes)
                if not self.ina and _has_table(installer.switch.schema, TransitEntry.table):  # not basic.p4
                    schema = installer.switch.schema
                    written += installer.install_entries([schema.entry(t.table, t.match, t.action, t.params) for t in
                                                          (TransitEntry(j) for j in range(wire.MAX_JOBS))])
                return written
        except (runtime.SwitchError, OSError) as exc:
            raise SwitchStartupError(self.name, f"installing its routes failed: {exc}", self.log_path,
                                     _log_tail(self.log_path)) from exc

    @classmethod
    def batchStartup(cls, switches: Sequence[P4Switch]) -> list[P4Switch]:
        """Mininet calls this once all switches were launched (they start in parallel): wait for each, program them.

        If any fails, every switch of the batch is stopped before the error propagates, so that nothing is
        left running (``mn`` itself then runs its own cleanup, which knows nothing of these processes).
        """
        try:
            for sw in switches:
                sw.wait_until_ready()
            for sw in switches:
                if sw.install_routes:
                    sw.install_table_entries()
        except BaseException:
            for sw in switches:
                sw.stop_process()
            raise
        return list(switches)

    # --- stop ----------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop_process(self, timeout: float = 5.0) -> None:
        """SIGTERM the switch (its whole process group), SIGKILL it if still there after ``timeout``."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            self.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                proc.wait(timeout=5.0)
        self._after_exit()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the switch's process group (the process alone where the group is gone)."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self.process.send_signal(sig)
            except ProcessLookupError:
                pass

    def _after_exit(self) -> None:
        if self.process is not None:
            # Processes the switch itself started in its group (none expected) go with it.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._state.remove_process(self.process.pid)
        self._ready = False

    def stop(self, deleteIntfs: bool = True) -> None:
        self.stop_process()
        super().stop(deleteIntfs)

    @classmethod
    def batchShutdown(cls, switches: Sequence[P4Switch]) -> list[P4Switch]:
        """SIGTERM every switch first, then wait for each: stopping N switches takes one timeout, not N."""
        for sw in switches:
            if sw.running:
                sw.send_signal(signal.SIGTERM)
        for sw in switches:
            sw.stop(deleteIntfs=True)
        return list(switches)

    def terminate(self) -> None:
        self.stop_process()
        shell_pid = self.pid
        super().terminate()
        self._state.remove_process(shell_pid)
        if not self._explicit_grpc_port:
            _release_port(self.grpc_port)
        _release_port(self.thrift_port)

    def describe(self) -> str:
        return f"{self.name}: {self.kind} device {self.device_id} gRPC {self.grpc_address} log {self.log_path}"


class P4Host(Host):
    """A quiet host for P4 switches: IPv6 off, checksum offloads off, static ARP, default route.

    Extra parameters (from the topology): ``gateway`` (default route), ``arp`` (``(ip, mac)`` pairs),
    ``commands`` (shell commands run last, as topology.json's), ``switch_ip``/``switch_mac`` (kept for
    agents: where INA packets go).
    """

    def __init__(self, name: str, **params: Any) -> None:
        params["inNamespace"] = True
        super().__init__(name, **params)
        # Before any interface exists: no IPv6 at all in this namespace (no RS, MLD, DAD on the links).
        self.cmd(
            "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"
        )
        self.netns = run_state.netns_inode(self.pid)
        if self.netns is None or self.netns == run_state.netns_inode(1):
            raise RuntimeError(f"host {name} is not in a network namespace of its own")
        self._state = run_state.current_state()
        self._state.add_process(run_state.ProcessRecord(
            self.pid, run_state.process_start_time(self.pid), "host-shell", name, netns=self.netns))

    def config(
        self,
        gateway: str | None = None,
        arp: Iterable[Sequence[str]] = (),
        commands: Iterable[str] = (),
        switch_ip: str | None = None,
        switch_mac: str | None = None,
        **params: Any,
    ) -> dict:
        result = super().config(**params)
        self.switch_ip, self.switch_mac = switch_ip, switch_mac
        intf = self.defaultIntf()
        if intf is None:
            return result
        dev = intf.name
        script = [
            f"echo 1 > /proc/sys/net/ipv6/conf/{dev}/disable_ipv6 2>/dev/null",
            f"ethtool -K {dev} rx off tx off sg off >/dev/null 2>&1",
        ]
        for ip, mac in arp:
            script.append(f"ip neigh replace {ip} lladdr {mac} dev {dev} nud permanent")
        if gateway:
            script.append(f"ip route replace default via {gateway} dev {dev}")
        out = self.cmd("; ".join(script))
        if out.strip():
            result["errors"] = out
        for command in commands:
            self.cmd(command)
        return result

    def terminate(self) -> None:
        """End the shell and every process still in the namespace (agents, iperf3...), so that the
        namespace and its veth ends disappear with them."""
        shell_pid = self.pid
        super().terminate()
        if self.netns:
            run_state.end_netns(self.netns, timeout=2.0)
        self._state.remove_process(shell_pid)


class InaIntf(TCIntf):
    """A TC interface that drops its cleanup record when deleted; htb with an explicit quantum."""

    def bwCmds(self, *args: Any, **kwargs: Any) -> tuple[list[str], str]:
        cmds, parent = super().bwCmds(*args, **kwargs)
        # One htb class per link: its quantum only matters for sharing between classes. Setting it keeps
        # the kernel from warning "quantum of class 50001 is big" above ~16 Mbit/s.
        cmds = [c + " quantum 1514" if " htb rate " in c else c for c in cmds]
        return cmds, parent

    def delete(self) -> None:
        name, in_root = self.name, not self.node.inNamespace
        super().delete()
        if in_root:
            run_state.current_state().remove_interfaces([name])


def _silence_root_intf(name: str) -> None:
    """No IPv6 (no RS/MLD/DAD), no IPv4 forwarding, no ARP replies on a root-namespace switch port."""
    for path, value in (
        (f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6", "1"),
        (f"/proc/sys/net/ipv4/conf/{name}/forwarding", "0"),
        (f"/proc/sys/net/ipv4/conf/{name}/arp_ignore", "8"),
    ):
        try:
            Path(path).write_text(value)
        except OSError:
            pass


class InaLink(TCLink):
    """A veth pair with TC (htb) bandwidth, checksum offloads and GRO off on both ends.

    Root-namespace ends (switch ports) are recorded for cleanup and silenced before they come up.
    """

    def __init__(self, node1: Any, node2: Any, **params: Any) -> None:
        params.setdefault("cls1", InaIntf)
        params.setdefault("cls2", InaIntf)
        params.setdefault("txo", False)
        params.setdefault("rxo", False)
        super().__init__(node1, node2, **params)

    def makeIntfPair(self, intfname1: str, intfname2: str, addr1: str | None = None, addr2: str | None = None,
                     node1: Any = None, node2: Any = None, deleteIntfs: bool = True) -> Any:
        root_ends = [n for n, node in ((intfname1, node1), (intfname2, node2)) if node is not None and not node.inNamespace]
        result = makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2, deleteIntfs=deleteIntfs)
        # Recorded only once made: an existing interface of the same name (makeIntfPair fails then) is
        # never ours to delete.
        run_state.current_state().add_interfaces(root_ends)
        for name in root_ends:
            _silence_root_intf(name)
        return result


def _has_table(schema, name: str) -> bool:
    from controller.p4entity import SchemaError

    try:
        schema.table(name)
    except SchemaError:
        return False
    return True
