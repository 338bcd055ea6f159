"""Built-in topologies: one rack (star), racks under a spine (leaf-spine), and p4lang/tutorials' topology.json.

Every topology is a Mininet ``Topo`` whose hosts are :class:`~topologies.nodes.P4Host` and whose links are
:class:`~topologies.nodes.InaLink` (set per node and link, so ``mn --custom`` needs no ``--host``/``--link``);
the switch class is left to the caller (``InaNetwork`` or ``mn --switch inaswitch``). After ``build()`` each
topology has a :class:`~topologies.plan.NetworkPlan` in ``.plan``: every address, port and route, which the
switch nodes and hosts are configured from and which the controller reads.

Bandwidths are Mbit/s on ``htb`` (both directions of a link). Heterogeneous clusters: give ``bw`` per host.
There is no ``netem`` on this kernel: loss comes from ina-switch's fault options (``P4Switch``'s ``faults``)
and propagation delay from its ``--link-delay`` (``rtt_ms``: the round trip a worker sees to its first
switch; every link gets a one-way delay of ``rtt_ms / 2``, held at the switch ends: all of it at the switch
port of a host link, half at each end of a switch-switch link). topology.json latencies are ignored with a
note in ``plan.notes``.
"""
from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mininet.topo import Topo

from topologies.nodes import InaLink, P4Host
from topologies.plan import (
    DROP_ACTION,
    FORWARD_ACTION,
    INTF_PREFIX,
    LPM_TABLE,
    HostSpec,
    LinkSpec,
    NetworkPlan,
    PlanError,
    Route,
    SwitchSpec,
    compute_routes,
    host_address,
    port_intf_name,
    port_mac,
    switch_address,
)

__all__ = ["InaTopo", "LeafSpineTopo", "StarTopo", "TopologyJson", "parse_bandwidths", "parse_racks"]

Bandwidth = float | int | str | Sequence[float | int | None] | None


def parse_bandwidths(bw: Bandwidth, count: int, what: str = "bw") -> list[float | None]:
    """One bandwidth (Mbit/s or None) per link from a number, a list, or ``"10:20:40"`` (``mn --topo``)."""
    if bw is None or bw == "":
        return [None] * count
    if isinstance(bw, (int, float)):
        values: list[Any] = [bw] * count
    elif isinstance(bw, str):
        parts = [p for p in re.split(r"[:/;+ ]", bw) if p]
        values = parts if len(parts) > 1 else parts * count
    else:
        values = list(bw)
    if len(values) != count:
        raise PlanError(f"{what}: {len(values)} bandwidths given for {count} links")
    out: list[float | None] = []
    for v in values:
        if v is None or v in ("", "none", "None"):
            out.append(None)
            continue
        f = float(v)
        if not 0 < f <= 1000:
            raise PlanError(f"{what}: {f} Mbit/s is outside (0, 1000] (Mininet's htb range)")
        out.append(f)
    return out


def parse_racks(racks: int | str | Iterable[int] | None, count: int) -> set[int]:
    """Rack numbers from None (all), an int, ``"1:3"`` (``mn --topo``) or an iterable."""
    if racks is None:
        return set(range(1, count + 1))
    if isinstance(racks, int):
        chosen = {racks}
    elif isinstance(racks, str):
        chosen = {int(p) for p in re.split(r"[:/;+ ]", racks) if p}
    else:
        chosen = {int(r) for r in racks}
    bad = sorted(r for r in chosen if not 1 <= r <= count)
    if bad:
        raise PlanError(f"racks {bad} do not exist (racks are 1..{count})")
    return chosen


def _delay(ms: Any) -> float:
    """A one-way delay in ms (``mn`` passes text); PlanError if negative."""
    value = float(ms or 0.0)
    if not value >= 0:
        raise PlanError(f"delay {ms!r} ms must be >= 0")
    return value


