"""P4Runtime entities as plain values (table entries, multicast groups) and their protobuf codecs.

Classes mirror P4Runtime's own messages (``TableEntry``, ``MulticastGroupEntry``) but hold Python ints
and P4Info *names*, so that entries can be compared, hashed, stored and diffed. The names <-> ids map is
p4runtime-shell's ``Context`` (one instance per :class:`Schema`, never its process-global one), and byte
strings are encoded the way p4runtime-shell encodes them (canonical, leading zero bytes stripped).

Match values are tuples in P4Info match-field order, the same shape as ``p4src.ina_model``'s:
exact ``v``, LPM ``(v, prefix_len)``, ternary ``(v, mask)``. Action parameters are ints in P4Info order.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh.bytes_utils import parse_value, to_canonical_bytes
from p4runtime_sh.context import Context, P4Type

from controller.errors import ControllerError
from p4src.p4info import load_p4info

__all__ = ["MulticastGroup", "Schema", "SchemaError", "TableEntry", "encode_value", "format_value"]

_EXACT = p4info_pb2.MatchField.EXACT
_LPM = p4info_pb2.MatchField.LPM
_TERNARY = p4info_pb2.MatchField.TERNARY
_OPTIONAL = p4info_pb2.MatchField.OPTIONAL


class SchemaError(ControllerError, ValueError):
    """A name the P4Info does not have, or a value that does not fit its field."""


@dataclass(frozen=True)
class TableEntry:
    """One entry of a match-action table (P4Runtime ``TableEntry``), by P4Info names.

    ``is_default`` marks the table's default action (then ``match`` is empty).
    """

    table: str
    match: tuple
    action: str
    params: tuple[int, ...] = ()
    priority: int = 0
    is_default: bool = False

    @property
    def key(self) -> tuple:
        """What identifies the entry in its table."""
        return (self.table, self.match, self.priority, self.is_default)


@dataclass(frozen=True)
class MulticastGroup:
    """A multicast group of the packet replication engine: replicas are (egress port, instance)."""

    group_id: int
    replicas: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(sorted((int(p), int(i)) for p, i in self.replicas)))


def encode_value(value: int, bitwidth: int) -> bytes:
    """P4Runtime's canonical bytestring of ``value`` (SchemaError if it does not fit ``bitwidth`` bits)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << bitwidth):
        raise SchemaError(f"value {value!r} does not fit in {bitwidth} bits")
    return to_canonical_bytes(value.to_bytes((bitwidth + 7) // 8, "big"))


def _decode(data: bytes) -> int:
    return int.from_bytes(data, "big")


def parse_json_value(value: object, bitwidth: int, what: str) -> int:
    """A value as p4lang/tutorials' runtime JSON writes it: an int, "10.0.1.1", "08:00:00:00:01:11", "0x1f"."""
    if isinstance(value, bool):
        raise SchemaError(f"{what}: {value!r} is not a number or address")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return _decode(parse_value(value, bitwidth))
        except Exception as exc:  # p4runtime-shell's UserError subclasses  # noqa: BLE001
            raise SchemaError(f"{what}: {exc}") from None
    raise SchemaError(f"{what}: {value!r} is not a number or address")


def format_value(value: int, bitwidth: int, name: str) -> int | str:
    """The inverse for writing runtime JSON: MACs and IPv4 addresses as strings, everything else as int."""
    lname = name.lower().rsplit(".", 1)[-1]
    if bitwidth == 48:
        return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))
    if bitwidth == 32 and (lname.endswith("addr") or lname in ("ip", "ipv4", "dst_ip", "src_ip")):
        return str(ipaddress.IPv4Address(value))
    return value


