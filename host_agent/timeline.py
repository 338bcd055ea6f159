"""A worker's life on the wall clock: when its process started, when its agent joined, its calls, its close.

Experiment 3 splits each job's completion time into these phases (docs/experiments.md, "Experiment 3"):
``Timeline.as_dict()`` gives Unix seconds, which the testbed turns into seconds after its trace started.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

__all__ = ["Timeline", "process_start_unix"]


def process_start_unix() -> float | None:
    """When this process started (Unix seconds), from /proc; None where /proc does not say."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        start_since_boot = int(fields[19]) / ticks  # field 22 (starttime); fields[0] is field 3
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + start_since_boot


@dataclass
class Timeline:
    """Wall-clock marks of one worker (Unix seconds): ``process`` start, ``main`` (imports done), ``opened``
    (joined its job, first grant in hand), each call's start and end, ``closed`` (closing barrier and release)."""

    process: float | None = field(default_factory=process_start_unix)
    main: float = field(default_factory=time.time)
    opened: float | None = None
    calls: list[tuple[float, float]] = field(default_factory=list)
    closed: float | None = None

    def mark_opened(self) -> None:
        self.opened = time.time()

    def mark_call(self, start: float) -> None:
        self.calls.append((start, time.time()))

    def mark_closed(self) -> None:
        self.closed = time.time()

    def as_dict(self) -> dict[str, float | None]:
        """The marks that name phases: ``first_call`` is the first call's start, ``last_call`` the last one's end."""
        return {"process": self.process, "main": self.main, "opened": self.opened,
                "first_call": self.calls[0][0] if self.calls else None,
                "first_call_end": self.calls[0][1] if self.calls else None,
                "last_call": self.calls[-1][1] if self.calls else None, "closed": self.closed}
