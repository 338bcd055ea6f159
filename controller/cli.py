"""``inactl``: read and steer a running controller through its admission service.

    inactl [--controller ADDR] jobs | job show ID | memory | stats [ID] | policy show | policy set NAME
           | release ID | watch [--interval S] [--count N]

Every read command takes ``--json``. Errors are one line on stderr and a non-zero exit status:
1 for a refused request (unknown job, bad policy name), 2 for bad arguments, 3 when the controller
cannot be reached. ``--controller`` defaults to $INA_CONTROLLER, else 127.0.0.1:50060. Every call carries the
admin credential the controller wrote beside its database: ``--credential-file`` defaults to
$INA_ADMIN_CREDENTIAL_FILE, else ina-controller.db.admin (the controller's default --db, + .admin); a job's
secret in such a file shows and releases that job only. TLS: ``--tls-ca`` (and ``--tls-cert``/``--tls-key``),
or $INA_TLS_CA, $INA_TLS_CERT, $INA_TLS_KEY (docs/security.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TextIO

import grpc
from google.protobuf import json_format

from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.backends import Backend
from inaproto.cli import EXIT_USAGE, Parser, UsageError
from inaproto.credentials import ADMIN_CREDENTIAL_ENV, CONTROLLER_ENV, TlsFiles, admission_channel, read_credential_file

DEFAULT_CONTROLLER = "127.0.0.1:50060"
DEFAULT_CREDENTIAL_FILE = "ina-controller.db.admin"  # beside the controller's default database
EXIT_REFUSED, EXIT_UNREACHABLE = 1, 3  # and EXIT_USAGE (2)


def _job_id(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"job id must be an integer, got {text!r}") from None
    if not 0 <= v < 1 << 32:
        raise argparse.ArgumentTypeError(f"job id {v} out of range")
    return v


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--controller", default=argparse.SUPPRESS, metavar="ADDR", help="controller address (default: $INA_CONTROLLER or 127.0.0.1:50060)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="S", help="RPC timeout in seconds (default: 5)")
    common.add_argument("--credential-file", default=argparse.SUPPRESS, metavar="FILE",
                        help=f"credential to send (default: ${ADMIN_CREDENTIAL_ENV} or {DEFAULT_CREDENTIAL_FILE})")
    common.add_argument("--tls-ca", default=argparse.SUPPRESS, metavar="PEM", help="TLS: the controller's CA (default: $INA_TLS_CA)")
    common.add_argument("--tls-cert", default=argparse.SUPPRESS, metavar="PEM", help="TLS client certificate (default: $INA_TLS_CERT)")
    common.add_argument("--tls-key", default=argparse.SUPPRESS, metavar="PEM", help="its key (default: $INA_TLS_KEY)")
    reader = Parser(add_help=False, parents=[common])
    reader.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")

    p = Parser(prog="inactl", description="Inspect and steer the INA controller.", parents=[reader])
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    sub.add_parser("jobs", parents=[reader], help="list jobs")
    job = sub.add_parser("job", parents=[reader], help="one job")
    jsub = job.add_subparsers(dest="job_command", metavar="show", parser_class=Parser)
    jsub.required = True
    show = jsub.add_parser("show", parents=[reader], help="a job's grant, request and state")
    show.add_argument("job_id", type=_job_id, metavar="ID")
    sub.add_parser("memory", parents=[reader], help="slot map per switch")
    stats = sub.add_parser("stats", parents=[reader], help="per-job counters read from the switches")
    stats.add_argument("job_id", type=_job_id, nargs="?", default=0, metavar="ID")
    pol = sub.add_parser("policy", parents=[reader], help="show or set the allocation policy")
    psub = pol.add_subparsers(dest="policy_command", metavar="show|set", parser_class=Parser)
    psub.required = True
    psub.add_parser("show", parents=[reader], help="current and available policies")
    pset = psub.add_parser("set", parents=[reader], help="switch policy (reallocates every switch)")
    pset.add_argument("name")
    rel = sub.add_parser("release", parents=[common], help="release a job (its slots go to waiting jobs)")
    rel.add_argument("job_id", type=_job_id, metavar="ID")
    watch = sub.add_parser("watch", parents=[reader], help="live view of jobs and memory")
    watch.add_argument("--interval", type=float, default=1.0, metavar="S", help="refresh period (default: 1)")
    watch.add_argument("--count", type=int, default=0, metavar="N", help="stop after N refreshes (default: never)")
    return p


# --- rendering ------------------------------------------------------------------------------------------
def _to_dict(msg) -> dict:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True, including_default_value_fields=True)


def _time(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else "-"


def _grant_summary(g: pb.JobGrant) -> str:
    parts = [f"{s.switch}[{s.base_slot}:{s.base_slot + s.num_slots})" for s in g.switches if s.num_slots]
    return ", ".join(parts) or "-"


def render_jobs(jobs: pb.ListJobsResponse, out: TextIO) -> None:
    if not jobs.jobs:
        print("no jobs", file=out)
        return
    rows = [("ID", "NAME", "STATE", "BACKEND", "GEN", "WORKERS", "SLOTS", "PRIO", "HEARTBEAT", "REASON")]
    for j in jobs.jobs:
        g = j.grant
        rows.append((
            str(j.job_id), j.name or "-", j.state, g.backend, str(g.generation), str(len(j.request.workers)),
            _grant_summary(g), str(j.request.priority), _time(j.last_heartbeat), g.reason,
        ))
    _table(rows, out)


def _table(rows: list[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def render_job(j: pb.JobInfo, out: TextIO) -> None:
    g, r = j.grant, j.request
    print(f"job {j.job_id} {j.name!r}: {j.state}, backend {g.backend}, generation {g.generation}", file=out)
    print(f"  reason:      {g.reason}", file=out)
    print(f"  registered:  {_time(j.registered_at)}   last heartbeat: {_time(j.last_heartbeat)}", file=out)
    print(f"  request:     {r.tensor_elements} elements, priority {r.priority}, weight {r.weight or 1.0:g}, "
          f"slots {r.requested_slots or 'any'} (min {r.min_slots or 1})", file=out)
    print(f"  fixed point: scale {g.scale:g}, {g.lanes} lanes, INA port {g.ina_port}", file=out)
    tree = tree_of(g)
    if tree:
        root, tors = tree
        print(f"  tree:        root {root}, ToRs {', '.join(tors)}; {g.switches[0].num_slots} slots on each", file=out)
    for s in g.switches:
        slots = f"slots [{s.base_slot}, {s.base_slot + s.num_slots})" if s.num_slots else "no slots"
        addr = f" via {s.switch_ip} {s.switch_mac}" if s.switch_ip else ""
        role = "" if not tree else " tree root," if s.switch == tree[0] else " tree ToR,"
        floor = f", path RTT floor {s.path_rtt_floor * 1e3:.3f} ms" if s.path_rtt_floor > 0 else ""
        print(f"  switch {s.switch} (rack {s.rack}):{role} {slots}, multicast group {s.mcast_grp}, "
              f"workers {list(s.worker_ids)}{addr}{floor}", file=out)
    for w in r.workers:
        print(f"  worker {w.worker_id}: {w.host} {w.ip}:{w.udp_port} {w.mac}", file=out)


def tree_of(g: pb.JobGrant) -> tuple[str, tuple[str, ...]] | None:
    """A tree grant's (root, ToRs): the root is the switch without workers (listed last)."""
    if g.backend != Backend.TREE or not g.switches:
        return None
    return g.switches[-1].switch, tuple(s.switch for s in g.switches[:-1])


