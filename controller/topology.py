"""The network the controller drives: p4lang/tutorials ``topology.json`` and ``sX-runtime.json``, or ``--switch``.

``topology.json`` (the tutorials' shape, plus optional keys for our switches)::

    {"hosts":    {"h1": {"ip": "10.0.1.1/24", "mac": "08:00:00:00:01:11", "commands": [...]}},
     "switches": {"s1": {"runtime_json": "s1-runtime.json",              # optional, tutorials' key
                         "grpc": "127.0.0.1:9559", "device_id": 1,       # default 127.0.0.1:50051+i, i
                         "ina": true, "rack": "r1", "pool": 1024,        # default true, switch name, 1024
                         "switch_ip": "10.0.0.254", "switch_mac": "02:00:00:00:00:fe"}},
     "links":    [["h1", "s1-p1"], ["s1-p2", "s2-p2", "0", 0.5]]}

A link's fourth item is its rate in Mbit/s (the tutorials' bandwidth; ``ina-exp`` writes its htb rate there):
the controller sizes each grant's path round-trip floor from it (controller/path_floor.py); a link without
one has no known rate.

A switch's forwarding entries and multicast groups come from its ``runtime_json`` when it has one
(``table_entries``, ``multicast_group_entries``), else they are derived from the links: every host gets
an ``ipv4_lpm`` /32 route on every switch, out of the port on a shortest path to it.
:func:`write_runtime_json` writes that derivation in the tutorials' format.

Without a topology, ``--switch name=s1,addr=127.0.0.1:9559,device_id=1[,ip=..,mac=..,rack=..,ina=..,pool=..,runtime=..]``
describes each switch, and workers name their switch port as ``s1-p3`` instead of a host.
"""
from __future__ import annotations

import ipaddress
import json
import math
import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from controller.errors import ControllerError
from controller.p4entity import MulticastGroup, Schema, SchemaError, TableEntry
from inaproto import wire

__all__ = [
    "DEFAULT_SWITCH_IP",
    "DEFAULT_SWITCH_MAC",
    "HostInfo",
    "LinkRate",
    "SwitchInfo",
    "Topology",
    "TopologyError",
    "next_hops_towards",
    "parse_switch_spec",
    "write_runtime_json",
]

DEFAULT_SWITCH_IP = "10.0.0.254"
DEFAULT_SWITCH_MAC = "02:00:00:00:00:fe"
_PORT_RE = re.compile(r"^(?P<switch>[A-Za-z0-9_.]+)-p(?P<port>\d+)$")


class TopologyError(ControllerError, ValueError):
    """A topology or switch description that cannot be used; the message says where."""


@dataclass(frozen=True)
class SwitchInfo:
    name: str
    address: str
    device_id: int
    ina: bool = True  # runs the INA program (False: a plain switch, its workers are ring members)
    rack: str = ""
    switch_ip: str = DEFAULT_SWITCH_IP  # where its workers send INA packets
    switch_mac: str = DEFAULT_SWITCH_MAC
    pool_size: int = wire.NUM_SLOTS  # aggregator slots the controller hands out, [0, pool_size)
    runtime_json: str | None = None

    def __post_init__(self) -> None:
        if not self.rack:
            object.__setattr__(self, "rack", self.name)
        if not 0 <= self.pool_size <= wire.NUM_SLOTS:
            raise TopologyError(f"switch {self.name}: pool {self.pool_size} outside 0..{wire.NUM_SLOTS}")
        try:
            ipaddress.IPv4Address(self.switch_ip)
        except ValueError:
            raise TopologyError(f"switch {self.name}: switch_ip {self.switch_ip!r} is not an IPv4 address") from None
        if not _is_mac(self.switch_mac):
            raise TopologyError(f"switch {self.name}: switch_mac {self.switch_mac!r} is not a MAC address")


@dataclass(frozen=True)
class HostInfo:
    name: str
    ip: str  # without prefix length
    mac: str
    switch: str
    port: int


def _is_mac(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}", text or ""))


@dataclass(frozen=True)
class LinkRate:
    """A link's rate and one-way delay as the topology gives them (``[a, b, "2ms", 2.0]``: delay, Mbit/s)."""

    mbps: float | None  # None: not given (unshaped)
    delay_s: float = 0.0


