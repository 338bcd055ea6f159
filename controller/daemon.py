"""``ina-controller``: the controller daemon (switches over P4Runtime, the admission service, SQLite state).

    ina-controller --topology topology.json [--db ina-controller.db] [--listen 127.0.0.1:50060]
    ina-controller --switch name=s1,addr=127.0.0.1:9559,device_id=1 [--switch ...]
    ina-controller --topology topology.json --write-runtime DIR     # write sX-runtime.json files and exit

docs/controller.md describes every option, the reallocation protocol and restart behaviour; docs/security.md
the credentials (the admin credential is written beside the database, mode 0600) and TLS.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from controller.auth import ServerTls, SwitchTls
from controller.core import DEFAULT_SCALE, Controller, ControllerOptions, Refusal
from controller.p4entity import Schema
from controller.policies import POLICIES
from controller.service import serve
from controller.store import StoreError
from controller.switch import SwitchError
from controller.topology import Topology, TopologyError, write_runtime_json
from inaproto.cli import Parser
from inaproto.commands import REPO, repo_path

DEFAULT_LISTEN = "127.0.0.1:50060"

log = logging.getLogger("ina-controller")


def _election_id(text: str) -> tuple[int, int]:
    try:
        parts = [int(p, 0) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HIGH,LOW or LOW (integers)") from None
    if len(parts) == 1:
        parts = [0, parts[0]]
    if len(parts) != 2 or min(parts) < 0 or parts == [0, 0]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HIGH,LOW with non-negative values, not 0,0")
    return parts[0], parts[1]


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def build_parser() -> Parser:
    p = Parser(prog="ina-controller", description=__doc__.splitlines()[0])
    net = p.add_argument_group("switches")
    net.add_argument("--topology", metavar="FILE", help="p4lang/tutorials topology.json (hosts, switches, links)")
    net.add_argument(
        "--switch", action="append", default=[], metavar="SPEC",
        help="a switch without topology: name=s1,addr=127.0.0.1:9559,device_id=1[,ip=,mac=,rack=,ina=,pool=,runtime=] (repeatable)",
    )
    net.add_argument("--p4info", default=str(REPO / "p4src" / "ina.p4info.txt"), help="P4Info text file (default: %(default)s)")
    net.add_argument(
        "--device-config", metavar="FILE",
        help="device config pushed with the P4Info: p4c's BMv2 JSON (build/ina.json) for simple_switch_grpc; "
        "ina-switch accepts none (the default) or that JSON",
    )
    net.add_argument("--election-id", type=_election_id, default=(0, 10), metavar="HIGH,LOW", help="P4Runtime election id (default: 0,10)")
    net.add_argument("--force-push", action="store_true", help="push the pipeline even if the switch already runs it (resets the switch)")
    net.add_argument("--connect-timeout", type=_positive, default=10.0, metavar="S", help="wait this long for each switch (default: 10)")
    net.add_argument("--switch-tls-ca", metavar="PEM", help="P4Runtime over TLS: the switches' CA certificate")
    net.add_argument("--switch-tls-cert", metavar="PEM", help="client certificate for switches that require one")
    net.add_argument("--switch-tls-key", metavar="PEM", help="its private key")
    net.add_argument("--switch-tls-name", metavar="NAME", default="", help="name to check in the switches' certificates (default: the host of each address)")
    net.add_argument("--write-runtime", metavar="DIR", help="write each switch's forwarding entries as sX-runtime.json into DIR and exit")
    svc = p.add_argument_group("admission service")
    svc.add_argument("--listen", default=DEFAULT_LISTEN, metavar="ADDR", help="admission service address (default: %(default)s)")
    svc.add_argument("--db", default="ina-controller.db", metavar="FILE", help="SQLite database (default: %(default)s)")
    svc.add_argument("--policy", default="first-fit", choices=sorted(POLICIES), help="allocation policy for a new database (default: %(default)s)")
    svc.add_argument("--admin-credential", metavar="FILE", help="admin credential file, made (mode 0600) if missing (default: DB.admin)")
    svc.add_argument("--tls-cert", metavar="PEM", help="serve the admission service over TLS with this certificate")
    svc.add_argument("--tls-key", metavar="PEM", help="its private key")
    svc.add_argument("--tls-client-ca", metavar="PEM", help="require client certificates signed by this CA")
    svc.add_argument("--heartbeat-timeout", type=float, default=15.0, metavar="S", help="release jobs silent this long; 0: never (default: 15)")
    svc.add_argument("--sync-timeout", type=_positive, default=30.0, metavar="S", help="longest SyncGeneration wait (default: 30)")
    svc.add_argument("--rina-layout", choices=("chains", "relay"), default="chains",
                     help="Rina jobs as chains across their racks' switches, workers of racks without INA as host members "
                          "(the grant says so: agents follow it), or the relay Rina (a representative per rack) (default: %(default)s)")
    svc.add_argument("--rina-chains", dest="rina_layout", action="store_const", const="chains",
                     help="the same as --rina-layout chains (the default)")
    svc.add_argument("--trees", action="store_true",
                     help="jobs spanning racks aggregate in a two-level tree (ToRs + a switch linked to all of them) "
                          "where every switch of it has slots; else Rina or the ring")
    svc.add_argument("--scale", type=_positive, default=DEFAULT_SCALE, help="fixed-point scale handed to agents (default: 65536 = 2**16)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _topology(args: argparse.Namespace) -> Topology:
    if args.topology and args.switch:
        raise TopologyError("give --topology or --switch, not both")
    if args.topology:
        return Topology.load(args.topology)
    return Topology.from_specs(args.switch)


def _tls(args: argparse.Namespace) -> tuple[ServerTls | None, SwitchTls | None]:
    """The TLS options, checked: files named in pairs, each readable."""
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
    if bool(args.switch_tls_cert) != bool(args.switch_tls_key):
        raise ValueError("--switch-tls-cert and --switch-tls-key go together")
    if args.switch_tls_cert and not args.switch_tls_ca:
        raise ValueError("--switch-tls-cert needs --switch-tls-ca")
    for f in (args.tls_cert, args.tls_key, args.tls_client_ca, args.switch_tls_ca, args.switch_tls_cert, args.switch_tls_key):
        if f and not Path(f).is_file():
            raise ValueError(f"{f}: no such file")
    server = ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca or "") if args.tls_cert else None
    switch = (SwitchTls(args.switch_tls_ca, args.switch_tls_cert or "", args.switch_tls_key or "", args.switch_tls_name)
              if args.switch_tls_ca else None)
    return server, switch


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_exit(argv)
    try:
        server_tls, switch_tls = _tls(args)
    except ValueError as exc:
        print(f"ina-controller: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("ina.p4runtime").setLevel(logging.WARNING)
    try:
        topo = _topology(args)
        if args.write_runtime:
            schema = Schema.from_file(args.p4info)
            out = Path(args.write_runtime)
            out.mkdir(parents=True, exist_ok=True)
            for name in topo.switches:
                entries, groups = topo.forwarding(name, schema)
                write_runtime_json(out / f"{name}-runtime.json", entries, groups, schema,
                                   p4info=args.p4info, bmv2_json=str(Path(args.device_config or repo_path("build/ina.json")).absolute()))
                print(out / f"{name}-runtime.json")
            return 0
        device_config = Path(args.device_config).read_bytes() if args.device_config else b""
        options = ControllerOptions(
            db_path=Path(args.db),
            p4info_path=Path(args.p4info),
            device_config=device_config,
            policy=args.policy,
            election_id=args.election_id,
            heartbeat_timeout=args.heartbeat_timeout,
            sync_timeout=args.sync_timeout,
            scale=args.scale,
            force_push=args.force_push,
            connect_timeout=args.connect_timeout,
            rina_chains=args.rina_layout == "chains",
            trees=args.trees,
            admin_credential=Path(args.admin_credential) if args.admin_credential else None,
            switch_tls=switch_tls,
        )
        ctl = Controller(topo, options)
        ctl.start()
    except (TopologyError, StoreError, SwitchError, Refusal, OSError, ValueError) as exc:
        print(f"ina-controller: {exc}", file=sys.stderr)
        return 1
    try:
        server, port = serve(ctl, args.listen, tls=server_tls)
    except RuntimeError as exc:
        ctl.stop()
        print(f"ina-controller: {exc}", file=sys.stderr)
        return 1
    host = args.listen.rsplit(":", 1)[0]
    log.info("admission service on %s:%d%s, admin credential in %s, policy %s, %d switch(es), %d job(s)", host, port, " (TLS)" if server_tls else "",
             ctl.authority.path, ctl.policy_info().policy, len(ctl.switches), len(ctl.list_jobs()))
    print(f"ina-controller: listening on {host}:{port}", file=sys.stderr, flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("shutting down")
    ctl.stop()
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