def render_memory(m: pb.MemoryMap, out: TextIO, jobs: pb.ListJobsResponse | None = None) -> None:
    """The pools; with ``jobs``, each range of a tree job says the switch's place in its tree."""
    roles: dict[tuple[str, int], str] = {}
    for j in (jobs.jobs if jobs is not None else ()):
        tree = tree_of(j.grant)
        if tree:
            roles[(tree[0], j.job_id)] = " (tree root)"
            roles.update({(t, j.job_id): f" (tree ToR under {tree[0]})" for t in tree[1]})
    for s in m.switches:
        print(f"{s.switch}: {s.used}/{s.pool_size} slots used, {s.free} free, largest free {s.largest_free}, "
              f"fragmentation {s.fragmentation:.2f}", file=out)
        for r in s.ranges:
            owner = "free" if r.free else f"job {r.job_id}{roles.get((s.switch, r.job_id), '')}"
            print(f"  [{r.base:4d}, {r.base + r.size:4d})  {r.size:5d}  {owner}", file=out)
        print("  " + _bar(s), file=out)


def _bar(s: pb.SwitchMemory, width: int = 64) -> str:
    if not s.pool_size:
        return "|(empty pool)|"
    cells = []
    for i in range(width):
        slot = i * s.pool_size // width
        owner = next((r for r in s.ranges if r.base <= slot < r.base + r.size), None)
        cells.append("." if owner is None or owner.free else "0123456789abcdefghijklmnopqrstuvwxyz"[owner.job_id % 36])
    return "|" + "".join(cells) + "|"


def render_stats(st: pb.StatsResponse, out: TextIO) -> None:
    rows = [("JOB", "SWITCH", "AGGREGATED", "DUPLICATES", "RESULTS", "DROPS")]
    for s in st.stats:
        drops = ", ".join(f"{k}={v}" for k, v in sorted(s.drops.items()) if v) or "-"
        rows.append((str(s.job_id), s.switch, str(s.aggregated), str(s.duplicates), str(s.results), drops))
    if len(rows) > 1:
        _table(rows, out)
    else:
        print("no jobs", file=out)
    drops = ", ".join(f"{k}={v}" for k, v in sorted(st.switch_drops.items()) if v)
    print(f"switch drops: {drops or 'none'}", file=out)


def render_policy(p: pb.PolicyInfo, out: TextIO) -> None:
    print(f"policy: {p.policy} (available: {', '.join(p.available)})", file=out)