_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _link_rate(link: list) -> LinkRate:
    """A topology link's one-way delay (third item: "2ms", "100us", "1s" as Mininet's TCLink takes it, or a number of
    ms) and rate (fourth item, Mbit/s; None where not given)."""
    delay, mbps = (list(link) + [None, None])[2:4]
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(us|ms|s)?\s*", str(delay or "0"))
    try:
        delay_s = float(match[1]) * _DELAY_UNITS[match[2] or "ms"] if match else float("nan")
    except ValueError:
        delay_s = float("nan")
    if not (math.isfinite(delay_s) and delay_s >= 0):
        raise TopologyError(f"link {link!r}: delay {delay!r} must be a finite time >= 0 ('2ms', '100us', '1s')")
    if mbps in (None, ""):
        return LinkRate(None, delay_s)
    try:
        rate = float(mbps)
    except (TypeError, ValueError):
        raise TopologyError(f"link {link!r}: bandwidth {mbps!r} is not a number of Mbit/s") from None
    if not rate > 0 or rate == float("inf"):
        raise TopologyError(f"link {link!r}: bandwidth {mbps!r} must be a positive number of Mbit/s")
    return LinkRate(rate, delay_s)


@dataclass
class Topology:
    switches: dict[str, SwitchInfo]
    hosts: dict[str, HostInfo] = field(default_factory=dict)
    # switch -> {port: neighbour switch}
    trunks: dict[str, dict[int, str]] = field(default_factory=dict)
    base_dir: Path = field(default_factory=Path)
    manages_forwarding: bool = False  # whether ipv4_lpm is the controller's (a topology was given)
    # {node, node} (switch or host names) -> rate and delay, where the topology gives them (Rina's chain round trip);
    # between two switches joined by parallel trunks, the link on the lower-named switch's lowest port (the one its
    # routes and partials take; the other switch's lowest port may be on another of them: keep parallel trunks alike)
    link_rates: dict[frozenset, LinkRate] = field(default_factory=dict)
    # (switch, port) -> Mbit/s of the link on that port (host links and trunks, both ends): the same links' rates by
    # port, for the path round-trip floor (controller/path_floor.py)
    link_mbps: dict[tuple[str, int], float] = field(default_factory=dict)

    # --- loading ------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Topology:
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise TopologyError(f"{path}: {exc}") from None
        return cls.from_dict(doc, base_dir=path.parent)

    @classmethod
    def from_dict(cls, doc: dict, base_dir: Path | str = ".") -> Topology:
        if not isinstance(doc, dict) or not isinstance(doc.get("switches"), dict):
            raise TopologyError("topology needs a 'switches' object")
        switches: dict[str, SwitchInfo] = {}
        for i, (name, sw) in enumerate(doc["switches"].items()):
            sw = sw or {}
            try:
                switches[name] = SwitchInfo(
                    name=name,
                    address=str(sw.get("grpc", f"127.0.0.1:{50051 + i}")),
                    device_id=int(sw.get("device_id", i)),
                    ina=bool(sw.get("ina", True)),
                    rack=str(sw.get("rack", "")),
                    switch_ip=str(sw.get("switch_ip", DEFAULT_SWITCH_IP)),
                    switch_mac=str(sw.get("switch_mac", DEFAULT_SWITCH_MAC)),
                    pool_size=int(sw.get("pool", wire.NUM_SLOTS)),
                    runtime_json=sw.get("runtime_json"),
                )
            except (TypeError, ValueError) as exc:
                raise TopologyError(f"switch {name}: {exc}") from None
        topo = cls(switches, base_dir=Path(base_dir), manages_forwarding=True)
        host_docs = doc.get("hosts", {}) or {}
        attach: dict[str, tuple[str, int]] = {}
        trunk_port: dict[frozenset, int] = {}  # {switch, switch} -> the port (on the lower-named one) of its rate
        for link in doc.get("links", []) or []:
            if not isinstance(link, list) or len(link) < 2:
                raise TopologyError(f"bad link {link!r}")
            a, b = str(link[0]), str(link[1])
            pa, pb = _PORT_RE.match(a), _PORT_RE.match(b)
            rate = _link_rate(link)
            for end in (pa, pb):
                if rate.mbps and end and end["switch"] in switches:
                    topo.link_mbps[(end["switch"], int(end["port"]))] = rate.mbps
            if pa and pb and pa["switch"] in switches and pb["switch"] in switches:
                topo.trunks.setdefault(pa["switch"], {})[int(pa["port"])] = pb["switch"]
                topo.trunks.setdefault(pb["switch"], {})[int(pb["port"])] = pa["switch"]
                key = frozenset((pa["switch"], pb["switch"]))
                port = int(min((pa, pb), key=lambda m: m["switch"])["port"])
                if port < trunk_port.get(key, port + 1):  # parallel trunks: the lower-named switch's lowest port
                    trunk_port[key] = port
                    topo.link_rates[key] = rate
                continue
            for host, port in ((a, pb), (b, pa)):
                if host in host_docs and port and port["switch"] in switches:
                    attach[host] = (port["switch"], int(port["port"]))
                    topo.link_rates[frozenset((host, port["switch"]))] = rate
                    break
            else:
                raise TopologyError(f"link {link!r}: expected host-switch ('h1', 's1-p1') or switch-switch ports")
        for name, h in host_docs.items():
            if name not in attach:
                raise TopologyError(f"host {name} has no link to a switch")
            ip = str(h.get("ip", "")).split("/")[0]
            try:
                ipaddress.IPv4Address(ip)
            except ValueError:
                raise TopologyError(f"host {name}: ip {h.get('ip')!r} is not an IPv4 address") from None
            mac = str(h.get("mac", ""))
            if not _is_mac(mac):
                raise TopologyError(f"host {name}: mac {mac!r} is not a MAC address")
            topo.hosts[name] = HostInfo(name, ip, mac.lower(), *attach[name])
        return topo

    @classmethod
    def from_specs(cls, specs: list[str]) -> Topology:
        switches = {}
        for spec in specs:
            info = parse_switch_spec(spec)
            if info.name in switches:
                raise TopologyError(f"switch {info.name} given twice")
            switches[info.name] = info
        if not switches:
            raise TopologyError("no switch: give --topology FILE or at least one --switch")
        return cls(switches)

    # --- queries ------------------------------------------------------------------------------------
    def neighbour_ports(self) -> dict[str, dict[str, int]]:
        """switch -> neighbour switch -> the lowest local port to it (the port trees' partials take)."""
        out: dict[str, dict[str, int]] = {}
        for sw, ports in self.trunks.items():
            for port, nb in sorted(ports.items()):
                out.setdefault(sw, {}).setdefault(nb, port)
        return out

    def port_mbps(self, switch: str, port: int) -> float | None:
        """The rate of the link on ``switch``'s ``port`` in Mbit/s, or None where the topology gives none."""
        return self.link_mbps.get((switch, port))

    def locate(self, host: str) -> tuple[str, int]:
        """(switch, port) of a worker: a topology host name, or a switch port written ``s1-p3``."""
        h = self.hosts.get(host)
        if h is not None:
            return h.switch, h.port
        m = _PORT_RE.match(host or "")
        if m and m["switch"] in self.switches:
            port = int(m["port"])
            if not 0 <= port < 511:
                raise TopologyError(f"port {port} of {host!r} is out of range")
            return m["switch"], port
        known = ", ".join(sorted(self.hosts)) or "none"
        raise TopologyError(f"unknown host {host!r} (topology hosts: {known}; or name a switch port like s1-p3)")

    def forwarding(self, switch: str, schema: Schema) -> tuple[list[TableEntry], list[MulticastGroup]]:
        """The switch's non-INA entries: from its runtime JSON, else /32 routes derived from the links."""
        info = self.switches[switch]
        if info.runtime_json:
            return read_runtime_json(self.base_dir / info.runtime_json, schema)
        if not self.manages_forwarding:
            return [], []
        links = {sw: [(nb, port) for port, nb in ports.items()] for sw, ports in self.trunks.items()}
        towards: dict[str, dict[str, tuple[int, str]]] = {}
        entries = []
        for h in sorted(self.hosts.values(), key=lambda h: h.name):
            if h.switch == switch:
                port = h.port
            else:
                if h.switch not in towards:
                    towards[h.switch] = next_hops_towards(links, h.switch)
                hop = towards[h.switch].get(switch)
                if hop is None:
                    continue  # unreachable
                port = hop[0]
            entries.append(
                schema.entry(
                    "MyIngress.ipv4_lpm",
                    ((int(ipaddress.IPv4Address(h.ip)), 32),),
                    "MyIngress.ipv4_forward",
                    (int(h.mac.replace(":", ""), 16), port),
                )
            )
        # Every other switch's INA address (where it is its own): chains (Rina) address the next switch there.
        ips = Counter([*(sw.switch_ip for sw in self.switches.values()), *(h.ip for h in self.hosts.values())])
        for name, sw in sorted(self.switches.items()):
            if name == switch or ips[sw.switch_ip] != 1:
                continue
            hop = next_hops_towards(links, name).get(switch)
            if hop is not None:
                entries.append(schema.entry("MyIngress.ipv4_lpm", ((int(ipaddress.IPv4Address(sw.switch_ip)), 32),),
                                            "MyIngress.ipv4_forward",
                                            (int(self.switches[hop[1]].switch_mac.replace(":", ""), 16), hop[0])))
        return entries, []


