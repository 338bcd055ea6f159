"""``ina-switch``'s configuration: one frozen dataclass, read from TOML (``--config FILE``), the command line on top.

Every setting has a command-line form, BMv2's where BMv2 has one (``simple_switch_grpc``'s command line works
unchanged); ``ina-switch --print-config`` prints the effective configuration as a file ``--config`` reads
back, and docs/switch.md lists every key (``inaproto.config.reference(SwitchConfig)``)::

    device_id = 1
    interfaces = ["1@s1-eth1", "2@s1-eth2"]
    grpc_server_addr = "127.0.0.1:9559"
    cpu_port = 255

    [log]
    level = "info"

    [faults]
    drop = ["0.05", "3:0.2"]
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from inaproto.config import setting
from p4src.v1model import DROP_PORT, P4RUNTIME_PORT
from softswitch.faults import FaultConfig, FaultDirection, build_config
from softswitch.link_delay import LinkDelay, parse_link_delays

__all__ = ["DEFAULT_GRPC_ADDR", "FaultSettings", "LogConfig", "LogLevel", "SwitchConfig", "TlsConfig", "parse_interface"]

DEFAULT_GRPC_ADDR = f"127.0.0.1:{P4RUNTIME_PORT}"  # BMv2's default is 0.0.0.0: never a wildcard here
TRACE = 5  # logging level of BMv2's trace


class LogLevel(enum.StrEnum):
    """BMv2's log levels (``-L``)."""

    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"
    OFF = "off"

    @property
    def logging_level(self) -> int:
        return {"trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
                "error": logging.ERROR, "off": logging.CRITICAL + 10}[self.value]


def parse_interface(text: str) -> tuple[int, str]:
    """``PORT@IFACE`` -> (port, interface); ValueError with the reason."""
    port_text, sep, iface = text.partition("@")
    if not sep or not iface:
        raise ValueError(f"expected PORT@IFACE (e.g. 1@s1-eth1), got {text!r}")
    try:
        port = int(port_text, 10)
    except ValueError:
        raise ValueError(f"port {port_text!r} in {text!r} is not a number") from None
    if not 0 <= port < DROP_PORT:
        raise ValueError(f"port {port} in {text!r} is not within 0..{DROP_PORT - 1} ({DROP_PORT} is the drop port)")
    if len(iface) > 15 or "/" in iface or iface.strip() != iface:
        raise ValueError(f"{iface!r} in {text!r} is not a valid interface name")
    return port, iface


@dataclass(frozen=True)
class LogConfig:
    """Logging, in BMv2's pattern (``[HH:MM:SS.mmm] [ina-switch] [L] [thread N] message``)."""

    console: bool = setting(False, "log to stdout (--log-console)")
    file: str = setting("", "log to FILE.txt, as BMv2 (--log-file FILE); neither file nor console: warnings and errors on stderr")
    level: LogLevel = setting(LogLevel.TRACE, "trace, debug, info, warn, error or off (-L); BMv2's default trace is slow: experiments use info or warn")
    file_max_size: int = setting(5 << 20, "bytes at which the log file is rotated (--log-file-max-size)")
    file_max_files: int = setting(3, "rotated log files kept (--log-file-max-files)")
    dump_packet_data: int = setting(0, "log the first N bytes of every frame received and sent, at info level (--dump-packet-data)")

    def __post_init__(self) -> None:
        if self.console and self.file:
            raise ValueError("console and file are exclusive (--log-console, --log-file)")
        if self.file_max_size <= 0 or self.file_max_files < 0 or self.dump_packet_data < 0:
            raise ValueError("file_max_size must be positive, file_max_files and dump_packet_data not negative")


@dataclass(frozen=True)
class FaultSettings:
    """Seeded loss, duplication and reordering of INA packets (UDP from or to the INA port) on the switch's links."""

    drop: tuple[str, ...] = setting((), "loss probability of INA packets: P on every port, PORT:P on one (--fault-drop, repeatable)")
    dup: tuple[str, ...] = setting((), "duplication probability, P or PORT:P (--fault-dup)")
    reorder: tuple[str, ...] = setting((), "probability a packet is held back behind the next one of its link, P or PORT:P (--fault-reorder)")
    seed: int = setting(0, "seed of every link's random stream (--fault-seed)")
    ports: tuple[int, ...] = setting((), "only these ports get faults; empty: every port (--fault-port, repeatable)")
    direction: FaultDirection = setting(FaultDirection.BOTH, "faults on frames received (in), sent (out) or both (--fault-direction)")
    reorder_delay: float = setting(0.005, "seconds a held-back packet waits at most for the next one (--fault-reorder-delay)")

    def __post_init__(self) -> None:
        self.fault_config()  # refuses malformed probabilities here, naming the key

    def fault_config(self) -> FaultConfig:
        return build_config(self.drop, self.dup, self.reorder, ports=self.ports, direction=self.direction,
                            seed=self.seed, reorder_delay=self.reorder_delay)


