"""The addressing plan of a topology as plain data: hosts, switches, links and each switch's IPv4 routes.

A topology (``topologies.topos``) builds a :class:`NetworkPlan`; the Mininet nodes are configured from it,
``topologies.runtime`` installs its routes over P4Runtime, and the controller reads it from the run
directory in p4lang/tutorials' shapes (``topology.json`` and one ``<switch>-runtime.json`` per switch).

Addressing (docs/topologies.md):

- rack ``r`` (1-based) is the subnet ``10.0.r.0/24``; its ``i``-th host (1-based) is ``10.0.r.i`` with MAC
  ``02:00:00:00:rr:ii`` (hex); the rack's switch has the INA address ``10.0.r.254`` / ``02:00:00:00:rr:fe``,
  which is also the hosts' default gateway (the switch never answers ARP: hosts get static entries);
- a spine is "rack 0": ``10.0.0.254`` / ``02:00:00:00:00:fe``;
- switch ``s`` port ``p`` has the interface ``ina-<s>-p<p>`` in the root namespace with MAC
  ``02:00:ff:dd:00:pp`` (``dd`` the device id); hosts' interfaces are ``eth0`` inside their namespaces.

Routes are host routes (/32), one per host on every switch, along a shortest path: exactly what the
P4 program's ``MyIngress.ipv4_lpm`` table needs for non-INA traffic (ring all-reduce between workers).
"""
from __future__ import annotations

import collections
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controller.topology import next_hops_towards
from topologies.errors import TopologiesError

__all__ = [
    "FORWARD_ACTION",
    "INTF_PREFIX",
    "LPM_TABLE",
    "HostSpec",
    "LinkSpec",
    "NetworkPlan",
    "PlanError",
    "Route",
    "SwitchSpec",
    "compute_routes",
    "host_address",
    "port_intf_name",
    "port_mac",
    "switch_address",
]

INTF_PREFIX = "ina"
IFNAMSIZ = 15  # Linux interface names: at most 15 characters
LPM_TABLE = "MyIngress.ipv4_lpm"
FORWARD_ACTION = "MyIngress.ipv4_forward"
DROP_ACTION = "MyIngress.drop"
MAX_RACKS = 250
MAX_HOSTS_PER_RACK = 253


class PlanError(TopologiesError, ValueError):
    """A topology that cannot be addressed (too many racks or hosts, a duplicate name, a dangling link)."""


def host_address(rack: int, index: int) -> tuple[str, str]:
    """``(ip, mac)`` of host ``index`` (1-based) in rack ``rack`` (1-based)."""
    if not 1 <= rack <= MAX_RACKS or not 1 <= index <= MAX_HOSTS_PER_RACK:
        raise PlanError(f"no address for host {index} of rack {rack}: at most {MAX_RACKS} racks of {MAX_HOSTS_PER_RACK} hosts")
    return f"10.0.{rack}.{index}", f"02:00:00:00:{rack:02x}:{index:02x}"


def switch_address(rack: int) -> tuple[str, str]:
    """``(ip, mac)``: the INA address of rack ``rack``'s switch (rack 0: the spine)."""
    if not 0 <= rack <= MAX_RACKS:
        raise PlanError(f"no switch address for rack {rack}")
    return f"10.0.{rack}.254", f"02:00:00:00:{rack:02x}:fe"


def port_intf_name(switch: str, port: int, prefix: str = INTF_PREFIX) -> str:
    """The root-namespace interface of a switch port: ``ina-s1-p3``."""
    name = f"{prefix}-{switch}-p{port}"
    if len(name) > IFNAMSIZ:
        raise PlanError(f"interface name {name!r} is longer than {IFNAMSIZ} characters: use a shorter switch name")
    return name


def port_mac(device_id: int, port: int) -> str:
    """MAC address of a switch port's interface."""
    return f"02:00:ff:{device_id % 256:02x}:{port // 256 % 256:02x}:{port % 256:02x}"


@dataclass(frozen=True)
class HostSpec:
    """One host: where it is plugged in and how it is addressed.

    ``arp`` holds the static neighbour entries the host gets (``(ip, mac)``; the switch answers no ARP);
    ``commands`` are extra shell commands run in the host after it is configured (topology.json's).
    """

    name: str
    ip: str
    prefix_len: int
    mac: str
    switch: str
    switch_port: int
    rack: int = 0
    gateway: str | None = None
    switch_ip: str | None = None
    switch_mac: str | None = None
    bw: float | None = None
    arp: tuple[tuple[str, str], ...] = ()
    commands: tuple[str, ...] = ()

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefix_len}"