def _flag(value: Any) -> bool:
    """A boolean from Python or from ``mn --topo name,key=value`` (``true``/``false``/``1``/``0``)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class InaTopo(Topo):
    """Base of this project's topologies: records every node and link as plan data while building.

    Subclasses implement ``build()`` with :meth:`add_p4_switch`, :meth:`add_p4_host`, :meth:`link_host`
    and :meth:`link_switches`; the plan (``self.plan``) and the per-node Mininet parameters (ARP entries,
    default routes, switch routes) are computed once ``build()`` returns.
    """

    def __init__(self, *args: Any, intf_prefix: str = INTF_PREFIX, **params: Any) -> None:
        self.intf_prefix = intf_prefix
        self._host_specs: dict[str, HostSpec] = {}
        self._switch_specs: dict[str, SwitchSpec] = {}
        self._link_specs: list[LinkSpec] = []
        self._fixed_routes: dict[str, tuple[Route, ...]] = {}
        self._auto_host_config: dict[str, bool] = {}
        self._notes: list[str] = []
        self._port_delay_ms: dict[str, dict[int, float]] = {}  # switch -> port -> ms held each way
        self.plan: NetworkPlan | None = None
        super().__init__(*args, **params)
        self._finalize()

    # --- building blocks -----------------------------------------------------------------------------
    def add_p4_switch(
        self, name: str, *, device_id: int, ip: str, mac: str, rack: int = 0, ina: bool = True, role: str = "tor", **opts: Any
    ) -> str:
        if name in self._switch_specs or name in self._host_specs:
            raise PlanError(f"duplicate node name {name!r}")
        if any(s.device_id == device_id for s in self._switch_specs.values()):
            raise PlanError(f"duplicate device id {device_id} ({name})")
        self._switch_specs[name] = SwitchSpec(name=name, device_id=device_id, ip=ip, mac=mac, rack=rack, ina=ina, role=role)
        return self.addSwitch(name, device_id=device_id, ina_ip=ip, ina_mac=mac, ina=ina, rack=rack, role=role, **opts)

    def add_p4_host(
        self, name: str, *, cidr: str, mac: str, rack: int = 0, commands: Sequence[str] = (), auto_config: bool = True
    ) -> str:
        if name in self._switch_specs or name in self._host_specs:
            raise PlanError(f"duplicate node name {name!r}")
        iface = ipaddress.IPv4Interface(cidr if "/" in cidr else f"{cidr}/24")
        self._host_specs[name] = HostSpec(
            name=name, ip=str(iface.ip), prefix_len=iface.network.prefixlen, mac=mac.lower(), switch="", switch_port=0,
            rack=rack, commands=tuple(commands),
        )
        self._auto_host_config[name] = auto_config
        return self.addHost(name, cls=P4Host, ip=str(iface))

    def link_host(self, host: str, switch: str, port: int, bw: float | None = None, delay_ms: float = 0.0) -> None:
        """A host's one link; ``delay_ms`` one way, all of it held at the switch port."""
        spec, sw = self._host_specs[host], self._switch_specs[switch]
        if spec.switch:
            raise PlanError(f"host {host} already has a link (to {spec.switch}); hosts here have one interface")
        self._check_port(switch, port)
        self._host_specs[host] = replace(
            spec, switch=switch, switch_port=port, bw=bw, switch_ip=sw.ip, switch_mac=sw.mac,
        )
        self._switch_specs[switch] = replace(sw, ports=sw.ports + ((port, host),))
        self._link_specs.append(LinkSpec(host, 0, switch, port, bw, _delay(delay_ms)))
        if delay_ms:
            self._port_delay_ms.setdefault(switch, {})[port] = delay_ms
        self.addLink(
            host, switch, port1=0, port2=port, cls=InaLink, bw=bw,
            intfName1="eth0", intfName2=port_intf_name(switch, port, self.intf_prefix),
            addr1=spec.mac, addr2=port_mac(sw.device_id, port),
        )

    def link_switches(self, a: str, port_a: int, b: str, port_b: int, bw: float | None = None, delay_ms: float = 0.0) -> None:
        """A switch-switch link; ``delay_ms`` one way, half held at each end."""
        sa, sb = self._switch_specs[a], self._switch_specs[b]
        self._check_port(a, port_a)
        self._check_port(b, port_b)
        self._switch_specs[a] = replace(sa, ports=sa.ports + ((port_a, b),))
        self._switch_specs[b] = replace(sb, ports=sb.ports + ((port_b, a),))
        self._link_specs.append(LinkSpec(a, port_a, b, port_b, bw, _delay(delay_ms)))
        if delay_ms:
            self._port_delay_ms.setdefault(a, {})[port_a] = delay_ms / 2
            self._port_delay_ms.setdefault(b, {})[port_b] = delay_ms / 2
        self.addLink(
            a, b, port1=port_a, port2=port_b, cls=InaLink, bw=bw,
            intfName1=port_intf_name(a, port_a, self.intf_prefix), intfName2=port_intf_name(b, port_b, self.intf_prefix),
            addr1=port_mac(sa.device_id, port_a), addr2=port_mac(sb.device_id, port_b),
        )

    def _check_port(self, switch: str, port: int) -> None:
        if not 1 <= port <= 511 or port == 255:
            raise PlanError(f"{switch}: port {port} is not a data port (1..511, 255 is the CPU port)")
        if any(p == port for p, _ in self._switch_specs[switch].ports):
            raise PlanError(f"{switch}: port {port} is used twice")

    def note(self, text: str) -> None:
        self._notes.append(text)

    # --- the plan ------------------------------------------------------------------------------------
    def _finalize(self) -> None:
        hosts = list(self._host_specs.values())
        for h in hosts:
            if not h.switch:
                raise PlanError(f"host {h.name} is not linked to a switch")
        final_hosts = []
        for h in hosts:
            if self._auto_host_config[h.name]:
                subnet = ipaddress.IPv4Interface(h.cidr).network
                gateway = h.switch_ip
                if gateway is None or ipaddress.IPv4Address(gateway) not in subnet:
                    gateway = str(subnet.broadcast_address - 1)
                arp = [(gateway, h.switch_mac)]
                if h.switch_ip and h.switch_ip != gateway:
                    arp.append((h.switch_ip, h.switch_mac))
                arp += [(o.ip, o.mac) for o in hosts if o.name != h.name and ipaddress.IPv4Address(o.ip) in subnet]
                h = replace(h, gateway=gateway, arp=tuple(arp))
            final_hosts.append(h)
            self.setNodeInfo(h.name, {
                **self.nodeInfo(h.name), "gateway": h.gateway, "arp": list(h.arp), "commands": list(h.commands),
                "switch_ip": h.switch_ip, "switch_mac": h.switch_mac,
            })
        macs = {s.name: s.mac for s in self._switch_specs.values()}
        computed = compute_routes(final_hosts, list(self._switch_specs), self._link_specs, macs,
                                  {s.name: s.ip for s in self._switch_specs.values()})
        switches = []
        for s in self._switch_specs.values():
            routes = self._fixed_routes.get(s.name, computed[s.name])
            s = replace(s, ports=tuple(sorted(s.ports)), routes=routes)
            switches.append(s)
            info = {**self.nodeInfo(s.name), "routes": list(routes)}
            if self._port_delay_ms.get(s.name):
                info["link_delay_ms"] = dict(sorted(self._port_delay_ms[s.name].items()))
            self.setNodeInfo(s.name, info)
        self.plan = NetworkPlan(
            hosts=tuple(final_hosts), switches=tuple(switches), links=tuple(self._link_specs),
            intf_prefix=self.intf_prefix, notes=tuple(self._notes),
        )


