"""A switch process (``ina-switch`` or BMv2 ``simple_switch_grpc``) in a namespace of its own, reached from here.

``SwitchNetwork`` is one switch namespace joined by veth pairs to host ends (each in a host namespace);
``SwitchProcess`` starts the switch there with the command line both switches share, waits (by polling,
never by sleeping) until its gRPC port answers, and reaches it through a ``TcpForward`` so a P4Runtime
client never leaves 127.0.0.1. The integration tests and ``bench/switch_bench.py`` use them.
"""
from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from inaproto import wire
from inaproto.commands import Command, command_argv
from p4src.v1model import P4RUNTIME_PORT
from topologies.netns import Namespace, Network, Process, TcpForward

__all__ = ["CPU_PORT", "DEVICE_ID", "GRPC_PORT", "SwitchNetwork", "SwitchProcess", "switch_command"]

GRPC_PORT = P4RUNTIME_PORT
DEVICE_ID = 1
CPU_PORT = wire.CPU_PORT


def switch_command(kind: str) -> list[str]:
    """The switch executable: the installed ``ina-switch`` script (or ``python -m softswitch.cli``), or BMv2's."""
    if kind == "bmv2":
        path = shutil.which("simple_switch_grpc")
        if path is None:
            raise FileNotFoundError("simple_switch_grpc is not on PATH")
        return [path]
    return command_argv(Command.SWITCH)


class SwitchNetwork:
    """One switch namespace with ports 1..N, each a veth pair to a host end in a host namespace.

    Args:
        network: the Network that owns (and removes) the namespaces.
        ports: the switch's port numbers.
        separate_hosts: one namespace per host end (named ``eth0`` there), like K worker machines; by default
            all host ends (``h-p<port>``) share one host namespace.
    """

    def __init__(self, network: Network, ports: Sequence[int], *, separate_hosts: bool = False) -> None:
        self.network = network
        self.switch_ns = network.add_namespace("sw")
        self.ports = list(ports)
        self.switch_ifaces = {p: f"sw-p{p}" for p in self.ports}
        self.hosts: dict[int, tuple[Namespace, str]] = {}
        shared = None if separate_hosts else network.add_namespace("hosts")
        for p in self.ports:
            ns = network.add_namespace(f"h{p}") if separate_hosts else shared
            host_iface = "eth0" if separate_hosts else f"h-p{p}"
            network.add_veth(self.switch_ns, self.switch_ifaces[p], ns, host_iface, tx_off=[ns])
            self.hosts[p] = (ns, host_iface)

    def interface_args(self) -> list[str]:
        return [a for p in self.ports for a in ("-i", f"{p}@{self.switch_ifaces[p]}")]


class SwitchProcess:
    """A switch started in ``net.switch_ns``; ``address`` reaches its P4Runtime server from this namespace."""

    def __init__(
        self, net: SwitchNetwork, log_dir: str | Path, *, kind: str = "ina-switch", program: str | None = None,
        core_args: Sequence[str] = (), target_args: Sequence[str] = (), device_id: int = DEVICE_ID, ready_timeout: float = 20.0,
        log_console: bool = True, command: Sequence[str] | None = None,
    ) -> None:
        """``command``: the executable (argv prefix) to start instead of ``kind``'s, e.g. another checkout's."""
        self.net, self.kind, self.device_id = net, kind, device_id
        logging = ["--log-console", "-L", "info"] if log_console else []
        argv = [*(command or switch_command(kind)), "--device-id", str(device_id), *net.interface_args(), *logging,
                *core_args]
        argv += [program] if program is not None else ["--no-p4"]
        argv += ["--", "--grpc-server-addr", f"127.0.0.1:{GRPC_PORT}", "--cpu-port", str(CPU_PORT), *target_args]
        self.argv = argv
        self.process = net.network.track(Process(argv, Path(log_dir) / f"{kind}.log", namespace=net.switch_ns))
        self.forward: TcpForward | None = None
        try:
            self.process.wait_until(lambda: net.switch_ns.tcp_port_open(GRPC_PORT), ready_timeout, "gRPC port answering")
            self.forward = TcpForward(net.switch_ns, GRPC_PORT)
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        assert self.forward is not None
        return self.forward.address

    def stop(self) -> int:
        if self.forward is not None:
            self.forward.close()
            self.forward = None
        # A clean exit (gRPC server stopped, counters logged, rings unmapped) can take seconds on a loaded
        # 2-core machine; SIGKILL only a switch that really hangs.
        return self.process.stop(timeout=10.0)
