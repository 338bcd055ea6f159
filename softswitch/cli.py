"""``ina-switch``: the embedded switch as a process, started like BMv2's ``simple_switch_grpc``.

    ina-switch [core options] <program.json | --no-p4> [-- target options]

    simple_switch_grpc --device-id 1 -i 1@s1-eth1 -i 2@s1-eth2 --log-console -L info build/ina.json \\
        -- --grpc-server-addr 127.0.0.1:9559 --cpu-port 255
    ina-switch         --device-id 1 -i 1@s1-eth1 -i 2@s1-eth2 --log-console -L info build/ina.json \\
        -- --grpc-server-addr 127.0.0.1:9559 --cpu-port 255

The program is p4src/ina.p4 as its model (``p4src.ina_model``) runs it: a BMv2 JSON given on the command line
is checked against the model (tables, actions, counters, registers, names and widths) and refused with the
reason when it is another program; ``--no-p4`` starts without a program and drops every packet until a
client pushes one with SetForwardingPipelineConfig. Every setting is a field of ``SwitchConfig``
(softswitch/config.py): ``--config FILE`` reads them from TOML, the command line overrides the file, and
``--print-config`` prints the result. docs/switch.md has every option and each divergence from BMv2.
"""
from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from inaproto.cli import Parser, UsageError
from inaproto.config import ConfigError, add_config_arguments, from_args, to_toml
from p4src.v1model import DROP_PORT
from softswitch.config import DEFAULT_GRPC_ADDR, TRACE, LogLevel, SwitchConfig
from softswitch.dataplane import DataPlane
from softswitch.faults import FaultDirection
from softswitch.p4program import JSON_VERSION, ProgramError, check_program
from softswitch.port_socket import DataPlaneError

__all__ = ["Invocation", "UsageError", "main", "parse_args", "run"]