@dataclass(frozen=True)
class TlsConfig:
    """P4Runtime over TLS, with BMv2 1.15.5's options (``--grpc-server-ssl`` ...)."""

    ssl: bool = setting(False, "serve P4Runtime over TLS, with cert and key (--grpc-server-ssl)")
    cert: str = setting("", "the server's certificate, PEM (--grpc-server-cert)")
    key: str = setting("", "the server's private key, PEM (--grpc-server-key)")
    cacert: str = setting("", "the CA client certificates are verified against, PEM (--grpc-server-cacert)")
    client_auth: bool = setting(False, "require a client certificate signed by cacert: mutual TLS (--grpc-server-with-client-auth)")

    def __post_init__(self) -> None:
        """Stricter than BMv2, which ignores the files without --grpc-server-ssl and serves plaintext: nobody
        should believe TLS is on when it is not."""
        if not self.ssl:
            given = [name for name in ("cacert", "cert", "key") if getattr(self, name)]
            given += ["client_auth"] if self.client_auth else []
            if given:
                raise ValueError(f"{given[0]} needs ssl (--grpc-server-ssl)")
            return
        if not self.cert or not self.key:
            raise ValueError("ssl needs cert and key (--grpc-server-cert, --grpc-server-key)")
        if self.client_auth and not self.cacert:
            raise ValueError("client_auth needs cacert (--grpc-server-cacert): the CA client certificates are "
                             "checked against")

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
class SwitchConfig:
    """What ``ina-switch`` runs: ports, program, P4Runtime server, logging, link delay, faults."""

    device_id: int = setting(0, "P4Runtime device id (--device-id); BMv2's default, while most clients use 1: always set it")
    interfaces: tuple[str, ...] = setting((), "the ports, PORT@IFACE each, e.g. 1@s1-eth1 (-i, repeatable); port 0..510, each port and interface once")
    program: str = setting("", "BMv2 JSON of p4src/ina.p4, checked against the model (the positional "
                               "argument); empty: no program until SetForwardingPipelineConfig (--no-p4)")
    grpc_server_addr: str = setting(DEFAULT_GRPC_ADDR, "P4Runtime server address, HOST:PORT or unix:PATH (-- --grpc-server-addr); BMv2's is 0.0.0.0:9559")
    cpu_port: int = setting(0, "packet-in/packet-out port, 1..510: 255 for ina.p4 (-- --cpu-port); 0: no P4Runtime packet I/O")
    pcap_dir: str = setting("", "write <iface>_in.pcap and <iface>_out.pcap in this existing folder (--pcap[=DIR]); empty: none")
    link_delay: tuple[str, ...] = setting((), "propagation delay held on ingress and again on egress: MS on every port, PORT:MS on one (--link-delay, repeatable)")
    log: LogConfig = setting(doc="logging", factory=LogConfig)
    faults: FaultSettings = setting(doc="fault injection", factory=FaultSettings)
    tls: TlsConfig = setting(doc="TLS of the P4Runtime server", factory=TlsConfig)

    def __post_init__(self) -> None:
        ports = self.ports()
        if self.cpu_port:
            if not 0 < self.cpu_port < DROP_PORT:
                raise ValueError(f"cpu_port {self.cpu_port} is not within 1..{DROP_PORT - 1}")
            if self.cpu_port in ports:
                raise ValueError(f"cpu_port {self.cpu_port} is also an interface's port "
                                 f"({self.cpu_port}@{ports[self.cpu_port]})")
        if not _valid_address(self.grpc_server_addr):
            raise ValueError(f"grpc_server_addr {self.grpc_server_addr!r} is not HOST:PORT (or unix:PATH)")
        self.delays()

    def ports(self) -> dict[int, str]:
        """The interfaces as port -> name (ValueError for a malformed or repeated one)."""
        out: dict[int, str] = {}
        for text in self.interfaces:
            port, iface = parse_interface(text)
            if port in out:
                raise ValueError(f"port {port} is given twice ({port}@{out[port]} and {port}@{iface})")
            if iface in out.values():
                raise ValueError(f"interface {iface} is given twice")
            out[port] = iface
        return out

    def delays(self) -> LinkDelay:
        return parse_link_delays(self.link_delay)

    def warnings(self) -> list[str]:
        """What is accepted but likely a mistake, one line each."""
        ports = self.ports()
        out = []
        if self.cpu_port and self.cpu_port != 255:
            out.append(f"cpu_port {self.cpu_port}: p4src/ina.p4 sends to and expects packet-outs on port 255")
        out += [f"fault port {p} has no interface" for p in self.faults.ports if p not in ports]
        out += [f"link delay on port {p} has no interface" for p, _ in self.delays().per_port if p not in ports]
        return out


def _valid_address(addr: str) -> bool:
    if addr.startswith("unix:"):
        return len(addr) > 5
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and int(port) < 65536)