class StarTopo(InaTopo):
    """One rack: ``n_workers`` hosts ``h1..hN`` on switch ``s1`` (host ``i`` on port ``i``).

    ``bw``: Mbit/s for every host link, or one value per host (heterogeneous workers), or None.
    ``rtt_ms``: round trip added between every worker and the switch (``rtt_ms / 2`` each way).
    ``mn --topo star,4,bw=10`` or ``--topo star,3,bw=10:20:40`` or ``--topo star,8,bw=2,rtt_ms=10``.
    """

    def build(self, n_workers: int = 2, bw: Bandwidth = None, rack: int = 1, ina: bool = True,  # type: ignore[override]
              rtt_ms: float = 0.0) -> None:
        n_workers, rack = int(n_workers), int(rack)
        if n_workers < 1:
            raise PlanError("a star needs at least one worker")
        bws = parse_bandwidths(bw, n_workers)
        sw_ip, sw_mac = switch_address(rack)
        switch = self.add_p4_switch("s1", device_id=1, ip=sw_ip, mac=sw_mac, rack=rack, ina=_flag(ina))
        for i in range(1, n_workers + 1):
            ip, mac = host_address(rack, i)
            host = self.add_p4_host(f"h{i}", cidr=f"{ip}/24", mac=mac, rack=rack)
            self.link_host(host, switch, i, bws[i - 1], _delay(rtt_ms) / 2)