@dataclass(frozen=True)
class Route:
    """One ``MyIngress.ipv4_lpm`` entry: ``prefix`` -> ``ipv4_forward(mac, port)``."""

    prefix: str
    mac: str
    port: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.prefix)

    def runtime_entry(self) -> dict:
        """The entry in p4lang/tutorials' ``sX-runtime.json`` shape."""
        net = self.network
        return {
            "table": LPM_TABLE,
            "match": {"hdr.ipv4.dstAddr": [str(net.network_address), net.prefixlen]},
            "action_name": FORWARD_ACTION,
            "action_params": {"dstAddr": self.mac, "port": self.port},
        }


@dataclass(frozen=True)
class SwitchSpec:
    """One switch: its P4Runtime device id, INA address, whether the controller may give it slots, routes.

    ``ina=False`` models a rack without in-network aggregation: the switch runs the same program and
    forwards the same way, but the controller installs no ``ina_job`` entries on it (its workers are ring
    members: Rina's host members, or the plain ring); it routes every job's INA packets as plain IPv4
    (``ina_transit`` for every job id, installed with its routes by ``topologies.nodes``).
    """

    name: str
    device_id: int
    ip: str
    mac: str
    rack: int = 0
    ina: bool = True
    role: str = "tor"
    ports: tuple[tuple[int, str], ...] = ()
    routes: tuple[Route, ...] = ()


@dataclass(frozen=True)
class LinkSpec:
    """A link; ``port`` is the switch port number of each end (0 for a host's ``eth0``)."""

    node1: str
    port1: int
    node2: str
    port2: int
    bw: float | None = None
    delay_ms: float = 0.0  # one-way propagation delay, held by the switch end(s) (ina-switch --link-delay)


