"""ina-switch's control-plane state by P4Runtime entity: one write and one read handler per entity kind.

finsy-style: handlers are registered by the ``Entity`` oneof name they serve (``@_writes("table_entry")``),
and :class:`P4Entities` dispatches an update or a read request through that registry, not through an if/elif
chain over ``WhichOneof``. Kinds the program has none of (registers aside, as BMv2) are refused with the
code and message p4lang/PI gives for them.

Tables, multicast groups and counters live in the ``InaPipeline``; what P4Runtime round-trips but the data
plane does not keep (an entry's ``controller_metadata`` / ``metadata``, a group's replicas as written) is
kept here.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from google.protobuf.message import Message
from p4.v1 import p4runtime_pb2

from p4src.ina_model import InaPipeline
from p4src.tables import ActionScopeError, PipelineError
from softswitch.p4failure import Code, check_update_type, fail
from softswitch.p4schema import P4Schema, TableInfo, canonical, to_int

__all__ = ["FIRST_RESERVED_GROUP", "P4Entities"]

logger = logging.getLogger("ina.p4runtime")

FIRST_RESERVED_GROUP = 1 << 15  # PI keeps multicast group ids from here on for clone sessions
Update = p4runtime_pb2.Update

Writer = Callable[["P4Entities", int, Message], None]
Reader = Callable[["P4Entities", Message], Iterator[p4runtime_pb2.Entity]]
_WRITERS: dict[str, Writer] = {}
_READERS: dict[str, Reader] = {}


def _writes(*kinds: str) -> Callable[[Writer], Writer]:
    """Register a handler for updates of these entity kinds: ``handler(entities, update type, message)``."""
    def register(handler: Writer) -> Writer:
        for kind in kinds:
            _WRITERS[kind] = handler
        return handler
    return register


def _reads(*kinds: str) -> Callable[[Reader], Reader]:
    """Register a handler for reads of these entity kinds: ``handler(entities, message)`` yields Entities."""
    def register(handler: Reader) -> Reader:
        for kind in kinds:
            _READERS[kind] = handler
        return handler
    return register


class P4Entities:
    """The P4Runtime view of one pipeline's tables, multicast groups and counters (under ``pipeline.lock``)."""

    def __init__(self, pipeline: InaPipeline, schema: P4Schema):
        self.pipeline = pipeline
        self.schema = schema
        # (table, match, or None for the default entry) -> (controller_metadata, metadata)
        self._entry_meta: dict[tuple[str, tuple | None], tuple[int, bytes]] = {}
        self._groups_written: dict[int, p4runtime_pb2.MulticastGroupEntry] = {}

    def write(self, update: p4runtime_pb2.Update) -> None:
        """Apply one update; P4RuntimeFailure says why it was refused."""
        kind = update.entity.WhichOneof("entity")
        handler = _WRITERS.get(kind)
        if handler is None:  # PI: an unset (or unknown) entity is UNKNOWN, as in a read
            raise fail(Code.UNKNOWN, "Incorrect entity type")
        handler(self, update.type, getattr(update.entity, kind))

    def read(self, entity: p4runtime_pb2.Entity) -> Iterator[p4runtime_pb2.Entity]:
        """The entities one read request entity selects (a zero id is a wildcard)."""
        kind = entity.WhichOneof("entity")
        handler = _READERS.get(kind)
        if handler is None:
            raise fail(Code.UNKNOWN, "Incorrect entity type")
        yield from handler(self, getattr(entity, kind))

    def reset(self) -> None:
        """Tables empty with their P4 default actions, no multicast groups, counters and registers zero."""
        self.pipeline.reset()
        self._entry_meta.clear()
        self._groups_written.clear()
        logger.info("pipeline state reset: tables, multicast groups, counters and registers")

    # --- tables, multicast groups, counters -----------------------------------------------------------------
    def _table(self, table_id: int) -> TableInfo:
        t = self.schema.tables.get(table_id)
        if t is None:
            raise fail(Code.INVALID_ARGUMENT, f"Invalid table id {table_id}: not a table of the program")
        return t

    def _match(self, t: TableInfo, te: p4runtime_pb2.TableEntry) -> tuple:
        """The pipeline's match tuple for a non-default entry (exact: value; lpm: (value, prefix_len))."""
        given: dict[int, p4runtime_pb2.FieldMatch] = {}
        fields = {f.id: f for f in t.fields}
        for fm in te.match:
            if fm.field_id not in fields:
                raise fail(Code.INVALID_ARGUMENT, f"Unknown field id {fm.field_id} in match key of {t.name}")
            if fm.field_id in given:
                raise fail(Code.INVALID_ARGUMENT, f"Field id {fm.field_id} given twice in match key of {t.name}")
            given[fm.field_id] = fm
        match = []
        for f in t.fields:
            fm = given.get(f.id)
            what = f"{t.name} match field {f.name}"
            if f.kind == "exact":
                if fm is None:
                    raise fail(Code.INVALID_ARGUMENT, f"Missing non-ternary field {f.name} in match key of {t.name}")
                if fm.WhichOneof("field_match_type") != "exact":
                    raise fail(Code.INVALID_ARGUMENT, f"Invalid match type for {what}: it is exact")
                match.append(to_int(fm.exact.value, f.bitwidth, what))
            else:  # lpm; an omitted field is the "don't care" /0 match
                if fm is None:
                    match.append((0, 0))
                    continue
                if fm.WhichOneof("field_match_type") != "lpm":
                    raise fail(Code.INVALID_ARGUMENT, f"Invalid match type for {what}: it is lpm")
                value = to_int(fm.lpm.value, f.bitwidth, what)
                plen = fm.lpm.prefix_len
                if plen < 0 or plen > f.bitwidth:
                    raise fail(Code.INVALID_ARGUMENT, f"{what}: prefix length {plen} is not in 0..{f.bitwidth}")
                if plen == 0:
                    raise fail(Code.INVALID_ARGUMENT,
                                f"{what}: invalid representation of 'don't care' LPM match, "
                                "omit match field instead of using a prefix length of 0")
                if value & ((1 << (f.bitwidth - plen)) - 1):
                    raise fail(Code.INVALID_ARGUMENT, f"{what}: invalid LPM value, bits set beyond prefix length {plen}")
                match.append((value, plen))
        if te.priority:
            raise fail(Code.INVALID_ARGUMENT, f"Non-zero priority {te.priority} for non-ternary match in {t.name}")
        return tuple(match)

    def _action(self, t: TableInfo, ta: p4runtime_pb2.TableAction, *, default: bool = False) -> tuple[str, tuple[int, ...]]:
        kind = ta.WhichOneof("type")
        if kind != "action":
            raise fail(Code.INVALID_ARGUMENT, f"Cannot provide indirect action ({kind}) for direct table {t.name}")
        a = self.schema.actions.get(ta.action.action_id)
        if a is None:
            raise fail(Code.INVALID_ARGUMENT, f"Invalid action id {ta.action.action_id}: not an action of the program")
        if a.id not in t.action_ids:
            raise fail(Code.INVALID_ARGUMENT, f"Invalid action for table: {a.name} is not an action of {t.name}")
        if not default and a.name in self.pipeline.table(t.name).spec.default_only:  # PI checks the scope first
            raise fail(Code.PERMISSION_DENIED, f"Cannot use DEFAULT_ONLY action in table entry ({a.name} in {t.name})")
        fields = {p.id: p for p in a.params}
        values: dict[int, int] = {}
        for p in ta.action.params:
            f = fields.get(p.param_id)
            if f is None:
                raise fail(Code.INVALID_ARGUMENT, f"Invalid param id {p.param_id} for action {a.name}")
            if p.param_id in values:
                raise fail(Code.INVALID_ARGUMENT, f"Duplicate param id {p.param_id} ({f.name}) for action {a.name}")
            values[p.param_id] = to_int(p.value, f.bitwidth, f"{a.name} parameter {f.name}")
        missing = [f.name for f in a.params if f.id not in values]
        if missing:
            raise fail(Code.INVALID_ARGUMENT, f"Missing param(s) {', '.join(missing)} for action {a.name}")
        return a.name, tuple(values[f.id] for f in a.params)

    @staticmethod
    def _check_entry_extras(t: TableInfo, te: p4runtime_pb2.TableEntry) -> None:
        if te.HasField("time_since_last_hit"):
            raise fail(Code.INVALID_ARGUMENT, "has_time_since_last_hit must not be set in WriteRequest")
        if te.idle_timeout_ns:
            raise fail(Code.INVALID_ARGUMENT,
                        f"idle_timeout_ns must be set to 0 for tables which do not support idle timeout ({t.name})")
        if te.HasField("meter_config") or te.HasField("meter_counter_data"):
            raise fail(Code.INVALID_ARGUMENT, f"Table has no direct meters ({t.name})")
        if te.HasField("counter_data"):
            raise fail(Code.INVALID_ARGUMENT, f"Table has no direct counters ({t.name})")

    @_writes("table_entry")
    def _table_write(self, utype: int, te: p4runtime_pb2.TableEntry) -> None:
        t = self._table(te.table_id)
        check_update_type(utype)
        self._check_entry_extras(t, te)
        p = self.pipeline
        if te.is_default_action:
            if utype == Update.INSERT:
                raise fail(Code.INVALID_ARGUMENT, "Cannot use INSERT for default entry")
            if utype == Update.DELETE:
                raise fail(Code.INVALID_ARGUMENT, "Cannot use DELETE for default entry")
            if len(te.match):
                raise fail(Code.INVALID_ARGUMENT, "Non-empty key for default entry")
            if te.priority:
                raise fail(Code.INVALID_ARGUMENT, "Non-zero priority for default entry")
            if p.tables[t.name].spec.const_default:  # as PI: the P4's const default_action stays
                raise fail(Code.PERMISSION_DENIED, f"Cannot change the const default action of table {t.name}")
            if te.HasField("action"):
                action, params = self._action(t, te.action, default=True)
                p.set_default_action(t.name, action, params)
                self._entry_meta[(t.name, None)] = (te.controller_metadata, te.metadata)
            else:  # MODIFY without an action resets the default entry to the P4's default_action
                p.set_default_action(t.name, t.default_action, ())
                self._entry_meta.pop((t.name, None), None)
            return
        if utype == Update.INSERT and not te.HasField("action"):
            raise fail(Code.INVALID_ARGUMENT, "'action' field must be set")
        match = self._match(t, te)
        try:
            if utype == Update.DELETE:
                p.delete_entry(t.name, match)
                self._entry_meta.pop((t.name, match), None)
                return
            if not te.HasField("action"):
                raise fail(Code.INVALID_ARGUMENT, "'action' field must be set for non-default entries")
            action, params = self._action(t, te.action)
            if utype == Update.INSERT:
                try:
                    p.insert_entry(t.name, match, action, params)
                except KeyError:
                    raise fail(Code.ALREADY_EXISTS,
                                f"Match entry exists in {t.name}, use MODIFY if you wish to change action") from None
                except OverflowError as e:  # PI answers a full BMv2 table (entry_add failed) with UNKNOWN
                    raise fail(Code.UNKNOWN, f"Error when adding match entry to target: {e}") from None
            else:
                p.modify_entry(t.name, match, action, params)
            self._entry_meta[(t.name, match)] = (te.controller_metadata, te.metadata)
        except LookupError:
            raise fail(Code.NOT_FOUND, f"Cannot find match entry in {t.name}") from None
        except ActionScopeError as e:  # as PI: "Cannot use DEFAULT_ONLY action in table entry"
            raise fail(Code.PERMISSION_DENIED, str(e)) from None
        except PipelineError as e:
            raise fail(Code.INVALID_ARGUMENT, str(e)) from None

    @_writes("packet_replication_engine_entry")
    def _pre_write(self, utype: int, pre: p4runtime_pb2.PacketReplicationEngineEntry) -> None:
        kind = pre.WhichOneof("type")
        if kind == "clone_session_entry":
            raise fail(Code.UNIMPLEMENTED, "Clone sessions are not implemented: the program does not clone")
        if kind != "multicast_group_entry":
            raise fail(Code.INVALID_ARGUMENT, "Invalid PRE operation")
        g = pre.multicast_group_entry
        gid = g.multicast_group_id
        if gid == 0:
            raise fail(Code.INVALID_ARGUMENT, "0 is not a valid group id")
        if gid >= FIRST_RESERVED_GROUP:
            raise fail(Code.OUT_OF_RANGE, f"Group id value {gid} is too high (at most {FIRST_RESERVED_GROUP - 1})")
        check_update_type(utype)
        p = self.pipeline
        exists = gid in p.multicast_groups
        if utype == Update.DELETE:
            try:
                p.delete_multicast_group(gid)
            except LookupError:
                raise fail(Code.NOT_FOUND, f"Multicast group {gid} does not exist") from None
            self._groups_written.pop(gid, None)
            return
        if utype == Update.INSERT and exists:
            raise fail(Code.ALREADY_EXISTS, f"Multicast group {gid} already exists")
        if utype == Update.MODIFY and not exists:
            raise fail(Code.NOT_FOUND, f"Multicast group {gid} does not exist")
        replicas = []
        for r in g.replicas:
            if r.WhichOneof("port_kind") == "port":
                if not r.port:
                    raise fail(Code.INVALID_ARGUMENT, "Port must not be the empty string")
                if len(r.port) > 4:
                    raise fail(Code.UNIMPLEMENTED, f"Got port of {len(r.port)} bytes, but only 4 bytes are supported")
                port = int.from_bytes(r.port, "big")
            else:
                port = r.egress_port
            if port >= 1 << 9:
                raise fail(Code.INVALID_ARGUMENT, f"Replica port {port} does not fit the 9-bit egress port")
            if r.instance >= 1 << 16:
                raise fail(Code.INVALID_ARGUMENT, f"Replica instance {r.instance} does not fit the 16-bit egress_rid")
            if (port, r.instance) in replicas:
                raise fail(Code.INVALID_ARGUMENT,
                            f"Duplicate replica in multicast group (port {port}, instance {r.instance})")
            replicas.append((port, r.instance))
        try:
            p.set_multicast_group(gid, replicas)
        except PipelineError as e:
            raise fail(Code.INVALID_ARGUMENT, str(e)) from None
        stored = p4runtime_pb2.MulticastGroupEntry()
        stored.CopyFrom(g)
        self._groups_written[gid] = stored

    def _counter(self, counter_id: int) -> tuple[str, int]:
        c = self.schema.counters.get(counter_id)
        if c is None:
            raise fail(Code.INVALID_ARGUMENT, f"Invalid counter id {counter_id}: not a counter of the program")
        return c

    @_writes("counter_entry")
    def _counter_write(self, utype: int, ce: p4runtime_pb2.CounterEntry) -> None:
        name, size = self._counter(ce.counter_id)
        if not ce.HasField("index"):
            raise fail(Code.UNIMPLEMENTED, "Wildcard write is not supported for indirect counters yet")
        index = ce.index.index
        if index < 0:
            raise fail(Code.INVALID_ARGUMENT, "A negative number is not a valid index value")
        if utype == Update.INSERT:
            raise fail(Code.INVALID_ARGUMENT, "INSERT update type not supported for counters")
        check_update_type(utype)
        if index >= size:  # PI passes the target's refusal on as UNKNOWN
            raise fail(Code.UNKNOWN, f"Error when writing to counter: index {index} is out of range for counter {name} of size {size}")
        value = ce.data.packet_count if utype == Update.MODIFY else 0  # the counters count packets
        if value < 0:
            raise fail(Code.INVALID_ARGUMENT, f"Negative packet count {value}")
        with self.pipeline.lock:
            self.pipeline.counters[name][index] = value

    @_reads("table_entry")
    def _read_tables(self, req: p4runtime_pb2.TableEntry) -> Iterator[p4runtime_pb2.Entity]:
        if req.table_id == 0:
            tables = sorted(self.schema.tables.values(), key=lambda t: t.id)
        else:
            tables = [self._table(req.table_id)]
        if req.HasField("time_since_last_hit"):
            raise fail(Code.INVALID_ARGUMENT,
                        "Do not set time_since_last_hit for a ReadRequest if the table does not support idle timeout")
        for t in tables:
            table = self.pipeline.tables[t.name]
            if req.is_default_action:
                with self.pipeline.lock:
                    action, params = table.default
                out = p4runtime_pb2.Entity()
                te = out.table_entry
                te.table_id, te.is_default_action = t.id, True
                self._fill_action(te, action, params)
                meta = self._entry_meta.get((t.name, None))
                if meta:
                    te.controller_metadata, te.metadata = meta
                yield out
                continue
            wanted = self._match(t, req) if len(req.match) else None
            with self.pipeline.lock:
                entries = [table.entries[wanted]] if wanted is not None and wanted in table.entries else (
                    [] if wanted is not None else list(table.entries.values()))
            for e in entries:
                out = p4runtime_pb2.Entity()
                te = out.table_entry
                te.table_id = t.id
                for f, v in zip(t.fields, e.match):
                    if f.kind == "exact":
                        fm = te.match.add()
                        fm.field_id, fm.exact.value = f.id, canonical(v)
                    elif v[1]:  # lpm; a /0 match is omitted, as PI returns it
                        fm = te.match.add()
                        fm.field_id, fm.lpm.value, fm.lpm.prefix_len = f.id, canonical(v[0]), v[1]
                self._fill_action(te, e.action, e.params)
                meta = self._entry_meta.get((t.name, e.match))
                if meta:
                    te.controller_metadata, te.metadata = meta
                yield out

    def _fill_action(self, te: p4runtime_pb2.TableEntry, action: str, params: tuple[int, ...]) -> None:
        a = self.schema.actions[self.schema.action_ids[action]]
        te.action.action.action_id = a.id
        for f, v in zip(a.params, params):
            p = te.action.action.params.add()
            p.param_id, p.value = f.id, canonical(v)

    @_reads("counter_entry")
    def _read_counters(self, req: p4runtime_pb2.CounterEntry) -> Iterator[p4runtime_pb2.Entity]:
        if req.counter_id == 0:
            counters = sorted(self.schema.counters.items())
        else:
            counters = [(req.counter_id, self._counter(req.counter_id))]
        for cid, (name, size) in counters:
            if req.HasField("index"):
                index = req.index.index
                if index < 0:
                    raise fail(Code.INVALID_ARGUMENT, "A negative number is not a valid index value")
                if index >= size:  # PI passes the target's refusal on as UNKNOWN
                    raise fail(Code.UNKNOWN, f"Error when reading counter: index {index} is out of range for counter {name} of size {size}")
                with self.pipeline.lock:
                    values = [(index, self.pipeline.counters[name][index])]
            else:
                with self.pipeline.lock:
                    values = list(enumerate(self.pipeline.counters[name]))
            for index, value in values:
                out = p4runtime_pb2.Entity()
                ce = out.counter_entry
                ce.counter_id = cid
                ce.index.index = index
                ce.data.packet_count = value  # PACKETS counters: byte_count stays 0
                yield out

    @_reads("packet_replication_engine_entry")
    def _read_pre(self, req: p4runtime_pb2.PacketReplicationEngineEntry) -> Iterator[p4runtime_pb2.Entity]:
        kind = req.WhichOneof("type")
        if kind == "clone_session_entry":
            if req.clone_session_entry.session_id:
                raise fail(Code.NOT_FOUND, f"Clone session {req.clone_session_entry.session_id} does not exist")
            return  # no clone sessions can exist here
        if kind != "multicast_group_entry":
            raise fail(Code.INVALID_ARGUMENT, "Invalid PRE operation")
        gid = req.multicast_group_entry.multicast_group_id
        if gid >= FIRST_RESERVED_GROUP:
            raise fail(Code.OUT_OF_RANGE, f"Group id value {gid} is too high (at most {FIRST_RESERVED_GROUP - 1})")
        with self.pipeline.lock:
            groups = dict(self.pipeline.multicast_groups)
        if gid:
            if gid not in groups:
                raise fail(Code.NOT_FOUND, f"Multicast group {gid} does not exist")
            groups = {gid: groups[gid]}
        for g in sorted(groups):
            if g >= FIRST_RESERVED_GROUP:
                continue
            out = p4runtime_pb2.Entity()
            entry = out.packet_replication_engine_entry.multicast_group_entry
            written = self._groups_written.get(g)
            replicas = groups[g]
            if written is not None and sorted(replicas) == sorted(self._replica_key(r) for r in written.replicas):
                entry.CopyFrom(written)  # what the client wrote, for read-write symmetry
            else:
                entry.multicast_group_id = g
                for port, rid in replicas:  # the order copies are made in: PI's read order of a group made in one write
                    r = entry.replicas.add()
                    r.egress_port, r.instance = port, rid
            yield out

    @staticmethod
    def _replica_key(r: p4runtime_pb2.Replica) -> tuple[int, int]:
        port = int.from_bytes(r.port, "big") if r.WhichOneof("port_kind") == "port" else r.egress_port
        return port, r.instance

    # --- kinds the program has none of ---------------------------------------------------------------------------
    @_writes("register_entry")
    def _register_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.UNIMPLEMENTED, "Register writes are not supported yet (as on BMv2)")

    @_reads("register_entry")
    def _register_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        raise fail(Code.UNIMPLEMENTED, "Register reads are not supported yet (as on BMv2)")
        yield

    @_writes("value_set_entry")
    def _value_set_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.UNIMPLEMENTED, "ValueSet writes are not supported yet")

    @_reads("value_set_entry")
    def _value_set_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        raise fail(Code.UNIMPLEMENTED, "ValueSet reads are not supported yet")
        yield

    @_writes("extern_entry")
    def _extern_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.UNIMPLEMENTED, "No extern support yet")

    @_writes("action_profile_member", "action_profile_group")
    def _action_profile_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.INVALID_ARGUMENT,
                   f"Not a valid action profile id: {msg.action_profile_id} (the program has no action profiles)")

    @_reads("action_profile_member", "action_profile_group")
    def _action_profile_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        if msg.action_profile_id:
            raise fail(Code.INVALID_ARGUMENT,
                       f"Not a valid action profile id: {msg.action_profile_id} (the program has no action profiles)")
        yield from ()

    @_writes("meter_entry", "direct_meter_entry")
    def _meter_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.INVALID_ARGUMENT, "the program has no meters")

    @_reads("meter_entry")
    def _meter_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        if msg.meter_id:
            raise fail(Code.INVALID_ARGUMENT, "the program has no meters")
        yield from ()

    @_reads("direct_meter_entry")
    def _direct_meter_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        raise fail(Code.INVALID_ARGUMENT, "Table has no direct meters (the program has none)")
        yield

    @_writes("direct_counter_entry")
    def _direct_counter_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.INVALID_ARGUMENT, "Table has no direct counters (the program has none)")

    @_reads("direct_counter_entry")
    def _direct_counter_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        raise fail(Code.INVALID_ARGUMENT, "Table has no direct counters (the program has none)")
        yield

    @_writes("digest_entry")
    def _digest_write(self, utype: int, msg: Message) -> None:
        raise fail(Code.INVALID_ARGUMENT, f"Not a valid digest id: {msg.digest_id} (the program has no digests)")

    @_reads("digest_entry")
    def _digest_read(self, msg: Message) -> Iterator[p4runtime_pb2.Entity]:
        if msg.digest_id:
            raise fail(Code.INVALID_ARGUMENT, "the program has no digests")
        yield from ()