def next_hops_towards(links: Mapping[str, Iterable[tuple[str, int]]], destination: str) -> dict[str, tuple[int, str]]:
    """The one route computation: every switch that reaches ``destination`` -> (its port, the neighbour) on a
    shortest path there.

    ``links`` maps a switch to its ``(neighbour switch, local port)`` links. Breadth-first out from
    ``destination``, neighbours in name order: a switch reached from ``current`` forwards to ``current``,
    out of its lowest port to it. The controller's derived ``ipv4_lpm`` routes and a topology's plan
    (``topologies.plan.compute_routes``) both come from here.
    """
    hops: dict[str, tuple[int, str]] = {}
    seen = {destination}
    queue = deque([destination])
    while queue:
        current = queue.popleft()
        for peer, _port in sorted(links.get(current, ())):
            if peer in seen:
                continue
            seen.add(peer)
            hops[peer] = (min(p for n, p in links[peer] if n == current), current)
            queue.append(peer)
    return hops


def read_runtime_json(path: str | Path, schema: Schema) -> tuple[list[TableEntry], list[MulticastGroup]]:
    """``table_entries`` and ``multicast_group_entries`` of a tutorials ``sX-runtime.json``."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        entries = [schema.entry_from_json(e) for e in doc.get("table_entries", [])]
        groups = [schema.group_from_json(g) for g in doc.get("multicast_group_entries", [])]
    except (OSError, ValueError, SchemaError) as exc:
        raise TopologyError(f"{path}: {exc}") from None
    return entries, groups


def write_runtime_json(
    path: str | Path,
    entries: list[TableEntry],
    groups: list[MulticastGroup],
    schema: Schema,
    *,
    p4info: str = "p4src/ina.p4info.txt",
    bmv2_json: str = "build/ina.json",
) -> None:
    """Write entries and groups as a tutorials ``sX-runtime.json`` (values as the tutorials write them)."""
    doc = {
        "target": "bmv2",
        "p4info": p4info,
        "bmv2_json": bmv2_json,
        "table_entries": [schema.entry_to_json(e) for e in entries],
        "multicast_group_entries": [schema.group_to_json(g) for g in groups],
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def parse_switch_spec(spec: str) -> SwitchInfo:
    """``name=s1,addr=127.0.0.1:9559,device_id=1[,ip=10.0.0.254,mac=..,rack=r1,ina=true,pool=1024,runtime=F]``."""
    keys = {"name", "addr", "device_id", "ip", "mac", "rack", "ina", "pool", "runtime"}
    fields: dict[str, str] = {}
    for part in spec.split(","):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in keys:
            raise TopologyError(f"--switch {spec!r}: expected key=value pairs with keys {', '.join(sorted(keys))}")
        fields[k] = v.strip()
    for k in ("name", "addr"):
        if not fields.get(k):
            raise TopologyError(f"--switch {spec!r}: {k}= is required")
    try:
        return SwitchInfo(
            name=fields["name"],
            address=fields["addr"],
            device_id=int(fields.get("device_id", "1")),
            ina=fields.get("ina", "true").lower() in ("1", "true", "yes"),
            rack=fields.get("rack", ""),
            switch_ip=fields.get("ip", DEFAULT_SWITCH_IP),
            switch_mac=fields.get("mac", DEFAULT_SWITCH_MAC),
            pool_size=int(fields.get("pool", str(wire.NUM_SLOTS))),
            runtime_json=fields.get("runtime") or None,
        )
    except ValueError as exc:
        raise TopologyError(f"--switch {spec!r}: {exc}") from None
