"""Remove every process, namespace and interface the testbed made, also after a crash (``make stop``).

    python -m topologies.cleanup [--dead-only] [--no-sweep] [-n]

From each run-state file (``topologies.state``): the run's owner process if it still runs (SIGTERM, then
SIGKILL; never this process or its ancestors), the switch processes (with their process groups), every
process inside the hosts' network namespaces (which destroys the namespaces and their veth ends), the
Mininet shells, and the recorded switch-port interfaces. Processes are matched by PID *and* start time,
so a reused PID is never signalled; nothing is killed by name.

Then, like ``mn -c`` but restricted to this project's names, a sweep deletes root-namespace interfaces
named ``ina-<switch>-p<port>`` left by a run whose state file is gone. ``mn -c`` itself is not run: it
kills processes by name (every ``mnexec``, controllers, Open vSwitch) that this project did not start.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from topologies import state as run_state
from topologies.plan import INTF_PREFIX

__all__ = ["CleanupReport", "cleanup_all", "cleanup_state", "main", "remove", "root_interfaces", "sweep_interfaces"]


@dataclass
class CleanupReport:
    """What a cleanup removed (or, with ``dry_run``, would remove)."""

    processes: list[int] = field(default_factory=list)
    namespaces: list[int] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    state_files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def merge(self, other: CleanupReport) -> None:
        for name in ("processes", "namespaces", "interfaces", "state_files", "skipped"):
            getattr(self, name).extend(getattr(other, name))

    def summary(self) -> str:
        parts = [
            f"{len(self.processes)} processes", f"{len(self.namespaces)} namespaces",
            f"{len(self.interfaces)} interfaces", f"{len(self.state_files)} run-state files",
        ]
        text = "removed " + ", ".join(parts)
        if self.skipped:
            text += "; skipped: " + "; ".join(self.skipped)
        return text


def root_interfaces() -> list[str]:
    """Interface names in this process's (the root) network namespace."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    names = []
    for line in out.splitlines():
        m = re.match(r"\d+:\s+([^:@\s]+)", line)
        if m:
            names.append(m.group(1))
    return names


def _delete_interface(name: str) -> bool:
    return subprocess.run(["ip", "link", "del", "dev", name], capture_output=True, check=False).returncode == 0


def _is_own(state: run_state.RunState) -> bool:
    """Whether this process made the run (same PID *and* start time: not a previous owner of our PID)."""
    pid = os.getpid()
    return state.owner_pid == pid and state.owner_start == run_state.process_start_time(pid)


def remove(records: list[run_state.ProcessRecord], interfaces: list[str], *, dry_run: bool = False) -> CleanupReport:
    """End recorded processes (switches with their groups, everything inside recorded host namespaces,
    Mininet shells) and delete recorded root-namespace interfaces."""
    report = CleanupReport()
    switches = [(p.pid, p.start_time) for p in records if p.role == "switch" and run_state.process_alive(p.pid, p.start_time)]
    if switches:
        if not dry_run:
            run_state.end_processes(switches, group=True)
        report.processes += [pid for pid, _ in switches]
    protected_ns = (run_state.netns_inode(1), run_state.netns_inode("self"))
    for rec in records:
        if rec.netns and rec.netns not in protected_ns:
            inside = run_state.pids_in_netns(rec.netns)
            if inside:
                report.namespaces.append(rec.netns)
                report.processes += run_state.end_netns(rec.netns) if not dry_run else inside
    shells = [(p.pid, p.start_time) for p in records if p.role != "switch" and run_state.process_alive(p.pid, p.start_time)]
    if shells:
        if not dry_run:
            run_state.end_processes(shells, timeout=2.0)
        report.processes += [pid for pid, _ in shells]
    present = set(root_interfaces())
    for name in interfaces:
        if name in present and (dry_run or _delete_interface(name)):
            report.interfaces.append(name)
    report.processes = sorted(set(report.processes))
    return report


def cleanup_state(state: run_state.RunState, *, stop_owner: bool = True, dry_run: bool = False) -> CleanupReport:
    """Remove what one run-state file records, then the file. A run whose owner still runs is stopped
    first (SIGTERM, then SIGKILL) when ``stop_owner``, else skipped; this process is never signalled."""
    report = CleanupReport()
    own = _is_own(state)
    if not own and state.owner_alive:
        if not stop_owner:
            report.skipped.append(f"run of live process {state.owner_pid} ({state.path.name})")
            return report
        if not dry_run:
            run_state.end_process(state.owner_pid, state.owner_start, timeout=5.0)
        report.processes.append(state.owner_pid)
    report.merge(remove(list(state.processes), list(state.interfaces), dry_run=dry_run))
    if not dry_run:
        state.prune(set(root_interfaces()))
        if own and not state.empty:
            state.save()
        else:
            state.path.unlink(missing_ok=True)
            report.state_files.append(str(state.path))
    return report


def sweep_interfaces(prefix: str = INTF_PREFIX, *, keep: set[str] = frozenset(), dry_run: bool = False) -> list[str]:
    """Delete root-namespace interfaces named like this project's switch ports (``ina-s1-p2``), but not
    those in ``keep`` (ports of runs that still run)."""
    pattern = re.compile(rf"^{re.escape(prefix)}-[A-Za-z0-9_]+-p\d+$")
    removed = []
    for name in root_interfaces():
        if name not in keep and pattern.match(name) and (dry_run or _delete_interface(name)):
            removed.append(name)
    return removed


def cleanup_all(*, stop_live: bool = True, sweep: bool = True, dry_run: bool = False,
                state_dir: Path | None = None) -> CleanupReport:
    """Clean up every recorded run (``stop_live``: also runs whose owner still runs), then sweep."""
    report = CleanupReport()
    keep: set[str] = set(run_state.current_state().snapshot()[1])  # this process's own live networks
    for path in run_state.state_files(state_dir):
        try:
            state = run_state.RunState.load(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            report.skipped.append(f"unreadable {path.name}: {exc}")
            continue
        if _is_own(state):
            continue  # this process's own networks are stopped by their InaNetwork.stop()
        part = cleanup_state(state, stop_owner=stop_live, dry_run=dry_run)
        if part.skipped:  # a live run left alone: so are its ports
            keep.update(state.interfaces)
        report.merge(part)
    if sweep:
        report.interfaces += sweep_interfaces(keep=keep, dry_run=dry_run)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topologies.cleanup", description=__doc__.splitlines()[0])
    parser.add_argument("--dead-only", action="store_true", help="leave runs whose owner process still runs alone")
    parser.add_argument("--no-sweep", action="store_true", help="only what run-state files record")
    parser.add_argument("-n", "--dry-run", action="store_true", help="say what would be removed, remove nothing")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = cleanup_all(stop_live=not args.dead_only, sweep=not args.no_sweep, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report.__dict__, indent=2))
    else:
        print(("would have " if args.dry_run else "") + report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
