"""The P4Info as ina-switch's P4Runtime service sees it: name <-> id <-> width of every control-plane object.

Built from the committed P4Info and checked against the pipeline model (``p4src.ina_model``) at start-up,
so a request's ids map to the model's tables, actions and counters. Also the bytestring rules of P4Runtime
(values of any length that fit their width in; canonical, shortest bytestrings out) and the controller
headers (``packet_in`` / ``packet_out``) packed and unpacked by their fields.
"""
from __future__ import annotations

from dataclasses import dataclass

from p4.config.v1 import p4info_pb2

from p4src import tables as model
from softswitch.p4failure import Code, fail

__all__ = ["ActionInfo", "Field", "P4Schema", "TableInfo", "canonical", "pack_header", "to_int", "unpack_header"]

_MATCH_KINDS = {p4info_pb2.MatchField.EXACT: "exact", p4info_pb2.MatchField.LPM: "lpm"}


@dataclass(frozen=True)
class Field:
    id: int
    name: str
    bitwidth: int
    kind: str  # "exact" | "lpm" (match fields); "" (parameters, metadata)


@dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    fields: tuple[Field, ...]
    action_ids: frozenset[int]
    default_action: str


@dataclass(frozen=True)
class ActionInfo:
    id: int
    name: str
    params: tuple[Field, ...]


class P4Schema:
    """Name <-> id <-> width of every control-plane object, from the committed P4Info, checked against the model."""

    def __init__(self, info: p4info_pb2.P4Info):
        self.actions = {
            a.preamble.id: ActionInfo(
                a.preamble.id, a.preamble.name, tuple(Field(p.id, p.name, p.bitwidth, "") for p in a.params))
            for a in info.actions
        }
        self.action_ids = {a.name: a.id for a in self.actions.values()}
        self.tables: dict[int, TableInfo] = {}
        for t in info.tables:
            spec = model.TABLES.get(t.preamble.name)
            if spec is None:
                raise ValueError(f"P4Info table {t.preamble.name} is not in the switch model")
            fields = tuple(Field(m.id, m.name, m.bitwidth, _MATCH_KINDS.get(m.match_type, "?")) for m in t.match_fields)
            if tuple((f.name, f.bitwidth, f.kind) for f in fields) != spec.keys:
                raise ValueError(f"P4Info table {t.preamble.name} does not match the switch model")
            self.tables[t.preamble.id] = TableInfo(
                t.preamble.id, t.preamble.name, fields, frozenset(r.id for r in t.action_refs), spec.default_action)
        self.table_ids = {t.name: t.id for t in self.tables.values()}
        self.counters = {c.preamble.id: (c.preamble.name, c.size) for c in info.counters}
        self.counter_ids = {name: cid for cid, (name, _) in self.counters.items()}
        headers = {h.preamble.name: tuple(Field(m.id, m.name, m.bitwidth, "") for m in h.metadata)
                   for h in info.controller_packet_metadata}
        self.packet_in = headers.get("packet_in", ())
        self.packet_out = headers.get("packet_out", ())
        for name in model.COUNTERS:
            if name not in self.counter_ids:
                raise ValueError(f"P4Info has no counter {name}")


# --- bytestrings ---------------------------------------------------------------------------------------------


def to_int(value: bytes, bitwidth: int, what: str) -> int:
    """A P4Runtime bytestring as an int: any length (minimal or zero-padded) whose value fits ``bitwidth`` bits."""
    v = int.from_bytes(value, "big")
    if v >> bitwidth:
        raise fail(Code.INVALID_ARGUMENT, f"{what}: value 0x{value.hex()} does not fit within {bitwidth} bits")
    return v


def canonical(v: int) -> bytes:
    """The canonical (shortest, at least one byte) bytestring of a non-negative int, as PI returns in reads."""
    return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")


def pack_header(fields: tuple[Field, ...], values: dict[int, int]) -> bytes:
    """A controller header (fields MSB first) as bytes."""
    total, acc = 0, 0
    for f in fields:
        acc = (acc << f.bitwidth) | values.get(f.id, 0)
        total += f.bitwidth
    return acc.to_bytes((total + 7) // 8, "big")


def unpack_header(fields: tuple[Field, ...], frame: bytes) -> tuple[dict[int, int], bytes] | None:
    total = sum(f.bitwidth for f in fields)
    n = (total + 7) // 8
    if len(frame) < n:
        return None
    acc = int.from_bytes(frame[:n], "big") >> (n * 8 - total)
    values = {}
    for f in reversed(fields):
        values[f.id] = acc & ((1 << f.bitwidth) - 1)
        acc >>= f.bitwidth
    return values, frame[n:]