class LeafSpineTopo(InaTopo):
    """``racks`` racks of ``workers_per_rack`` hosts, one leaf switch each (``s1..sR``), under ``spine1``.

    Rack ``r``'s hosts are ``10.0.r.1..``, named ``h1..`` in rack order, on leaf ports ``1..W``; the
    leaf's uplink is port ``W + 1``, and the spine's port ``r`` goes to rack ``r``.

    Args:
        ina_racks: racks whose switch may aggregate (default: all). A rack without INA still has a leaf
            running the same program and forwarding the same way; the plan marks it ``ina=False`` and the
            controller gives it no slots, so its workers fall back to ring all-reduce (Rina's incremental
            deployment). ``mn``: ``ina_racks=1`` or ``ina_racks=1:3``.
        bw: host links, Mbit/s: one value, or one per host (heterogeneous).
        uplink_bw: leaf-spine links: one value, or one per rack.
        spine_ina: whether the spine may aggregate too (default no).
        rtt_ms: round trip between a worker and its leaf; every link (host and uplink) is ``rtt_ms / 2`` one
            way, so a worker's round trip to the spine is ``2 * rtt_ms``.
    """

    def build(  # type: ignore[override]
        self,
        racks: int = 2,
        workers_per_rack: int = 2,
        ina_racks: int | str | Iterable[int] | None = None,
        bw: Bandwidth = None,
        uplink_bw: Bandwidth = None,
        spine_ina: bool = False,
        rtt_ms: float = 0.0,
    ) -> None:
        racks, per_rack = int(racks), int(workers_per_rack)
        if racks < 1 or per_rack < 1:
            raise PlanError("leaf-spine needs at least one rack of at least one worker")
        with_ina = parse_racks(ina_racks, racks)
        host_bws = parse_bandwidths(bw, racks * per_rack)
        up_bws = parse_bandwidths(uplink_bw, racks, "uplink_bw")
        spine_ip, spine_mac = switch_address(0)
        spine = self.add_p4_switch(
            "spine1", device_id=racks + 1, ip=spine_ip, mac=spine_mac, rack=0, ina=_flag(spine_ina), role="spine",
        )
        n = 0
        for r in range(1, racks + 1):
            sw_ip, sw_mac = switch_address(r)
            leaf = self.add_p4_switch(f"s{r}", device_id=r, ip=sw_ip, mac=sw_mac, rack=r, ina=r in with_ina, role="leaf")
            for i in range(1, per_rack + 1):
                ip, mac = host_address(r, i)
                n += 1
                host = self.add_p4_host(f"h{n}", cidr=f"{ip}/24", mac=mac, rack=r)
                self.link_host(host, leaf, i, host_bws[n - 1], _delay(rtt_ms) / 2)
            self.link_switches(leaf, per_rack + 1, spine, r, up_bws[r - 1], _delay(rtt_ms) / 2)