@dataclass(frozen=True)
class NetworkPlan:
    """Hosts, switches and links of one topology, with every address and route."""

    hosts: tuple[HostSpec, ...]
    switches: tuple[SwitchSpec, ...]
    links: tuple[LinkSpec, ...]
    intf_prefix: str = INTF_PREFIX
    notes: tuple[str, ...] = field(default=())

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in the plan")

    def switch(self, name: str) -> SwitchSpec:
        for s in self.switches:
            if s.name == name:
                return s
        raise KeyError(f"no switch {name!r} in the plan")

    def switch_interfaces(self) -> list[str]:
        """Every root-namespace interface name the topology makes (switch ports)."""
        names = []
        for link in self.links:
            for node, port in ((link.node1, link.port1), (link.node2, link.port2)):
                if self._is_switch(node):
                    names.append(port_intf_name(node, port, self.intf_prefix))
        return names

    def _is_switch(self, name: str) -> bool:
        return any(s.name == name for s in self.switches)

    def to_dict(self) -> dict:
        return asdict(self)

    def runtime_json(self, switch: str, *, p4info: str | None = None, bmv2_json: str | None = None) -> dict:
        """One switch's routes in p4lang/tutorials' ``sX-runtime.json`` shape."""
        spec = self.switch(switch)
        doc: dict = {"target": "bmv2", "table_entries": [r.runtime_entry() for r in spec.routes]}
        if p4info:
            doc["p4info"] = p4info
        if bmv2_json:
            doc["bmv2_json"] = bmv2_json
        return doc

    def topology_json(self, switch_extra: Mapping[str, Mapping] | None = None) -> dict:
        """The plan in p4lang/tutorials' ``topology.json`` shape, with this project's extra keys.

        Hosts: ``ip`` (CIDR), ``mac``, ``commands`` (the ARP entries and default route, as tutorials
        write them) plus ``rack``, ``switch_ip``, ``switch_mac``. Switches: ``runtime_json`` plus
        ``device_id``, ``ina``, ``ip``/``switch_ip``, ``mac``/``switch_mac``, ``rack`` and whatever
        ``switch_extra`` adds (the run's gRPC address as ``grpc``, as controller/topology.py reads it). Links: ``[a, b]`` with switch ends written ``s1-p2``, and a bandwidth when set.
        """
        hosts = {}
        for h in self.hosts:
            cmds = [f"arp -i eth0 -s {ip} {mac}" for ip, mac in h.arp]
            if h.gateway:
                cmds.append(f"route add default gw {h.gateway} dev eth0")
            hosts[h.name] = {
                "ip": h.cidr, "mac": h.mac, "commands": cmds + list(h.commands),
                "rack": h.rack, "switch_ip": h.switch_ip, "switch_mac": h.switch_mac,
            }
        switches = {}
        for s in self.switches:
            entry = {
                "runtime_json": f"{s.name}-runtime.json", "device_id": s.device_id, "ina": s.ina,
                "ip": s.ip, "mac": s.mac, "rack": s.rack, "role": s.role,
                "switch_ip": s.ip, "switch_mac": s.mac,  # the controller's names for the INA address
            }
            entry.update((switch_extra or {}).get(s.name, {}))
            switches[s.name] = entry
        links = []
        for link in self.links:
            ends = [n if not self._is_switch(n) else f"{n}-p{p}" for n, p in ((link.node1, link.port1), (link.node2, link.port2))]
            if link.bw is not None or link.delay_ms:
                ends += [f"{link.delay_ms:g}ms", link.bw]
            links.append(ends)
        return {"hosts": hosts, "switches": switches, "links": links}

    def write(self, run_dir: str | Path, *, switch_extra: Mapping[str, Mapping] | None = None,
              p4info: str | None = None, bmv2_json: str | None = None) -> list[Path]:
        """Write ``plan.json``, ``topology.json`` and ``<switch>-runtime.json`` into ``run_dir``."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        written = []

        def dump(name: str, doc: dict) -> None:
            path = run_dir / name
            path.write_text(json.dumps(doc, indent=2) + "\n")
            written.append(path)

        plan = self.to_dict()
        if switch_extra:
            plan["runtime"] = {k: dict(v) for k, v in switch_extra.items()}
        dump("plan.json", plan)
        dump("topology.json", self.topology_json(switch_extra))
        for s in self.switches:
            dump(f"{s.name}-runtime.json", self.runtime_json(s.name, p4info=p4info, bmv2_json=bmv2_json))
        return written


def compute_routes(
    hosts: Sequence[HostSpec], switches: Iterable[str], links: Sequence[LinkSpec], switch_macs: Mapping[str, str],
    switch_ips: Mapping[str, str] | None = None,
) -> dict[str, tuple[Route, ...]]:
    """Host routes (/32) for every switch along shortest paths (``controller.topology.next_hops_towards``).

    The next hop's MAC is the host's own MAC on its access switch, else the next switch's INA MAC (the P4
    program does not check destination MACs; a real one makes pcaps readable). ``switch_ips``: each switch's
    INA address gets a /32 too on every other switch (where no other switch or host shares it), so that the
    packets of a chain (Rina) travel to the next switch's own address: addressed to one of its workers, the
    final sums that switch multicasts would carry that worker's address as their source, and its kernel
    drops them as martians.
    """
    switches = list(switches)
    names = set(switches)
    adjacency: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)  # switch -> [(peer switch, local port)]
    for link in links:
        if link.node1 in names and link.node2 in names:
            adjacency[link.node1].append((link.node2, link.port1))
            adjacency[link.node2].append((link.node1, link.port2))
    routes: dict[str, list[Route]] = {s: [] for s in switches}
    for host in hosts:
        if host.switch not in names:
            raise PlanError(f"host {host.name} is attached to {host.switch!r}, which is not a switch of the topology")
        routes[host.switch].append(Route(f"{host.ip}/32", host.mac, host.switch_port))
        for switch, (port, towards) in next_hops_towards(adjacency, host.switch).items():
            routes[switch].append(Route(f"{host.ip}/32", switch_macs[towards], port))
    ips = collections.Counter([*(switch_ips or {}).values(), *(h.ip for h in hosts)])
    for name, ip in sorted((switch_ips or {}).items()):
        if name in names and ips[ip] == 1:
            for switch, (port, towards) in next_hops_towards(adjacency, name).items():
                routes[switch].append(Route(f"{ip}/32", switch_macs[towards], port))
    return {s: tuple(r) for s, r in routes.items()}
