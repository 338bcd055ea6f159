"""A topology plan's IPv4 routes (``MyIngress.ipv4_lpm``) onto a freshly started switch.

Before the controller takes over (and for runs without one), the experiment runner makes each switch forward
non-INA traffic: connect as a low-priority client, push the pipeline if the switch has none, write the routes
of the topology's plan (tutorials' ``sX-runtime.json`` works too). The P4Runtime session is the controller's
own client (``controller.switch.Switch``); this module only turns routes into ``ipv4_lpm`` entries.

    python -m topologies.runtime 127.0.0.1:9559 1 run/s1-runtime.json [--p4info p4src/ina.p4info.txt]
"""
from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Self

import grpc

from controller.p4entity import Schema, SchemaError, TableEntry
from controller.switch import Switch, SwitchError, SwitchOptions
from controller.topology import TopologyError, read_runtime_json
from p4src.p4info import P4INFO_PATH, load_p4info
from topologies.plan import FORWARD_ACTION, LPM_TABLE, Route

__all__ = ["RouteInstaller", "SwitchError", "main", "route_entry"]

ELECTION_ID = (0, 1)  # below the controller's (0, 10): the controller takes over as primary when it comes


def route_entry(schema: Schema, route: Route) -> TableEntry:
    """The ``ipv4_lpm`` entry of one route: prefix -> ``ipv4_forward(mac, port)``."""
    net = route.network
    mac = int(route.mac.replace(":", "").replace("-", ""), 16)
    return schema.entry(LPM_TABLE, ((int(net.network_address), net.prefixlen),), FORWARD_ACTION, (mac, route.port))


class RouteInstaller:
    """One primary session with one switch, to give it a pipeline and routes. Use as a context manager."""

    def __init__(self, address: str, device_id: int, *, election_id: tuple[int, int] = ELECTION_ID,
                 timeout: float = 10.0) -> None:
        options = SwitchOptions(f"device {device_id} at {address}", address, device_id, election_id,
                                connect_timeout=timeout, rpc_timeout=timeout)
        self.switch = Switch(options, Schema(load_p4info()))

    def __enter__(self) -> Self:
        try:
            primary = self.switch.connect()
        except BaseException:
            self.switch.close()
            raise
        if not primary:
            self.switch.close()
            raise SwitchError(self.switch.name, "arbitration", grpc.StatusCode.PERMISSION_DENIED,
                              "not primary (another client has a higher election id)")
        return self

    def __exit__(self, *exc: object) -> None:
        self.switch.close()

    def ensure_pipeline(self, p4info_path: str | Path | None = None, device_config_path: str | Path | None = None) -> None:
        """Use the device's pipeline if it has one; else push ``p4info_path`` (and the BMv2 JSON, if given)."""
        try:
            running = self.switch.get_pipeline()
        except SwitchError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            running = None
        if running is not None and running.tables:
            self.switch.schema = Schema(running)
            return
        p4info = load_p4info(p4info_path or P4INFO_PATH)
        config = Path(device_config_path).read_bytes() if device_config_path else b""
        self.switch.push_pipeline(p4info, config)
        self.switch.schema = Schema(p4info)

    def install_routes(self, routes: Iterable[Route]) -> int:
        """Insert every route (modify the ones already there); returns how many were written."""
        return self.install_entries([route_entry(self.switch.schema, r) for r in routes])

    def install_entries(self, entries: list[TableEntry]) -> int:
        if not entries:
            return 0
        try:
            self.switch.insert(*entries)
            return len(entries)
        except SwitchError:
            pass  # some already exist (a second install): one by one, modifying those
        for entry in entries:
            try:
                self.switch.insert(entry)
            except SwitchError as exc:
                if exc.code not in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNKNOWN):
                    raise
                self.switch.modify(entry)
        return len(entries)

    def read_routes(self) -> list[Route]:
        """The routes in the device's ``ipv4_lpm`` table."""
        names = [p.name for p in self.switch.schema.action(FORWARD_ACTION).params]
        routes = []
        for e in self.switch.read_table(LPM_TABLE):
            if e.action != FORWARD_ACTION:
                continue
            (value, plen), = e.match
            params = dict(zip(names, e.params))
            mac = ":".join(f"{b:02x}" for b in params["dstAddr"].to_bytes(6, "big"))
            routes.append(Route(f"{ipaddress.IPv4Address(value)}/{plen}", mac, params["port"]))
        return routes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topologies.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="the switch's gRPC address, e.g. 127.0.0.1:9559")
    parser.add_argument("device_id", type=int)
    parser.add_argument("runtime_json", help="a tutorials-shaped <switch>-runtime.json (from the run directory)")
    parser.add_argument("--p4info", default=str(P4INFO_PATH))
    parser.add_argument("--device-config", help="BMv2 JSON to push when the switch has no pipeline")
    args = parser.parse_args(argv)
    try:
        with RouteInstaller(args.address, args.device_id) as installer:
            installer.ensure_pipeline(args.p4info, args.device_config)
            entries, _groups = read_runtime_json(args.runtime_json, installer.switch.schema)
            n = installer.install_entries([e for e in entries if e.table == LPM_TABLE and e.action == FORWARD_ACTION
                                           and not e.is_default])
    except (OSError, ValueError, KeyError, SchemaError, TopologyError, SwitchError) as exc:
        print(f"topologies.runtime: {exc}", file=sys.stderr)
        return 1
    print(f"{n} routes written to device {args.device_id} at {args.address}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
