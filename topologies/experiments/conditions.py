"""The machine's conditions over a measurement: how busy the cores were, and with whose work.

A calibration probe measures the software path of a machine that other work may share (2 cores; other tests and
runs). Two probes minutes apart can measure capacities 2x apart (docs/experiments.md, "Testbed vs simulator"); to
tell the probe's own conditions from the machine's, each probe and each trace run records
``conditions``: the load average, the cores busy over its wall time (/proc/stat), and the CPU of its own
processes (the switch's and the controller's process trees from /proc, the agents it reaped from
``RUSAGE_CHILDREN``, the runner itself), and the interrupt time no process is charged (``irq_cores``: mostly the
kernel's packet path, the veths and their htb shapers) and the time the hypervisor stole (``steal_cores``);
``others_cores`` is the rest: work on the machine that is not the measurement's.
"""
from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

__all__ = ["Conditions", "busy_jiffies", "tree_cpu_s"]

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK")


def busy_jiffies(stat_text: str) -> tuple[int, int, int, int]:
    """(busy, total, irq, steal) jiffies of every core from /proc/stat's ``cpu`` line: busy = total less idle and
    iowait; irq = hard and soft interrupt time (the kernel's packet path: veths, htb), which no process is charged;
    steal = time the hypervisor gave the virtual cores to other machines (busy for us, but nobody's work here)."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:]] + [0] * 8
            total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
            idle = fields[3] + fields[4]
            return total - idle, total, fields[5] + fields[6], fields[7]
    raise ValueError("no 'cpu' line in /proc/stat")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ...


def tree_cpu_s(roots: Iterable[int]) -> float:
    """User + system CPU seconds of the processes `roots` and their live descendants (their reaped children's
    too: cutime/cstime)."""
    children: dict[int, list[int]] = {}
    fields: dict[int, list[str]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            f = _stat_fields(int(entry.name))
            if f is not None:
                fields[int(entry.name)] = f
                children.setdefault(int(f[1]), []).append(int(entry.name))
    seen: set[int] = set()
    todo = [p for p in roots if p in fields]
    ticks = 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        f = fields[pid]
        ticks += sum(int(v) for v in f[11:15])  # utime stime cutime cstime (stat fields 14-17)
        todo.extend(children.get(pid, []))
    return ticks / _TICK


class Conditions:
    """Measures the machine's conditions between ``start()`` and ``stop()`` (or as a context manager).

    ``switch_pids`` / ``controller_pids``: the roots of the measurement's switch and controller process trees
    (their CPU is read from /proc at both ends, so they must outlive the measurement). The agents' CPU is what
    this process reaped from its children meanwhile (RUSAGE_CHILDREN): agents that exit within the measurement,
    less what ``prestarted_pids`` (agents started ahead of it, ``Testbed.prestart``) had used when it started.
    ``facts``: what the caller states about the measurement (link rate, window, jobs), stored as given."""

    def __init__(self, *, switch_pids: Iterable[int] = (), controller_pids: Iterable[int] = (),
                 prestarted_pids: Iterable[int] = (), **facts: Any) -> None:
        self.switch_pids = [p for p in switch_pids if p]
        self.controller_pids = [p for p in controller_pids if p]
        self.prestarted_pids = [p for p in prestarted_pids if p]
        self.facts = facts
        self.result: dict[str, Any] = {}

    def start(self) -> Conditions:
        self._t = time.monotonic()
        self._load = os.getloadavg()[0]
        self._cpu = busy_jiffies((PROC / "stat").read_text())
        self._switch = tree_cpu_s(self.switch_pids)
        self._controller = tree_cpu_s(self.controller_pids)
        self._children = _rusage_s(resource.RUSAGE_CHILDREN) + tree_cpu_s(self.prestarted_pids)
        self._self = _rusage_s(resource.RUSAGE_SELF)
        return self

    def stop(self) -> dict[str, Any]:
        wall = max(1e-9, time.monotonic() - self._t)
        busy, total, irq, steal = busy_jiffies((PROC / "stat").read_text())
        cores = os.cpu_count() or 1
        d_total = total - self._cpu[1]

        def share(now: int, before: int) -> float:
            return cores * (now - before) / d_total if d_total > 0 else 0.0

        machine, interrupts, stolen = share(busy, self._cpu[0]), share(irq, self._cpu[2]), share(steal, self._cpu[3])
        own = {"switch": tree_cpu_s(self.switch_pids) - self._switch,
               "controller": tree_cpu_s(self.controller_pids) - self._controller,
               "agents": _rusage_s(resource.RUSAGE_CHILDREN) - self._children,
               "runner": _rusage_s(resource.RUSAGE_SELF) - self._self}
        self.result = {
            **self.facts, "wall_s": round(wall, 3), "cores": cores,
            "loadavg_start": round(self._load, 2), "loadavg_end": round(os.getloadavg()[0], 2),
            "busy_cores": round(machine, 3),
            **{f"{name}_cores": round(cpu / wall, 3) for name, cpu in own.items()},
            "irq_cores": round(interrupts, 3), "steal_cores": round(stolen, 3),
            "others_cores": round(max(0.0, machine - interrupts - stolen - sum(own.values()) / wall), 3),
        }
        return self.result

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _rusage_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
