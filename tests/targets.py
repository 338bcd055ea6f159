"""Targets for the packet-level suite: frames in at a port, frames out at ports, control by P4Info names.

The same tests run against the in-process model (``model``), the ``ina-switch`` process and BMv2
(tests/packet/conftest.py); a target only has to offer the few methods of ``Target``. Frames for it are in
tests/support/frames.py, a job's entries in tests/support/entries.py.
"""
from __future__ import annotations

from typing import Protocol

from p4src.ina_model import InaPipeline


class Target(Protocol):
    def insert_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None: ...
    def modify_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None: ...
    def set_multicast_group(self, group: int, replicas: list[tuple[int, int]]) -> None: ...
    def read_counter(self, name: str, index: int) -> int: ...
    def send(self, port: int, frame: bytes) -> None: ...
    def receive(self, expect: int | None = None, timeout: float = 2.0) -> list[tuple[int, bytes]]: ...
    def close(self) -> None: ...


class ModelTarget:
    """The executable model in this process: outputs are available as soon as send() returns."""

    ports = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

    def __init__(self) -> None:
        self.pipeline = InaPipeline()
        self._pending: list[tuple[int, bytes]] = []

    def insert_entry(self, table, match, action, params=()):
        self.pipeline.insert_entry(table, match, action, params)

    def modify_entry(self, table, match, action, params=()):
        self.pipeline.modify_entry(table, match, action, params)

    def set_multicast_group(self, group, replicas):
        self.pipeline.set_multicast_group(group, replicas)

    def read_counter(self, name, index):
        return self.pipeline.counter(name)[index]

    def send(self, port, frame):
        self._pending += self.pipeline.process(port, frame)

    def receive(self, expect=None, timeout=2.0):
        out, self._pending = self._pending, []
        return out

    def register_snapshot(self):
        return self.pipeline.register_snapshot()

    def close(self):
        pass


def register_state(target: Target):
    """The target's registers, where it can show them (the model can; BMv2 through P4Runtime is not read here)."""
    snap = getattr(target, "register_snapshot", None)
    return snap() if snap else None


def assert_same_registers(before, after) -> None:
    """Malformed, foreign and query frames must leave every register as it was."""
    if before is None:
        return
    *scalars_before, lanes_before = before
    *scalars_after, lanes_after = after
    assert scalars_before == scalars_after
    assert (lanes_before == lanes_after).all()

