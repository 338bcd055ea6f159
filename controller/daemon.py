"""``ina-controller``: the controller daemon (switches over P4Runtime, the admission service, SQLite state).

    ina-controller --topology topology.json [--db ina-controller.db] [--listen 127.0.0.1:50060]
    ina-controller --switch name=s1,addr=127.0.0.1:9559,device_id=1 [--switch ...]
    ina-controller --topology topology.json --write-runtime DIR     # write sX-runtime.json files and exit
    ina-controller --config controller.toml --set heartbeat_timeout=0  # settings from a file, one changed

docs/controller.md describes every setting (``--print-config`` prints them all), the reallocation protocol and restart behaviour; docs/security.md
the credentials (the admin credential is written beside the database, mode 0600) and TLS.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from controller.config import DEFAULT_LISTEN, ControllerConfig, LogLevel
from controller.core import Controller, Refusal
from controller.p4entity import Schema
from controller.policies import POLICIES
from controller.service import serve
from controller.store import StoreError
from controller.switch import SwitchError
from controller.topology import Topology, TopologyError, write_runtime_json
from inaproto.cli import Parser, UsageError
from inaproto.commands import repo_path
from inaproto.config import ConfigError, add_config_arguments, from_args, to_toml

log = logging.getLogger("ina-controller")


def build_parser() -> Parser:
    p = Parser(prog="ina-controller", description=__doc__.splitlines()[0],
               epilog="Every other setting (TLS, timeouts, election id, scale, ...): --print-config lists them, "
                      "docs/controller.md explains them.")
    p.add_argument("--topology", type=Path, metavar="FILE", help="p4lang/tutorials topology.json (hosts, switches, links)")
    p.add_argument("--switch", action="append", metavar="SPEC",
                   help="a switch without topology: name=s1,addr=127.0.0.1:9559,device_id=1[,ip=,mac=,rack=,ina=,pool=] (repeatable)")
    p.add_argument("--device-config", type=Path, metavar="FILE",
                   help="p4c's BMv2 JSON (build/ina.json), pushed with the P4Info to simple_switch_grpc; ina-switch needs none")
    p.add_argument("--db", type=Path, metavar="FILE", help="SQLite database (default: ina-controller.db)")
    p.add_argument("--listen", metavar="ADDR", help=f"admission service address (default: {DEFAULT_LISTEN})")
    p.add_argument("--policy", choices=sorted(POLICIES), help="allocation policy of a new database (default: first-fit)")
    p.add_argument("--trees", action="store_const", const=True,
                   help="jobs spanning racks aggregate in a two-level tree (ToRs + a switch linked to all of them)")
    p.add_argument("--force-push", action="store_const", const=True,
                   help="push the pipeline even if a switch already runs it (resets the switch)")
    p.add_argument("--log-level", choices=[v.value for v in LogLevel], help="log level (default: info)")
    p.add_argument("--write-runtime", metavar="DIR", help="write each switch's forwarding entries as sX-runtime.json into DIR and exit")
    add_config_arguments(p, example="heartbeat_timeout=0")
    return p


def config_from(args: argparse.Namespace) -> ControllerConfig:
    """The effective configuration: the --config file, its --set settings, then the flags given."""
    flags = {"topology": args.topology, "switches": tuple(args.switch) if args.switch else None,
             "device_config": args.device_config, "db_path": args.db, "listen": args.listen, "policy": args.policy,
             "trees": args.trees, "force_push": args.force_push, "log_level": args.log_level}
    return from_args(ControllerConfig, args, flags)


def _topology(config: ControllerConfig) -> Topology:
    if config.topology is not None:
        return Topology.load(config.topology)
    return Topology.from_specs(list(config.switches))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_exit(argv)
    try:
        config = config_from(args)
    except ConfigError as exc:
        return UsageError(str(exc)).report("ina-controller")
    if args.print_config:
        sys.stdout.write(to_toml(config))
        return 0
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("ina.p4runtime").setLevel(logging.WARNING)
    try:
        topo = _topology(config)
        if args.write_runtime:
            return _write_runtime(topo, config, Path(args.write_runtime))
        ctl = Controller(topo, config)
        ctl.start()
    except (TopologyError, StoreError, SwitchError, Refusal, OSError, ValueError) as exc:
        print(f"ina-controller: {exc}", file=sys.stderr)
        return 1
    try:
        server, port = serve(ctl, config.listen, tls=config.tls)
    except RuntimeError as exc:
        ctl.stop()
        print(f"ina-controller: {exc}", file=sys.stderr)
        return 1
    host = config.listen.rsplit(":", 1)[0]
    log.info("admission service on %s:%d%s, admin credential in %s, policy %s, %d switch(es), %d job(s)", host, port,
             " (TLS)" if config.tls else "", ctl.authority.path, ctl.policy_info().policy, len(ctl.switches),
             len(ctl.list_jobs()))
    print(f"ina-controller: listening on {host}:{port}", file=sys.stderr, flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("shutting down")
    ctl.stop()
    server.stop(1).wait()
    return 0


def _write_runtime(topo: Topology, config: ControllerConfig, out: Path) -> int:
    """Each switch's forwarding entries as p4lang/tutorials sX-runtime.json files in ``out``."""
    schema = Schema.from_file(config.p4info_path)
    out.mkdir(parents=True, exist_ok=True)
    bmv2_json = str(Path(config.device_config or repo_path("build/ina.json")).absolute())
    for name in topo.switches:
        entries, groups = topo.forwarding(name, schema)
        write_runtime_json(out / f"{name}-runtime.json", entries, groups, schema, p4info=str(config.p4info_path),
                           bmv2_json=bmv2_json)
        print(out / f"{name}-runtime.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