class TopologyJson(InaTopo):
    """A p4lang/tutorials ``topology.json``: hosts (``ip``, ``mac``, ``commands``), switches, links.

    Links are ``[a, b]`` or ``[a, b, latency, bandwidth]`` with switch ends written ``s1-p2``. A switch's
    ``runtime_json`` (relative to the file), if present, gives its ``ipv4_lpm`` routes; otherwise routes
    are computed along shortest paths. Hosts with ``commands`` are configured by them (as in the
    tutorials); hosts without get this project's static ARP entries and default route. Latencies other
    than 0 are ignored (no netem here) and noted in ``plan.notes``. Switches may carry ``device_id``,
    ``ip``/``mac`` (their INA address), ``ina`` and ``cpu_port``; hosts listed without addresses
    (the tutorials' oldest format) get ``10.0.<switch device id>.<n>``.
    """

    def build(self, path: str | Path) -> None:  # type: ignore[override]
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise PlanError(f"cannot read topology file {path}: {exc}") from exc
        for key in ("hosts", "switches", "links"):
            if key not in doc:
                raise PlanError(f"{path}: no {key!r} key (expected p4lang/tutorials' topology.json shape)")
        switches = doc["switches"] if isinstance(doc["switches"], dict) else {s: {} for s in doc["switches"]}
        raw_hosts = doc["hosts"] if isinstance(doc["hosts"], dict) else {h: {} for h in doc["hosts"]}
        links = [self._parse_link(link, path) for link in doc["links"]]

        used_ids: set[int] = set()
        for name, params in switches.items():
            params = params or {}
            dev = params.get("device_id")
            if dev is None:
                digits = re.findall(r"\d+", name)
                dev = int(digits[0]) if digits and int(digits[0]) not in used_ids else max(used_ids | {0}) + 1
            used_ids.add(int(dev))
            ip, mac = params.get("ip"), params.get("mac")
            if ip is None or mac is None:
                auto_ip, auto_mac = switch_address(int(dev) % 251)
                ip, mac = ip or auto_ip, mac or auto_mac
            opts = {k: params[k] for k in ("cpu_port",) if k in params}
            if "program" in params:
                self.note(f"{name}: per-switch program {params['program']!r} ignored; every switch runs the INA program")
            self.add_p4_switch(name, device_id=int(dev), ip=ip, mac=mac, rack=int(dev), ina=_flag(params.get("ina", True)), **opts)
            runtime = params.get("runtime_json")
            if runtime:
                rpath = (path.parent / runtime) if not Path(runtime).is_absolute() else Path(runtime)
                if rpath.exists():
                    self._fixed_routes[name] = self._routes_from_runtime(rpath)
                else:
                    self.note(f"{name}: runtime_json {runtime!r} not found; routes computed instead")

        attached = {}  # host -> (switch, port)
        for a, b, _latency, _bw in links:
            for h, s in ((a, b), (b, a)):
                if h[0] in raw_hosts and s[0] in switches:
                    attached[h[0]] = (s[0], s[1])
        counters: dict[str, int] = {}
        for name, params in raw_hosts.items():
            params = params or {}
            if name not in attached:
                raise PlanError(f"{path}: host {name} has no link to a switch")
            sw, _port = attached[name]
            ip, mac = params.get("ip"), params.get("mac")
            if ip is None or mac is None:
                counters[sw] = counters.get(sw, 0) + 1
                rack = self._switch_specs[sw].device_id % 251 or 1
                auto_ip, auto_mac = host_address(rack, counters[sw])
                ip, mac = ip or f"{auto_ip}/24", mac or auto_mac
            commands = list(params.get("commands", []))
            rack = self._switch_specs[sw].rack
            self.add_p4_host(name, cidr=ip, mac=mac, rack=rack, commands=commands, auto_config=not commands)

        for a, b, latency, bw in links:
            if latency not in (None, 0, "0", "0ms", "0.0ms"):
                self.note(f"link {a[0]}-{b[0]}: latency {latency} ignored (no netem on this kernel)")
            bw = float(bw) if bw not in (None, "") else None
            a_host, b_host = a[0] in raw_hosts, b[0] in raw_hosts
            if a_host and b_host:
                raise PlanError(f"{path}: link {a[0]}-{b[0]} joins two hosts; hosts attach to switches")
            if a_host or b_host:
                (h, _), (s, port) = (a, b) if a_host else (b, a)
                if port is None:
                    raise PlanError(f"{path}: the switch end of link {h}-{s} needs a port (write it {s}-p<N>)")
                self.link_host(h, s, port, bw)
            else:
                if a[1] is None or b[1] is None:
                    raise PlanError(f"{path}: switch link {a[0]}-{b[0]} needs ports on both ends (s1-p2)")
                self.link_switches(a[0], a[1], b[0], b[1], bw)

    @staticmethod
    def _parse_link(link: Any, path: Path) -> tuple[tuple[str, int | None], tuple[str, int | None], Any, Any]:
        if isinstance(link, dict):  # tolerate {"node1": .., "node2": .., "latency": .., "bandwidth": ..}
            link = [link.get("node1"), link.get("node2"), link.get("latency"), link.get("bandwidth")]
        if not isinstance(link, list) or len(link) < 2:
            raise PlanError(f"{path}: bad link {link!r}; expected [a, b, latency?, bandwidth?]")

        def end(text: str) -> tuple[str, int | None]:
            m = re.fullmatch(r"(.+)-p(\d+)", str(text))
            return (m.group(1), int(m.group(2))) if m else (str(text), None)

        return end(link[0]), end(link[1]), link[2] if len(link) > 2 else None, link[3] if len(link) > 3 else None

    @staticmethod
    def _routes_from_runtime(rpath: Path) -> tuple[Route, ...]:
        doc = json.loads(rpath.read_text())
        routes = []
        for entry in doc.get("table_entries", []):
            if entry.get("table") != LPM_TABLE or entry.get("default_action"):
                continue
            if entry.get("action_name") != FORWARD_ACTION:
                if entry.get("action_name") != DROP_ACTION:
                    raise PlanError(f"{rpath}: unsupported action {entry.get('action_name')!r} in {LPM_TABLE}")
                continue
            addr, plen = entry["match"]["hdr.ipv4.dstAddr"]
            params = entry["action_params"]
            routes.append(Route(f"{addr}/{plen}", str(params["dstAddr"]).lower(), int(params["port"])))
        return tuple(routes)