class Schema:
    """The P4Info of one pipeline: names <-> ids, and entity <-> protobuf conversion."""

    def __init__(self, p4info: p4info_pb2.P4Info) -> None:
        self.p4info = p4info
        self._ctx = Context()
        self._ctx.set_p4info(p4info)
        self._tables = {name: t for name, t in self._ctx.get_objs(P4Type.table)}
        self._actions = {name: a for name, a in self._ctx.get_objs(P4Type.action)}
        self._counters = {name: c for name, c in self._ctx.get_objs(P4Type.counter)}
        self._packet_headers = {h.preamble.name: h for h in p4info.controller_packet_metadata}

    @classmethod
    def from_file(cls, path: str | Path) -> Schema:
        return cls(load_p4info(path))

    # --- lookups ------------------------------------------------------------------------------------
    def table(self, name: str) -> p4info_pb2.Table:
        t = self._tables.get(name) or self._ctx.get_table(name)
        if t is None:
            raise SchemaError(f"the P4Info has no table {name!r}")
        return t

    def action(self, name: str) -> p4info_pb2.Action:
        a = self._actions.get(name) or self._ctx.get_action(name)
        if a is None:
            raise SchemaError(f"the P4Info has no action {name!r}")
        return a

    def counter(self, name: str) -> p4info_pb2.Counter:
        c = self._counters.get(name) or self._ctx.get_counter(name)
        if c is None:
            raise SchemaError(f"the P4Info has no counter {name!r}")
        return c

    def packet_metadata(self, header: str) -> list[p4info_pb2.ControllerPacketMetadata.Metadata]:
        """The fields of controller header ``packet_in`` or ``packet_out``, in P4Info order (none if absent)."""
        h = self._packet_headers.get(header)
        return list(h.metadata) if h is not None else []

    # --- table entries ------------------------------------------------------------------------------
    def entry(self, table: str, match: dict | tuple, action: str, params: dict | tuple = (), *, priority: int = 0) -> TableEntry:
        """Build a TableEntry, accepting match fields and params by name (dict) or in P4Info order."""
        t = self.table(table)
        a = self.action(action)
        if isinstance(match, dict):
            names = [mf.name for mf in t.match_fields]
            unknown = set(match) - set(names)
            if unknown:
                raise SchemaError(f"{table}: no match field {min(unknown)!r}")
            match = tuple(match.get(n) for n in names)
        if isinstance(params, dict):
            names = [p.name for p in a.params]
            unknown = set(params) - set(names)
            missing = set(names) - set(params)
            if unknown or missing:
                raise SchemaError(f"{action}: parameters {sorted(names)} expected, got {sorted(params)}")
            params = tuple(params[n] for n in names)
        e = TableEntry(t.preamble.name, tuple(match), a.preamble.name, tuple(params), priority)
        self.to_proto(e)  # validates
        return e

    def to_proto(self, e: TableEntry) -> p4runtime_pb2.TableEntry:
        t = self.table(e.table)
        msg = p4runtime_pb2.TableEntry(table_id=t.preamble.id, priority=e.priority, is_default_action=e.is_default)
        if not e.is_default:
            if len(e.match) != len(t.match_fields):
                raise SchemaError(f"{e.table}: expected {len(t.match_fields)} match fields, got {len(e.match)}")
            for mf, value in zip(t.match_fields, e.match):
                if value is None:
                    if mf.match_type == _EXACT:
                        raise SchemaError(f"{e.table}: exact field {mf.name} needs a value")
                    continue  # don't care: omitted
                fm = p4runtime_pb2.FieldMatch(field_id=mf.id)
                if mf.match_type == _EXACT:
                    fm.exact.value = encode_value(value, mf.bitwidth)
                elif mf.match_type == _LPM:
                    v, plen = value
                    if not 0 <= plen <= mf.bitwidth:
                        raise SchemaError(f"{e.table}: prefix length {plen} of {mf.name} out of range")
                    if plen == 0:
                        continue  # P4Runtime: a /0 LPM match is omitted
                    if v & ((1 << (mf.bitwidth - plen)) - 1):
                        raise SchemaError(f"{e.table}: {mf.name} has bits set beyond /{plen}")
                    fm.lpm.value = encode_value(v, mf.bitwidth)
                    fm.lpm.prefix_len = plen
                elif mf.match_type == _TERNARY:
                    v, mask = value
                    fm.ternary.value = encode_value(v & mask, mf.bitwidth)
                    fm.ternary.mask = encode_value(mask, mf.bitwidth)
                elif mf.match_type == _OPTIONAL:
                    fm.optional.value = encode_value(value, mf.bitwidth)
                else:
                    raise SchemaError(f"{e.table}: match kind of {mf.name} is not supported")
                msg.match.append(fm)
        a = self.action(e.action)
        if a.preamble.id not in {ref.id for ref in t.action_refs}:
            raise SchemaError(f"{e.table}: action {e.action} is not one of its actions")
        if len(e.params) != len(a.params):
            raise SchemaError(f"{e.action}: expected {len(a.params)} parameters, got {len(e.params)}")
        msg.action.action.action_id = a.preamble.id
        for p, value in zip(a.params, e.params):
            try:
                enc = encode_value(value, p.bitwidth)
            except SchemaError as exc:
                raise SchemaError(f"{e.action}: parameter {p.name}: {exc}") from None
            msg.action.action.params.add(param_id=p.id, value=enc)
        return msg

    def from_proto(self, msg: p4runtime_pb2.TableEntry) -> TableEntry:
        t = self._ctx.get_obj_by_id(msg.table_id)
        by_id = {fm.field_id: fm for fm in msg.match}
        match = []
        if not msg.is_default_action:
            for mf in t.match_fields:
                fm = by_id.get(mf.id)
                if mf.match_type == _LPM:
                    match.append((_decode(fm.lpm.value), fm.lpm.prefix_len) if fm else (0, 0))
                elif mf.match_type == _TERNARY:
                    match.append((_decode(fm.ternary.value), _decode(fm.ternary.mask)) if fm else (0, 0))
                elif mf.match_type == _OPTIONAL:
                    match.append(_decode(fm.optional.value) if fm else None)
                else:
                    match.append(_decode(fm.exact.value) if fm else 0)
        act = msg.action.action
        a = self._ctx.get_obj_by_id(act.action_id)
        values = {p.param_id: _decode(p.value) for p in act.params}
        params = tuple(values.get(p.id, 0) for p in a.params)
        return TableEntry(t.preamble.name, tuple(match), a.preamble.name, params, msg.priority, msg.is_default_action)

    def entry_from_json(self, doc: dict) -> TableEntry:
        """One ``table_entries`` item of a p4lang/tutorials ``sX-runtime.json``."""
        try:
            table = self.table(doc["table"])
            action = self.action(doc["action_name"])
        except KeyError as exc:
            raise SchemaError(f"runtime entry {doc!r} lacks {exc}") from None
        pvals = doc.get("action_params", {}) or {}
        params = []
        for p in action.params:
            if p.name not in pvals:
                raise SchemaError(f"{action.preamble.name}: parameter {p.name} missing in {doc!r}")
            params.append(parse_json_value(pvals[p.name], p.bitwidth, f"{action.preamble.name}.{p.name}"))
        extra = set(pvals) - {p.name for p in action.params}
        if extra:
            raise SchemaError(f"{action.preamble.name}: no parameter {min(extra)!r}")
        if doc.get("default_action"):
            e = TableEntry(table.preamble.name, (), action.preamble.name, tuple(params), 0, True)
            self.to_proto(e)
            return e
        mvals = doc.get("match", {}) or {}
        match = []
        for mf in table.match_fields:
            what = f"{table.preamble.name}.{mf.name}"
            v = mvals.get(mf.name)
            if v is None:
                if mf.match_type == _EXACT:
                    raise SchemaError(f"{what}: exact match value missing in {doc!r}")
                match.append((0, 0) if mf.match_type in (_LPM, _TERNARY) else None)
            elif mf.match_type in (_LPM, _TERNARY):
                if not isinstance(v, list) or len(v) != 2:
                    raise SchemaError(f"{what}: expected [value, prefix_len or mask], got {v!r}")
                second = v[1] if mf.match_type == _LPM else parse_json_value(v[1], mf.bitwidth, what)
                match.append((parse_json_value(v[0], mf.bitwidth, what), int(second)))
            else:
                match.append(parse_json_value(v, mf.bitwidth, what))
        unknown = set(mvals) - {mf.name for mf in table.match_fields}
        if unknown:
            raise SchemaError(f"{table.preamble.name}: no match field {min(unknown)!r}")
        e = TableEntry(table.preamble.name, tuple(match), action.preamble.name, tuple(params), int(doc.get("priority", 0)))
        self.to_proto(e)
        return e

    def entry_to_json(self, e: TableEntry) -> dict:
        t = self.table(e.table)
        a = self.action(e.action)
        doc: dict = {"table": e.table}
        if e.is_default:
            doc["default_action"] = True
        else:
            match = {}
            for mf, v in zip(t.match_fields, e.match):
                if v is None:
                    continue
                if mf.match_type == _LPM:
                    if v[1] == 0:
                        continue
                    match[mf.name] = [format_value(v[0], mf.bitwidth, mf.name), v[1]]
                elif mf.match_type == _TERNARY:
                    match[mf.name] = [format_value(v[0], mf.bitwidth, mf.name), v[1]]
                else:
                    match[mf.name] = format_value(v, mf.bitwidth, mf.name)
            doc["match"] = match
            if e.priority:
                doc["priority"] = e.priority
        doc["action_name"] = e.action
        doc["action_params"] = {p.name: format_value(v, p.bitwidth, p.name) for p, v in zip(a.params, e.params)}
        return doc

    # --- multicast groups ---------------------------------------------------------------------------
    @staticmethod
    def group_to_proto(g: MulticastGroup) -> p4runtime_pb2.PacketReplicationEngineEntry:
        if not 0 < g.group_id < (1 << 16):
            raise SchemaError(f"multicast group id {g.group_id} out of range 1..65535")
        msg = p4runtime_pb2.PacketReplicationEngineEntry()
        mge = msg.multicast_group_entry
        mge.multicast_group_id = g.group_id
        for port, instance in g.replicas:
            mge.replicas.add(egress_port=port, instance=instance)  # egress_port: what BMv2 1.15 understands
        return msg

    @staticmethod
    def group_from_proto(msg: p4runtime_pb2.MulticastGroupEntry) -> MulticastGroup:
        replicas = []
        for r in msg.replicas:
            port = r.egress_port if r.WhichOneof("port_kind") != "port" else _decode(r.port)
            replicas.append((port, r.instance))
        return MulticastGroup(msg.multicast_group_id, tuple(replicas))

    @staticmethod
    def group_from_json(doc: dict) -> MulticastGroup:
        try:
            return MulticastGroup(
                int(doc["multicast_group_id"]), tuple((int(r["egress_port"]), int(r["instance"])) for r in doc["replicas"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"bad multicast_group_entries item {doc!r}: {exc}") from None

    @staticmethod
    def group_to_json(g: MulticastGroup) -> dict:
        return {"multicast_group_id": g.group_id, "replicas": [{"egress_port": p, "instance": i} for p, i in g.replicas]}