# --- main -----------------------------------------------------------------------------------------------
def _describe_rpc_error(exc: grpc.RpcError, addr: str) -> tuple[str, int]:
    code = exc.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        detail = (exc.details() or "").splitlines()[0] if exc.details() else code.name
        if "failed to connect" in detail.lower() or "connection refused" in detail.lower() or code == grpc.StatusCode.DEADLINE_EXCEEDED:
            detail = "connection refused" if "refused" in detail.lower() else detail
        return f"cannot reach the controller at {addr}: {detail}", EXIT_UNREACHABLE
    return f"{code.name.lower().replace('_', ' ')}: {exc.details()}", EXIT_REFUSED


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"inactl: {exc} (see inactl --help)", file=err)
        return EXIT_USAGE
    addr = getattr(args, "controller", None) or os.environ.get(CONTROLLER_ENV) or DEFAULT_CONTROLLER
    timeout = getattr(args, "timeout", 5.0)
    as_json = getattr(args, "json", False)
    try:
        credential = _credential(args)
        env_tls = TlsFiles.from_env()
        tls = TlsFiles(getattr(args, "tls_ca", env_tls.ca), getattr(args, "tls_cert", env_tls.cert),
                       getattr(args, "tls_key", env_tls.key))
        channel = admission_channel(addr, credential, tls)
    except (OSError, ValueError) as exc:
        print(f"inactl: {exc}", file=err)
        return EXIT_USAGE
    stub = pb_grpc.AdmissionStub(channel)
    try:
        return _run(args, stub, timeout, as_json, out)
    except grpc.RpcError as exc:
        msg, code = _describe_rpc_error(exc, addr)
        print(f"inactl: {msg}", file=err)
        return code
    except KeyboardInterrupt:
        return 130
    finally:
        channel.close()


def _credential(args) -> str | None:
    """The credential from --credential-file, $INA_ADMIN_CREDENTIAL_FILE or the default file (None if that
    default is absent: the controller then answers UNAUTHENTICATED)."""
    path = getattr(args, "credential_file", None) or os.environ.get(ADMIN_CREDENTIAL_ENV)
    if path is None:
        if not os.path.exists(DEFAULT_CREDENTIAL_FILE):
            return None
        path = DEFAULT_CREDENTIAL_FILE
    try:
        return read_credential_file(path)
    except OSError as exc:
        raise OSError(f"cannot read the credential file: {exc.strerror}: {path}") from None


def _emit(msg, render: Callable, as_json: bool, out: TextIO) -> None:
    if as_json:
        print(json.dumps(_to_dict(msg), indent=2, sort_keys=True), file=out)
    else:
        render(msg, out)


def _run(args, stub: pb_grpc.AdmissionStub, timeout: float, as_json: bool, out: TextIO) -> int:
    cmd = args.command
    if cmd == "jobs":
        _emit(stub.ListJobs(pb.ListJobsRequest(), timeout=timeout), render_jobs, as_json, out)
    elif cmd == "job":
        _emit(stub.GetJob(pb.GetJobRequest(job_id=args.job_id), timeout=timeout), render_job, as_json, out)
    elif cmd == "memory":
        memory = stub.GetMemory(pb.GetMemoryRequest(), timeout=timeout)
        try:  # the jobs the caller may see, to name each tree's switches
            jobs = stub.ListJobs(pb.ListJobsRequest(), timeout=timeout)
        except grpc.RpcError:
            jobs = None
        _emit(memory, lambda m, o: render_memory(m, o, jobs), as_json, out)
    elif cmd == "stats":
        req = pb.GetStatsRequest(job_id=args.job_id, all=args.job_id == 0)
        _emit(stub.GetStats(req, timeout=timeout), render_stats, as_json, out)
    elif cmd == "policy":
        if args.policy_command == "show":
            _emit(stub.GetPolicy(pb.GetPolicyRequest(), timeout=timeout), render_policy, as_json, out)
        else:
            _emit(stub.SetPolicy(pb.SetPolicyRequest(policy=args.name), timeout=timeout), render_policy, as_json, out)
    elif cmd == "release":
        stub.ReleaseJob(pb.ReleaseJobRequest(job_id=args.job_id), timeout=timeout)
        print(f"job {args.job_id} released", file=out)
    elif cmd == "watch":
        _watch(args, stub, timeout, as_json, out)
    return 0


def _watch(args, stub: pb_grpc.AdmissionStub, timeout: float, as_json: bool, out: TextIO) -> None:
    n = 0
    tty = hasattr(out, "isatty") and out.isatty()
    while True:
        jobs = stub.ListJobs(pb.ListJobsRequest(), timeout=timeout)
        memory = stub.GetMemory(pb.GetMemoryRequest(), timeout=timeout)
        if as_json:
            print(json.dumps({"time": time.time(), "jobs": _to_dict(jobs)["jobs"], "memory": _to_dict(memory)["switches"]}, sort_keys=True), file=out)
        else:
            if tty:
                out.write("\x1b[H\x1b[2J")
            print(f"inactl watch  {datetime.now():%H:%M:%S}  (every {args.interval:g} s, Ctrl-C to stop)", file=out)
            render_jobs(jobs, out)
            print(file=out)
            render_memory(memory, out, jobs)
        out.flush()
        n += 1
        if args.count and n >= args.count:
            return
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
