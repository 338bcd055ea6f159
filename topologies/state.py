"""Run-state files: every process, network namespace and interface a testbed process made, for cleanup.

Each Python process that builds a testbed (a test, ``ina-exp``, ``mn --custom``) owns one JSON file,
``/tmp/ina-testbed/state/run-<pid>.json`` (``INA_TESTBED_STATE`` overrides the folder). Switch and host
nodes add themselves as they start and remove themselves as they stop; an empty file is deleted. After a
crash the file stays, and ``python -m topologies.cleanup`` (``make stop``) uses it to remove exactly what
was made, never anything found by name alone:

- a process is identified by PID *and* its start time (``/proc/<pid>/stat`` field 22), so a reused PID is
  never signalled;
- a host's network namespace is identified by its inode; every process still inside it is ended, which
  destroys the namespace and the veth ends in it;
- switch-port interfaces (root namespace) are recorded by name.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "RUNS_DIR",
    "STATE_DIR",
    "ProcessRecord",
    "RunState",
    "current_state",
    "end_process",
    "end_processes",
    "netns_inode",
    "pids_in_netns",
    "process_alive",
    "process_start_time",
]

BASE_DIR = Path(os.environ.get("INA_TESTBED_DIR", "/tmp/ina-testbed"))
STATE_DIR = Path(os.environ.get("INA_TESTBED_STATE", str(BASE_DIR / "state")))
RUNS_DIR = BASE_DIR / "runs"


def process_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (None when there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished: nothing to end
        return None
    return int(fields[19])


def process_alive(pid: int, start_time: int | None) -> bool:
    """True if ``pid`` runs and is the process that was recorded (same start time)."""
    now = process_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


def netns_inode(pid: int | str = "self") -> int | None:
    """Inode of the network namespace of a process."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def pids_in_netns(inode: int) -> list[int]:
    """PIDs of every process inside the network namespace ``inode``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "net").st_ino == inode:
                    pids.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return pids


def _protected_pids() -> set[int]:
    """This process and its ancestors: cleanup never signals them."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (FileNotFoundError, ValueError, IndexError):
            break
    pids.add(1)
    return pids


def end_processes(records: Iterable[tuple[int, int | None]], *, group: bool = False, timeout: float = 3.0) -> list[int]:
    """SIGTERM every recorded ``(pid, start_time)`` still alive, wait, SIGKILL the rest. Returns those signalled.

    ``group``: signal the process group too (processes started in a session of their own).
    """
    protected = _protected_pids()
    targets = [(pid, st) for pid, st in records if pid not in protected and process_alive(pid, st)]

    def send(sig: int) -> None:
        for pid, st in targets:
            if not process_alive(pid, st):
                continue
            try:
                if group and os.getpgid(pid) == pid and pid not in protected:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(process_alive(p, s) for p, s in targets):
        time.sleep(0.02)
    if any(process_alive(p, s) for p, s in targets):
        send(signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(process_alive(p, s) for p, s in targets):
            time.sleep(0.02)
    return [pid for pid, _ in targets]


def end_process(pid: int, start_time: int | None, *, group: bool = False, timeout: float = 3.0) -> bool:
    """End one recorded process (SIGTERM, then SIGKILL). True if it had to be signalled."""
    return bool(end_processes([(pid, start_time)], group=group, timeout=timeout))


def end_netns(inode: int, *, timeout: float = 3.0) -> list[int]:
    """End every process inside the network namespace ``inode`` (never the root one or our own)."""
    if inode in (netns_inode(1), netns_inode("self")):
        raise ValueError("refusing to end processes of the root (or this process's) network namespace")
    records = [(pid, process_start_time(pid)) for pid in pids_in_netns(inode)]
    return end_processes(records, timeout=timeout)


@dataclass
class ProcessRecord:
    """A process this run started: ``role`` is ``switch``, ``host-shell`` or ``switch-shell``."""

    pid: int
    start_time: int | None
    role: str
    name: str
    netns: int | None = None  # for hosts: the inode of their network namespace
    group: bool = False  # started in a session of its own: signal the group
    log: str | None = None


@dataclass
class RunState:
    """What one testbed process made. Saved (atomically) after every change."""

    path: Path
    owner_pid: int
    owner_start: int | None
    run_dir: str | None = None
    processes: list[ProcessRecord] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)

    _lock = threading.RLock()

    # --- recording -----------------------------------------------------------------------------------
    def add_process(self, record: ProcessRecord) -> None:
        with self._lock:
            self.processes = [p for p in self.processes if p.pid != record.pid] + [record]
            self.save()

    def remove_process(self, pid: int) -> None:
        with self._lock:
            self.processes = [p for p in self.processes if p.pid != pid]
            self.save()

    def add_interfaces(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                if name not in self.interfaces:
                    self.interfaces.append(name)
            self.save()

    def remove_interfaces(self, names: Iterable[str]) -> None:
        with self._lock:
            gone = set(names)
            self.interfaces = [n for n in self.interfaces if n not in gone]
            self.save()

    def set_run_dir(self, run_dir: str | Path) -> None:
        with self._lock:
            self.run_dir = str(run_dir)
            self.save()

    def snapshot(self) -> tuple[list[ProcessRecord], list[str]]:
        """Copies of the process records and interface names."""
        with self._lock:
            return list(self.processes), list(self.interfaces)

    def prune(self, present_interfaces: set[str]) -> None:
        """Forget processes that are gone and interfaces that no longer exist."""
        with self._lock:
            self.processes = [p for p in self.processes if process_alive(p.pid, p.start_time)]
            self.interfaces = [n for n in self.interfaces if n in present_interfaces]
            self.save()

    @property
    def empty(self) -> bool:
        return not self.processes and not self.interfaces

    # --- persistence ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "owner_pid": self.owner_pid,
            "owner_start": self.owner_start,
            "run_dir": self.run_dir,
            "created": self.created,
            "processes": [asdict(p) for p in self.processes],
            "interfaces": list(self.interfaces),
        }

    def save(self) -> None:
        with self._lock:
            if self.empty:
                self.path.unlink(missing_ok=True)
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
            os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: str | Path) -> RunState:
        path = Path(path)
        doc = json.loads(path.read_text())
        return cls(
            path=path,
            owner_pid=int(doc["owner_pid"]),
            owner_start=doc.get("owner_start"),
            run_dir=doc.get("run_dir"),
            processes=[ProcessRecord(**p) for p in doc.get("processes", [])],
            interfaces=list(doc.get("interfaces", [])),
            created=doc.get("created", 0.0),
        )

    @property
    def owner_alive(self) -> bool:
        return process_alive(self.owner_pid, self.owner_start)


_current: RunState | None = None
_current_lock = threading.Lock()


def current_state() -> RunState:
    """This process's run state (created on first use; a stale file of a previous owner of our PID is kept
    aside as ``.stale`` so that cleanup still sees it)."""
    global _current
    with _current_lock:
        pid = os.getpid()
        if _current is None or _current.owner_pid != pid:
            path = STATE_DIR / f"run-{pid}.json"
            if path.exists():
                path.rename(path.with_name(f"run-{pid}-{int(time.time() * 1000)}.stale.json"))
            _current = RunState(path=path, owner_pid=pid, owner_start=process_start_time(pid))
        return _current


def state_files(state_dir: Path | None = None) -> Iterator[Path]:
    """Every run-state file (``run-*.json``) in the state folder."""
    folder = state_dir or STATE_DIR
    if folder.is_dir():
        yield from sorted(folder.glob("run-*.json"))
