"""``ina-switch``: the embedded switch as a process, started like BMv2's ``simple_switch_grpc``.

    ina-switch [core options] <program.json | --no-p4> [-- target options]

    simple_switch_grpc --device-id 1 -i 1@s1-eth1 -i 2@s1-eth2 --log-console -L info build/ina.json \\
        -- --grpc-server-addr 127.0.0.1:9559 --cpu-port 255
    ina-switch         --device-id 1 -i 1@s1-eth1 -i 2@s1-eth2 --log-console -L info build/ina.json \\
        -- --grpc-server-addr 127.0.0.1:9559 --cpu-port 255

The program is p4src/ina.p4 as the pipeline model (softswitch/pipeline.py) runs it: a BMv2 JSON given on
the command line is checked against the model (tables, actions, counters, registers, names and widths) and
refused with the reason when it is another program; ``--no-p4`` starts without a program and drops every
packet until a client pushes one with SetForwardingPipelineConfig. docs/switch.md has every option and each
known divergence from BMv2.
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
from dataclasses import dataclass, field

from inaproto.cli import Parser, UsageError
from softswitch.dataplane import TRACE, DataPlane, IoMode
from softswitch.faults import FaultConfig, build_config
from softswitch.link_delay import LinkDelay, parse_link_delays
from softswitch.p4program import JSON_VERSION, ProgramError, check_program
from softswitch.pipeline import DROP_PORT
from softswitch.port_socket import DataPlaneError

PROG = "ina-switch"
VERSION = "ina-switch 0.1.0 (BMv2 simple_switch_grpc command line, P4Runtime 1.4)"
DEFAULT_GRPC_ADDR = "127.0.0.1:9559"  # BMv2's default is 0.0.0.0:9559: never a wildcard here
IO_ENV = "INA_SWITCH_IO"  # the --io default where set (how ina-exp and the test suites pick the I/O path)
DEFAULT_DEVICE_ID = 0  # as BMv2; most clients default to 1, so always pass --device-id
LEVELS = {"trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "error": logging.ERROR, "off": logging.CRITICAL + 10}
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

log = logging.getLogger("ina-switch")


@dataclass(frozen=True)
class GrpcServerTls:
    """TLS of the P4Runtime server, as BMv2's ``--grpc-server-ssl`` options give it: the server's certificate
    and key; with ``client_auth``, clients must present a certificate signed by ``cacert``."""

    cert: str
    key: str
    cacert: str = ""
    client_auth: bool = False

    def server_credentials(self):  # -> grpc.ServerCredentials (grpc is imported only when serving)
        """gRPC server credentials from the PEM files (OSError if one cannot be read)."""
        import grpc

        def read(path: str) -> bytes:
            with open(path, "rb") as fh:
                return fh.read()

        return grpc.ssl_server_credentials(
            [(read(self.key), read(self.cert))], root_certificates=read(self.cacert) if self.cacert else None,
            require_client_auth=self.client_auth,
        )


@dataclass(frozen=True)
class SwitchCommandLine:
    """The parsed command line (what ``ina-switch`` was told to run)."""

    program: str | None
    no_p4: bool
    device_id: int
    interfaces: dict[int, str]
    grpc_addr: str
    cpu_port: int | None
    log_console: bool
    log_file: str | None
    log_level: str
    log_file_max_size: int
    log_file_max_files: int
    pcap_dir: str | None
    dump_packet_data: int
    faults: FaultConfig
    io: IoMode = IoMode.FRAMES  # rings are opt-in until they beat frames without adding latency
    link_delay: LinkDelay = field(default_factory=LinkDelay)
    tls: GrpcServerTls | None = None  # None: P4Runtime in plaintext (BMv2's default too)
    warnings: tuple[str, ...] = field(default=())


def _interface(text: str) -> tuple[int, str]:
    port_text, sep, iface = text.partition("@")
    if not sep or not iface:
        raise argparse.ArgumentTypeError(f"expected PORT@IFACE (e.g. 1@s1-eth1), got {text!r}")
    try:
        port = int(port_text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {port_text!r} in {text!r} is not a number") from None
    if not 0 <= port < DROP_PORT:
        raise argparse.ArgumentTypeError(f"port {port} in {text!r} is not within 0..510 (511 is the drop port)")
    if len(iface) > 15 or "/" in iface or iface.strip() != iface:
        raise argparse.ArgumentTypeError(f"{iface!r} in {text!r} is not a valid interface name")
    return port, iface


def _uint(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return value


def _core_parser() -> Parser:
    p = Parser(
        prog=PROG,
        usage=f"{PROG} [options] <path to JSON config file | --no-p4> [-- target options]",
        description="The embedded INA switch, started like BMv2 simple_switch_grpc. Target options follow '--': "
        "--grpc-server-addr ADDR (default 127.0.0.1:9559), --cpu-port N, --drop-port 511, --disable-swap.",
        add_help=False,
        allow_abbrev=False,
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help message and exit")
    p.add_argument("-v", "--version", action="store_true", help="display version information")
    p.add_argument("--json-version", action="store_true", help="display the BMv2 JSON version supported")
    p.add_argument("program", nargs="?", help="BMv2 JSON compiled from p4src/ina.p4 (checked against the model)")
    p.add_argument("--no-p4", action="store_true", help="start without a program; wait for SetForwardingPipelineConfig")
    p.add_argument("-i", "--interface", action="append", type=_interface, default=[], metavar="PORT@IFACE",
                   help="attach interface IFACE as port PORT (repeatable)")
    p.add_argument("--device-id", type=_uint, default=DEFAULT_DEVICE_ID,
                   help="P4Runtime device id (default 0, as BMv2; always pass it: most clients default to 1)")
    p.add_argument("--pcap", nargs="?", const=".", default=None, metavar="DIR",
                   help="write <iface>_in.pcap and <iface>_out.pcap in DIR (default: current directory)")
    p.add_argument("--log-console", action="store_true", help="log to stdout")
    p.add_argument("--log-file", metavar="FILE", help="log to FILE.txt (as BMv2)")
    p.add_argument("-L", "--log-level", choices=list(LEVELS), default="trace",
                   help="log level (default trace, as BMv2; use info or warn for experiments)")
    p.add_argument("--log-flush", action="store_true", help="flush the log file after every message (always done)")
    p.add_argument("--log-file-max-size", type=_uint, default=5 * 1024 * 1024, metavar="BYTES",
                   help="rotate the log file at this size (default 5 MiB)")
    p.add_argument("--log-file-max-files", type=_uint, default=3, metavar="N", help="rotated log files kept (default 3)")
    p.add_argument("--dump-packet-data", type=_uint, default=0, metavar="N",
                   help="log the first N bytes of every packet received and sent, at info level")
    p.add_argument("--thrift-port", type=_uint, metavar="PORT", help="accepted for compatibility; ina-switch has no Thrift server")
    p.add_argument("--io", choices=[m.value for m in IoMode], default=os.environ.get(IO_ENV) or IoMode.FRAMES.value,
                   help="packet I/O: one recv()/send() per frame (default, or $INA_SWITCH_IO), or PACKET_MMAP rings "
                   "with batches through the pipeline (falls back to frames where the kernel refuses rings)")
    p.add_argument("--max-port-count", type=_uint, default=512, metavar="N", help="most interfaces accepted (default 512)")
    p.add_argument("--link-delay", action="append", default=[], metavar="MS|PORT:MS",
                   help="propagation delay: hold every frame MS milliseconds on ingress and again on egress of "
                        "every port (or of PORT; repeatable). A worker's round trip through the switch gains 2 MS")
    g = p.add_argument_group("fault injection (INA packets only: UDP from or to port 47000)")
    g.add_argument("--fault-drop", action="append", default=[], metavar="P|PORT:P", help="drop probability, global or per port")
    g.add_argument("--fault-dup", action="append", default=[], metavar="P|PORT:P", help="duplication probability")
    g.add_argument("--fault-reorder", action="append", default=[], metavar="P|PORT:P",
                   help="probability that a packet is held back behind the next one of its link")
    g.add_argument("--fault-seed", type=_uint, default=0, metavar="N", help="seed of the fault streams (default 0)")
    g.add_argument("--fault-port", action="append", type=_uint, default=[], metavar="PORT",
                   help="only these ports get faults (repeatable; default: every port)")
    g.add_argument("--fault-direction", choices=("in", "out", "both"), default="both",
                   help="faults on frames received (in), sent (out) or both (default)")
    g.add_argument("--fault-reorder-delay", type=float, default=0.005, metavar="SECONDS",
                   help="longest time a held-back packet waits for the next one (default 0.005)")
    for opt in REFUSED_CORE:
        p.add_argument(opt, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    return p


def _target_parser() -> Parser:
    p = Parser(prog=f"{PROG} ... --", add_help=False, allow_abbrev=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--grpc-server-addr", default=DEFAULT_GRPC_ADDR, metavar="ADDR",
                   help=f"bind the P4Runtime gRPC server to ADDR (default {DEFAULT_GRPC_ADDR})")
    p.add_argument("--cpu-port", type=_uint, default=None, metavar="N",
                   help="packet-in / packet-out port (255 for ina.p4); without it there is no P4Runtime packet I/O")
    p.add_argument("--drop-port", type=_uint, default=DROP_PORT, metavar="N", help="drop port (only 511, as the model)")
    p.add_argument("--disable-swap", action="store_true", help="accepted for compatibility (no JSON swapping here)")
    p.add_argument("--grpc-server-ssl", action="store_true", help="serve P4Runtime over TLS (needs --grpc-server-cert and --grpc-server-key)")
    p.add_argument("--grpc-server-cacert", metavar="PEM", help="CA certificate that client certificates are verified against")
    p.add_argument("--grpc-server-cert", metavar="PEM", help="the server's certificate")
    p.add_argument("--grpc-server-key", metavar="PEM", help="the server's private key")
    p.add_argument("--grpc-server-with-client-auth", action="store_true",
                   help="require a client certificate signed by --grpc-server-cacert (mutual TLS)")
    for opt in REFUSED_TARGET:
        p.add_argument(opt, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    return p


def _help_text() -> str:
    target = _target_parser()
    lines = [_core_parser().format_help().rstrip(), "", "Target options (after '--'):"]
    for action in target._actions:
        if action.help and action.option_strings and action.help != argparse.SUPPRESS and "--help" not in action.option_strings:
            metavar = f" {action.metavar}" if action.metavar else ""
            lines.append(f"  {action.option_strings[0]}{metavar}: {action.help}")
    lines.append("")
    lines.append("See docs/switch.md for fault injection, pcap, logging and every divergence from BMv2.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> SwitchCommandLine | str:
    """Options from a command line; a string to print (help, version) instead; UsageError for a mistake."""
    if "--" in argv:
        cut = argv.index("--")
        core_argv, target_argv = argv[:cut], argv[cut + 1 :]
    else:
        core_argv, target_argv = argv, []
    core = _core_parser()
    try:
        a = core.parse_args(core_argv)
    except UsageError as e:
        hint = next((t for t in TARGET_OPTIONS if any(x == t or x.startswith(t + "=") for x in core_argv)), None)
        if hint and "unrecognized arguments" in str(e):
            raise UsageError(f"{hint} is a target option: put it after '--' (as for simple_switch_grpc)") from None
        raise
    if a.help:
        return _help_text()
    if a.version:
        return VERSION + "\n"
    if a.json_version:
        return JSON_VERSION + "\n"
    t = _target_parser().parse_args(target_argv)
    if t.help:
        return _help_text()
    for opts, why in ((a, REFUSED_CORE), (t, REFUSED_TARGET)):
        for opt, reason in why.items():
            if getattr(opts, opt[2:].replace("-", "_")) is not None:
                raise UsageError(f"option {opt} is not supported by ina-switch: {reason}")
    warnings = []
    program = a.program
    pcap = a.pcap
    if pcap is not None and pcap.endswith(".json") and program is None and not os.path.isdir(pcap):
        program, pcap = pcap, "."  # '--pcap prog.json': BMv2's --pcap takes its directory as --pcap=DIR
    if a.no_p4:
        if program is not None:
            warnings.append("ignoring input config as '--no-p4' was used")
            program = None
    elif program is None:
        raise UsageError("please specify an input JSON configuration file (or --no-p4)")
    if a.log_console and a.log_file:
        raise UsageError("--log-console and --log-file are exclusive")
    if a.log_file_max_size == 0:
        raise UsageError("--log-file-max-size must be greater than 0")
    if pcap is not None and not os.path.isdir(pcap):
        raise UsageError(f"directory '{pcap}' specified with '--pcap' does not exist")
    if a.thrift_port is not None:
        warnings.append(f"--thrift-port {a.thrift_port} ignored: ina-switch has no Thrift server (use P4Runtime)")
    interfaces: dict[int, str] = {}
    for port, iface in a.interface:
        if port in interfaces:
            raise UsageError(f"port {port} is given twice (-i {port}@{interfaces[port]} and -i {port}@{iface})")
        if iface in interfaces.values():
            raise UsageError(f"interface {iface} is given twice")
        interfaces[port] = iface
    if len(interfaces) > a.max_port_count:
        raise UsageError(f"{len(interfaces)} interfaces exceed --max-port-count {a.max_port_count}")
    if t.drop_port != DROP_PORT:
        raise UsageError(f"--drop-port {t.drop_port}: the model drops on port 511 only")
    if t.cpu_port is not None:
        if t.cpu_port == 0 or t.cpu_port >= DROP_PORT:
            raise UsageError(f"--cpu-port {t.cpu_port} is not within 1..510")
        if t.cpu_port in interfaces:
            raise UsageError(f"--cpu-port {t.cpu_port} is also given to an interface (-i {t.cpu_port}@{interfaces[t.cpu_port]})")
        if t.cpu_port != 255:
            warnings.append(f"--cpu-port {t.cpu_port}: p4src/ina.p4 sends to and expects packet-outs on port 255")
    tls = _grpc_server_tls(t)
    if not _valid_address(t.grpc_server_addr):
        raise UsageError(f"--grpc-server-addr {t.grpc_server_addr!r} is not HOST:PORT (or unix:PATH)")
    try:
        faults = build_config(
            a.fault_drop, a.fault_dup, a.fault_reorder, ports=a.fault_port, direction=a.fault_direction,
            seed=a.fault_seed, reorder_delay=a.fault_reorder_delay,
        )
    except ValueError as e:
        raise UsageError(f"fault injection: {e}") from None
    for port in a.fault_port:
        if port not in interfaces:
            warnings.append(f"--fault-port {port} has no interface (-i {port}@IFACE)")
    try:
        link_delay = parse_link_delays(a.link_delay)
    except ValueError as e:
        raise UsageError(f"--link-delay: {e}") from None
    for port, _ in link_delay.per_port:
        if port not in interfaces:
            warnings.append(f"--link-delay {port}:... has no interface (-i {port}@IFACE)")
    if a.io not in {m.value for m in IoMode}:
        raise UsageError(f"{IO_ENV}={a.io!r}: expected one of {', '.join(m.value for m in IoMode)}")
    return SwitchCommandLine(
        program=program, no_p4=a.no_p4, device_id=a.device_id, interfaces=interfaces, grpc_addr=t.grpc_server_addr,
        cpu_port=t.cpu_port, log_console=a.log_console, log_file=a.log_file, log_level=a.log_level,
        log_file_max_size=a.log_file_max_size, log_file_max_files=a.log_file_max_files, pcap_dir=pcap,
        dump_packet_data=a.dump_packet_data, faults=faults, io=IoMode(a.io), link_delay=link_delay, tls=tls,
        warnings=tuple(warnings),
    )


def _grpc_server_tls(t: argparse.Namespace) -> GrpcServerTls | None:
    """The TLS options checked: a missing or unreadable file is a usage error here, not a crash when serving.
    Stricter than BMv2, which ignores the files without --grpc-server-ssl: that would serve plaintext to an
    operator who believes TLS is on."""
    files = {"--grpc-server-cacert": t.grpc_server_cacert, "--grpc-server-cert": t.grpc_server_cert,
             "--grpc-server-key": t.grpc_server_key}
    if not t.grpc_server_ssl:
        given = [opt for opt, value in files.items() if value]
        if t.grpc_server_with_client_auth:
            given.append("--grpc-server-with-client-auth")
        if given:
            raise UsageError(f"{given[0]} needs --grpc-server-ssl")
        return None
    if not t.grpc_server_cert or not t.grpc_server_key:
        raise UsageError("--grpc-server-ssl needs --grpc-server-cert and --grpc-server-key")
    if t.grpc_server_with_client_auth and not t.grpc_server_cacert:
        raise UsageError("--grpc-server-with-client-auth needs --grpc-server-cacert "
                         "(the CA that client certificates are checked against)")
    for opt, path in files.items():
        if path and not os.access(path, os.R_OK):
            raise UsageError(f"{opt} {path}: cannot read the file")
    return GrpcServerTls(t.grpc_server_cert, t.grpc_server_key, t.grpc_server_cacert or "", t.grpc_server_with_client_auth)


def _valid_address(addr: str) -> bool:
    if addr.startswith("unix:"):
        return len(addr) > 5
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and int(port) < 65536)


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


def setup_logging(opts: SwitchCommandLine) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    level = LEVELS[opts.log_level]
    if opts.log_console:
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    elif opts.log_file:
        handler = logging.handlers.RotatingFileHandler(
            opts.log_file + ".txt", maxBytes=opts.log_file_max_size, backupCount=opts.log_file_max_files
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
        opts = parse_args(argv)
    except UsageError as e:
        return _error(f"{e} (see {PROG} --help)")
    if isinstance(opts, str):
        sys.stdout.write(opts)
        return 0
    try:
        return run(opts)
    except KeyboardInterrupt:
        return 130


def run(opts: SwitchCommandLine) -> int:
    """Start the data plane and the P4Runtime server; serve until SIGTERM or SIGINT."""
    program = None
    if opts.program is not None:
        try:
            program = check_program(opts.program)
        except ProgramError as e:
            return _error(str(e))
    setup_logging(opts)
    for w in opts.warnings:
        log.warning("%s", w)

    from softswitch.p4runtime_server import P4RuntimeServer
    from softswitch.pipeline import InaPipeline

    pipeline = InaPipeline()
    dataplane = DataPlane(
        pipeline, opts.interfaces, cpu_port=opts.cpu_port, faults=opts.faults, pcap_dir=opts.pcap_dir,
        live=program is not None, dump_packet_data=opts.dump_packet_data, io=opts.io,
        link_delay=opts.link_delay,
    )
    try:
        dataplane.open()
    except (DataPlaneError, OSError) as e:
        dataplane.close()
        return _error(str(e))
    busy = _address_in_use(opts.grpc_addr)
    if busy:
        dataplane.close()
        return _error(busy)
    try:
        credentials = opts.tls.server_credentials() if opts.tls is not None else None
    except OSError as e:
        dataplane.close()
        return _error(f"TLS: {e}")
    try:
        # As simple_switch_grpc started with a JSON: the data plane runs the program at once, while P4Runtime
        # knows no P4Info (BMv2 cannot derive one from the JSON) until a client pushes it.
        server = P4RuntimeServer(
            pipeline, device_id=opts.device_id, address=opts.grpc_addr, cpu_port=opts.cpu_port,
            packet_out=dataplane.inject_packet_out if opts.cpu_port is not None else None,
            server_credentials=credentials,
        )
        server.start()
    except (RuntimeError, ValueError, OSError) as e:
        dataplane.close()
        return _error(str(e))
    dataplane.packet_in = server.send_packet_in
    if program is None:
        dataplane.set_live(lambda: _pipeline_configured(server))

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame):  # no logging here: the handler may interrupt a logging call
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    dataplane.start()
    if program is not None:
        log.info("Pipeline live: %s (P4Runtime waits for SetForwardingPipelineConfig)", opts.program)
    else:
        log.info("No program (--no-p4): waiting for SetForwardingPipelineConfig")
    log.info("Server listening on %s (device id %d%s)", opts.grpc_addr, opts.device_id,
             "" if opts.tls is None else ", TLS" + (" with client certificates" if opts.tls.client_auth else ""))
    if opts.faults.active:
        log.info("Fault injection: %s", opts.faults.describe())
    while not stop.wait(1.0):
        pass
    log.info("%s: shutting down", signal.Signals(received[0]).name if received else "stop")
    dataplane.stop()
    server.stop(grace=0.3)
    for port, st in sorted(dataplane.stats.ports.items()):
        log.info("port %d (%s): %d received, %d sent, %d send errors", port, opts.interfaces[port], st.rx, st.tx, st.tx_errors)
    if dataplane.stats.batches:
        received = sum(st.rx for st in dataplane.stats.ports.values())
        log.info("packet rings: %d frames received in %d batches (%.1f per batch)", received, dataplane.stats.batches,
                 received / dataplane.stats.batches)
    if dataplane.delay is not None:
        log.info("link delay: at most %d frames held at once", dataplane.delay.held_most)
    if dataplane.faults is not None:
        for direction, st in dataplane.faults.stats.items():
            log.info("faults %s: %d INA packets, %d dropped, %d duplicated, %d reordered",
                     direction, st.seen, st.dropped, st.duplicated, st.reordered)
    logging.shutdown()
    return 0


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


def _pipeline_configured(server) -> bool:
    """True once a forwarding pipeline config is set on the P4Runtime server."""
    configured = getattr(server, "configured", None)
    if configured is not None:
        return bool(configured() if callable(configured) else configured)
    return getattr(server, "_config", None) is not None


if __name__ == "__main__":
    sys.exit(main())