PROG = "ina-switch"
VERSION = "ina-switch 0.1.0 (BMv2 simple_switch_grpc command line, P4Runtime 1.4)"
MAX_PORT_COUNT = 512  # BMv2's --max-port-count default
LEVEL_CHARS = {TRACE: "T", logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E", logging.CRITICAL: "C"}

# BMv2 options ina-switch knows but does not implement, with the reason given when one is used.
REFUSED_CORE = {
    "--use-files": "reading and writing packets from pcap files is not implemented; use -i PORT@IFACE",
    "--packet-in": "nanomsg packet injection is not implemented; use -i PORT@IFACE",
    "--nanolog": "the nanomsg event logger is not implemented; use --log-console or --log-file",
    "--notifications-addr": "nanomsg notifications (learning, ageing) are not implemented; ina.p4 has neither",
    "--debugger": "the BMv2 debugger is not implemented; use -L trace",
    "--debugger-addr": "the BMv2 debugger is not implemented; use -L trace",
    "--restore-state": "restoring BMv2 state files is not implemented",
    "--trace-dir": "structured packet tracing is not implemented; use -L trace",
}
REFUSED_TARGET = {
    "--dp-grpc-server-addr": "the gRPC data-plane channel is not implemented; use -i PORT@IFACE",
    "--egress-spec-init-to-drop": "the model initialises egress_spec to 0, as BMv2 does without this option",
    "--load-modules": "BMv2 extern modules cannot be loaded into the Python model",
}
TLS_OPTIONS = ("--grpc-server-ssl", "--grpc-server-cacert", "--grpc-server-cert", "--grpc-server-key",
               "--grpc-server-with-client-auth")  # BMv2 simple_switch_grpc's names (docs/security.md)
TARGET_OPTIONS = ("--grpc-server-addr", "--cpu-port", "--drop-port", "--disable-swap", *TLS_OPTIONS, *REFUSED_TARGET)
HIDDEN = argparse.SUPPRESS  # BMv2's options that change nothing here: accepted, documented in docs/switch.md

log = logging.getLogger("ina-switch")


@dataclass(frozen=True)
class Invocation:
    """A parsed command line: the effective configuration, and what it accepted with a warning."""

    config: SwitchConfig
    warnings: tuple[str, ...] = ()


def _uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return value


class _Options:
    """An argparse parser and the one-line help of the options it shows (``--help`` fits one screen)."""

    def __init__(self, prog: str) -> None:
        self.parser = Parser(prog=prog, add_help=False, allow_abbrev=False)
        self.shown: list[str] = []

    def add(self, *names: str, help: str = HIDDEN, **kw) -> None:
        self.parser.add_argument(*names, help=help, **kw)
        if help != HIDDEN:
            metavar = f" {kw['metavar']}" if kw.get("metavar") else ""
            shown = ", ".join(names) + metavar if names[0].startswith("-") else kw.get("metavar", names[0])
            self.shown.append(f"  {shown:<30} {help}")


def _core_options() -> _Options:
    o = _Options(PROG)
    add = o.add
    add("-h", "--help", action="store_true", help="this help")
    add("-v", "--version", action="store_true", help="the version")
    add_config_arguments(o.parser)
    o.shown += [f"  {'--config FILE':<30} read settings from this TOML file (the options here override it)",
                f"  {'--set KEY=VALUE':<30} one setting over the file, as a TOML value (repeatable)",
                f"  {'--print-config':<30} print the effective settings as such a file, and exit"]
    add("program", nargs="?", metavar="JSON", help="BMv2 JSON of p4src/ina.p4 (checked against the model)")
    add("--no-p4", action="store_true", help="no program until a client pushes one (SetForwardingPipelineConfig)")
    add("-i", "--interface", action="append", metavar="PORT@IFACE", help="attach IFACE as port PORT (repeatable)")
    add("--device-id", type=_uint, metavar="N", help="P4Runtime device id (default 0, as BMv2: always give it)")
    add("--pcap", nargs="?", const=".", metavar="DIR", help="write <iface>_in.pcap and <iface>_out.pcap in DIR")
    add("--log-console", action="store_true", default=None, help="log to stdout")
    add("--log-file", metavar="FILE", help="log to FILE.txt")
    add("-L", "--log-level", choices=[v.value for v in LogLevel], metavar="LEVEL",
        help="trace (default, slow), debug, info, warn, error, off")
    add("--dump-packet-data", type=_uint, metavar="N", help="log the first N bytes of every frame (info level)")
    add("--link-delay", action="append", metavar="MS|PORT:MS", help="hold frames MS ms each way (repeatable)")
    add("--fault-drop", action="append", metavar="P|PORT:P", help="INA packet loss probability (repeatable)")
    add("--fault-dup", action="append", metavar="P|PORT:P", help="duplication probability")
    add("--fault-reorder", action="append", metavar="P|PORT:P", help="reordering probability")
    add("--fault-seed", type=_uint, metavar="N", help="seed of the fault streams (default 0)")
    add("--fault-port", action="append", type=_uint, metavar="PORT", help="only these ports get faults")
    add("--fault-direction", choices=[d.value for d in FaultDirection], metavar="DIR", help="in, out or both (default)")
    add("--fault-reorder-delay", type=float, metavar="S", help="longest hold of a reordered packet (0.005)")
    add("--json-version", action="store_true")
    add("--log-flush", action="store_true")
    add("--log-file-max-size", type=_uint, metavar="BYTES")
    add("--log-file-max-files", type=_uint, metavar="N")
    add("--thrift-port", type=_uint)
    add("--max-port-count", type=_uint, default=MAX_PORT_COUNT)
    for opt in REFUSED_CORE:
        add(opt, nargs="?", const=True, default=None)
    return o


def _target_options() -> _Options:
    o = _Options(f"{PROG} ... --")
    add = o.add
    add("-h", "--help", action="store_true")
    add("--grpc-server-addr", metavar="ADDR", help=f"P4Runtime server, HOST:PORT or unix:PATH ({DEFAULT_GRPC_ADDR})")
    add("--cpu-port", type=_uint, metavar="N", help="packet-in/packet-out port (255 for ina.p4)")
    add("--grpc-server-ssl", action="store_true", default=None, help="serve P4Runtime over TLS")
    add("--grpc-server-cert", metavar="PEM", help="the server's certificate")
    add("--grpc-server-key", metavar="PEM", help="the server's private key")
    add("--grpc-server-cacert", metavar="PEM", help="the CA client certificates are verified against")
    add("--grpc-server-with-client-auth", action="store_true", default=None, help="require client certificates")
    add("--drop-port", type=_uint, default=DROP_PORT)
    add("--disable-swap", action="store_true")
    for opt in REFUSED_TARGET:
        add(opt, nargs="?", const=True, default=None)
    return o


def _help_text() -> str:
    """One screen: every option a user sets, one line each (BMv2's options that change nothing: docs/switch.md)."""
    return "\n".join([
        f"usage: {PROG} [options] <JSON | --no-p4> [-- target options]", "",
        "The embedded INA switch, a drop-in for BMv2 simple_switch_grpc.", "", "options:",
        *_core_options().shown, "", "target options (after '--'):", *_target_options().shown, "",
        "Every setting, and the BMv2 options accepted for compatibility: docs/switch.md.",
    ]) + "\n"


def parse_args(argv: list[str]) -> Invocation | str:
    """The configuration a command line gives; a string to print (help, version, --print-config) instead;
    UsageError for a mistake."""
    core_argv, target_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    try:
        a = _core_options().parser.parse_args(core_argv)
    except UsageError as e:
        hint = next((t for t in TARGET_OPTIONS if any(x == t or x.startswith(t + "=") for x in core_argv)), None)
        if hint and "unrecognized arguments" in str(e):
            raise UsageError(f"{hint} is a target option: put it after '--' (as for simple_switch_grpc)") from None
        raise
    t = _target_options().parser.parse_args(target_argv)
    if a.help or t.help:
        return _help_text()
    if a.version:
        return VERSION + "\n"
    if a.json_version:
        return JSON_VERSION + "\n"
    for opts, why in ((a, REFUSED_CORE), (t, REFUSED_TARGET)):
        for opt, reason in why.items():
            if getattr(opts, opt[2:].replace("-", "_")) is not None:
                raise UsageError(f"option {opt} is not supported by ina-switch: {reason}")
    if t.drop_port != DROP_PORT:
        raise UsageError(f"--drop-port {t.drop_port}: the model drops on port {DROP_PORT} only")
    warnings = []
    program, pcap = a.program, a.pcap
    if pcap is not None and pcap.endswith(".json") and program is None and not os.path.isdir(pcap):
        program, pcap = pcap, "."  # '--pcap prog.json': BMv2's --pcap takes its directory as --pcap=DIR
    if a.no_p4:
        if program is not None:
            warnings.append("ignoring input config as '--no-p4' was used")
        program = ""
    elif program is None and a.config is None and not a.settings and not a.print_config:
        raise UsageError("please specify an input JSON configuration file (or --no-p4)")
    if a.thrift_port is not None:
        warnings.append(f"--thrift-port {a.thrift_port} ignored: ina-switch has no Thrift server (use P4Runtime)")
    overrides = {
        "device_id": a.device_id, "program": program, "pcap_dir": pcap,
        "interfaces": a.interface, "link_delay": a.link_delay,
        "grpc_server_addr": t.grpc_server_addr, "cpu_port": t.cpu_port,
        "log.console": a.log_console, "log.file": a.log_file, "log.level": a.log_level,
        "log.file_max_size": a.log_file_max_size, "log.file_max_files": a.log_file_max_files,
        "log.dump_packet_data": a.dump_packet_data,
        "faults.drop": a.fault_drop, "faults.dup": a.fault_dup, "faults.reorder": a.fault_reorder,
        "faults.seed": a.fault_seed, "faults.ports": a.fault_port, "faults.direction": a.fault_direction,
        "faults.reorder_delay": a.fault_reorder_delay,
        "tls.ssl": t.grpc_server_ssl, "tls.cert": t.grpc_server_cert, "tls.key": t.grpc_server_key,
        "tls.cacert": t.grpc_server_cacert, "tls.client_auth": t.grpc_server_with_client_auth,
    }
    try:
        config = from_args(SwitchConfig, a, overrides)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if a.print_config:
        return to_toml(config)
    _check_files(config)
    if len(config.interfaces) > a.max_port_count:
        raise UsageError(f"{len(config.interfaces)} interfaces exceed --max-port-count {a.max_port_count}")
    return Invocation(config, tuple(warnings + config.warnings()))


def _check_files(config: SwitchConfig) -> None:
    """What must exist before the switch starts: the pcap folder, the TLS files (a usage error, not a crash)."""
    if config.pcap_dir and not os.path.isdir(config.pcap_dir):
        raise UsageError(f"directory '{config.pcap_dir}' specified with '--pcap' does not exist")
    tls = config.tls
    for opt, path in (("--grpc-server-cacert", tls.cacert), ("--grpc-server-cert", tls.cert), ("--grpc-server-key", tls.key)):
        if path and not os.access(path, os.R_OK):
            raise UsageError(f"{opt} {path}: cannot read the file")


# --- logging ----------------------------------------------------------------------------------------------
class _BmFormatter(logging.Formatter):
    """BMv2's spdlog pattern: [HH:MM:SS.mmm] [name] [L] [thread N] message."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        level = LEVEL_CHARS.get(record.levelno, record.levelname[:1])
        text = f"[{time.strftime('%H:%M:%S', t)}.{int(record.msecs):03d}] [{PROG}] [{level}] [thread {threading.get_native_id()}] {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(config: SwitchConfig) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    opts = config.log
    level = opts.level.logging_level
    if opts.console:
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    elif opts.file:
        handler = logging.handlers.RotatingFileHandler(
            opts.file + ".txt", maxBytes=opts.file_max_size, backupCount=opts.file_max_files
        )
    else:  # no log requested: warnings and errors still reach stderr
        handler = logging.StreamHandler(sys.stderr)
        level = max(level, logging.WARNING)
    handler.setFormatter(_BmFormatter())
    root.addHandler(handler)
    root.setLevel(level)


# --- main -------------------------------------------------------------------------------------------------
def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parsed = parse_args(argv)
    except UsageError as e:
        return _error(f"{e} (see {PROG} --help)")
    if isinstance(parsed, str):
        sys.stdout.write(parsed)
        return 0
    try:
        return run(parsed)
    except KeyboardInterrupt:
        return 130


def run(invocation: Invocation) -> int:
    """Start the data plane and the P4Runtime server; serve until SIGTERM or SIGINT."""
    config = invocation.config
    program = None
    if config.program:
        try:
            program = check_program(config.program)
        except ProgramError as e:
            return _error(str(e))
    setup_logging(config)
    for w in invocation.warnings:
        log.warning("%s", w)

    from p4src.ina_model import InaPipeline
    from softswitch.p4runtime_server import P4RuntimeServer

    pipeline = InaPipeline()
    cpu_port = config.cpu_port or None
    faults = config.faults.fault_config()
    dataplane = DataPlane(
        pipeline, config.ports(), cpu_port=cpu_port, faults=faults, pcap_dir=config.pcap_dir or None,
        live=program is not None, dump_packet_data=config.log.dump_packet_data, link_delay=config.delays(),
    )
    try:
        dataplane.open()
    except (DataPlaneError, OSError) as e:
        dataplane.close()
        return _error(str(e))
    busy = _address_in_use(config.grpc_server_addr)
    if busy:
        dataplane.close()
        return _error(busy)
    try:
        credentials = config.tls.server_credentials() if config.tls.ssl else None
    except OSError as e:
        dataplane.close()
        return _error(f"TLS: {e}")
    try:
        # As simple_switch_grpc started with a JSON: the data plane runs the program at once, while P4Runtime
        # knows no P4Info (BMv2 cannot derive one from the JSON) until a client pushes it.
        server = P4RuntimeServer(
            pipeline, device_id=config.device_id, address=config.grpc_server_addr, cpu_port=cpu_port,
            packet_out=dataplane.inject_packet_out if cpu_port is not None else None,
            server_credentials=credentials,
        )
        server.start()
    except (RuntimeError, ValueError, OSError) as e:
        dataplane.close()
        return _error(str(e))
    dataplane.packet_in = server.send_packet_in
    if program is None:
        dataplane.set_live(lambda: server.configured)
    _serve(config, dataplane, server, faults.active)
    return 0


def _serve(config: SwitchConfig, dataplane: DataPlane, server, faults: bool) -> None:
    """Run until SIGTERM or SIGINT, then stop cleanly and log what each port and the faults saw."""
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame):  # no logging here: the handler may interrupt a logging call
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    dataplane.start()
    if config.program:
        log.info("Pipeline live: %s (P4Runtime waits for SetForwardingPipelineConfig)", config.program)
    else:
        log.info("No program (--no-p4): waiting for SetForwardingPipelineConfig")
    tls = config.tls
    log.info("Server listening on %s (device id %d%s)", config.grpc_server_addr, config.device_id,
             ", TLS" + (" with client certificates" if tls.client_auth else "") if tls.ssl else "")
    if faults:
        log.info("Fault injection: %s", dataplane.faults.config.describe())
    while not stop.wait(1.0):
        pass
    log.info("%s: shutting down", signal.Signals(received[0]).name if received else "stop")
    dataplane.stop()
    server.stop(grace=0.3)
    for port, st in sorted(dataplane.stats.ports.items()):
        log.info("port %d (%s): %d received, %d sent, %d send errors", port, dataplane.interfaces[port], st.rx, st.tx,
                 st.tx_errors)
    if dataplane.delay is not None:
        log.info("link delay: at most %d frames held at once", dataplane.delay.held_most)
    if dataplane.faults is not None:
        for direction, st in dataplane.faults.stats.items():
            log.info("faults %s: %d INA packets, %d dropped, %d duplicated, %d reordered",
                     direction, st.seen, st.dropped, st.duplicated, st.reordered)
    logging.shutdown()


def _address_in_use(addr: str) -> str | None:
    """Why the gRPC address cannot be bound (gRPC itself binds with SO_REUSEPORT and would share a port that
    another switch is serving); None when it is free or not a TCP address."""
    if addr.startswith("unix:"):
        return None
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine; a listening socket is not
        try:
            s.bind((host, int(port)))
        except OSError as e:
            return f"cannot listen on {addr} for P4Runtime: {e.strerror or e}"
    return None


if __name__ == "__main__":
    sys.exit(main())
