"""One switch over P4Runtime: arbitration, pipeline, table entries, multicast groups, counters, packet I/O,
reconcile. The project's one P4Runtime client: the controller, the topology runner's route installer
(``topologies.runtime``) and the tests' targets all drive switches through it.

A :class:`Switch` is one connection to one device (``simple_switch_grpc`` or ``ina-switch``: the target is
just an address and a device id); a controller holds one per switch and no state is process-global.

Why not p4runtime-shell's ``P4RuntimeClient`` itself: it calls ``sys.exit`` when arbitration fails,
prints to stdout, and runs its stream reader in a non-daemon thread, none of which a long-running
daemon can afford. This module keeps the same wire behaviour (arbitration on the stream channel, the
election id on every write, canonical byte strings) and reuses p4runtime-shell's P4Info ``Context`` and
byte encoders (see ``controller.p4entity``), so p4runtime-shell stays usable as
the interactive shell against the same switches (connect it with a lower election id: it is then a
read-only backup and does not take mastership away from the controller).
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self

import grpc
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.errors import ControllerError
from controller.p4entity import MulticastGroup, Schema, SchemaError, TableEntry, encode_value

__all__ = ["ReconcileReport", "Switch", "SwitchError", "SwitchOptions", "SwitchState", "plan_writes", "update_errors"]

log = logging.getLogger(__name__)

INSERT = p4runtime_pb2.Update.INSERT
MODIFY = p4runtime_pb2.Update.MODIFY
DELETE = p4runtime_pb2.Update.DELETE
_UPDATE_NAMES = {INSERT: "INSERT", MODIFY: "MODIFY", DELETE: "DELETE"}
VERIFY_AND_COMMIT = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
_BATCH = 256  # updates per WriteRequest


@dataclass(frozen=True)
class SwitchOptions:
    """How to reach one switch. Immutable: derive variants with ``dataclasses.replace``."""

    name: str
    address: str  # "127.0.0.1:9559"
    device_id: int = 1
    election_id: tuple[int, int] = (0, 10)  # (high, low); p4runtime-shell's default (0, 1) stays below it
    connect_timeout: float = 10.0  # seconds to wait for the server and the arbitration answer
    rpc_timeout: float = 10.0
    tls: object | None = None  # controller.auth.SwitchTls: P4Runtime over TLS (channel_credentials, channel_options)


class SwitchError(ControllerError):
    """A failed P4Runtime call: the gRPC status code, its details and, for writes, each failed update."""

    def __init__(self, switch: str, op: str, code: grpc.StatusCode, details: str, errors: Sequence[tuple[int, str, str]] = ()):
        self.switch = switch
        self.op = op
        self.code = code
        self.details = details
        self.errors = list(errors)  # (update index, canonical code name, message)
        super().__init__(str(self))

    def __str__(self) -> str:
        msg = f"switch {self.switch}: {self.op}: {self.code.name}: {self.details}"
        if self.errors:
            i, code, text = self.errors[0]
            more = f" (+{len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            msg += f"; update {i}: {code} {text}{more}"
        return msg

    @classmethod
    def from_rpc(cls, switch: str, op: str, exc: grpc.RpcError) -> SwitchError:
        code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        return cls(switch, op, code, details or "", update_errors(exc))


def update_errors(exc: grpc.RpcError) -> list[tuple[int, str, str]]:
    """(update index, canonical code name, message) of each failed update of a Write, from the
    ``grpc-status-details-bin`` trailer (one ``p4.v1.Error`` per update, OK for those that were applied)."""
    errors: list[tuple[int, str, str]] = []
    trailer = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else None
    for key, value in trailer or ():
        if key != "grpc-status-details-bin":
            continue
        try:
            status = status_pb2.Status.FromString(value)
            for i, detail in enumerate(status.details):
                err = p4runtime_pb2.Error()
                if detail.Unpack(err) and err.canonical_code != code_pb2.OK:
                    errors.append((i, code_pb2.Code.Name(err.canonical_code), err.message))
        except DecodeError:
            pass
    return errors


@dataclass
class SwitchState:
    """The entries and groups a switch holds (or should hold), keyed for diffing."""

    entries: dict[tuple, TableEntry] = field(default_factory=dict)
    groups: dict[int, MulticastGroup] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: Iterable[TableEntry] = (), groups: Iterable[MulticastGroup] = ()) -> SwitchState:
        return cls({e.key: e for e in entries}, {g.group_id: g for g in groups})


@dataclass
class ReconcileReport:
    inserted: list = field(default_factory=list)
    modified: list = field(default_factory=list)
    deleted: list = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.inserted or self.modified or self.deleted)

    def __str__(self) -> str:
        return f"{len(self.inserted)} inserted, {len(self.modified)} modified, {len(self.deleted)} deleted"


Phase = list[tuple[int, object]]  # [(update type, TableEntry | MulticastGroup)]


def plan_writes(current: SwitchState, target: SwitchState, table_order: Sequence[str]) -> list[Phase]:
    """The writes that turn `current` into `target`, in dependency order.

    `table_order` lists tables so that an entry may refer to what earlier tables and multicast groups
    set up (here: ``ina_worker`` before ``ina_job``, so a job becomes visible only once complete).
    Inserts and modifies go groups first, then tables in order; deletes go in reverse. Default actions
    can only be modified, and are never deleted. Only tables in `table_order` are touched.
    """
    order = {t: i for i, t in enumerate(table_order)}
    adds: list[Phase] = [[] for _ in range(len(table_order) + 1)]
    dels: list[Phase] = [[] for _ in range(len(table_order) + 1)]
    for gid, g in sorted(target.groups.items()):
        cur = current.groups.get(gid)
        if cur is None:
            adds[0].append((INSERT, g))
        elif cur != g:
            adds[0].append((MODIFY, g))
    for gid, g in sorted(current.groups.items()):
        if gid not in target.groups:
            dels[0].append((DELETE, g))
    for key, e in target.entries.items():
        if e.table not in order:
            continue
        cur = current.entries.get(key)
        if cur is None:
            adds[order[e.table] + 1].append((MODIFY if e.is_default else INSERT, e))
        elif cur != e:
            adds[order[e.table] + 1].append((MODIFY, e))
    for key, e in current.entries.items():
        if e.table in order and key not in target.entries and not e.is_default:
            dels[order[e.table] + 1].append((DELETE, e))
    phases = adds + dels[::-1]
    return [sorted(p, key=_sort_key) for p in phases if p]


def _sort_key(update: tuple[int, object]) -> tuple:
    kind, ent = update
    if isinstance(ent, MulticastGroup):
        return (kind, ent.group_id)
    return (kind, repr(ent.match))


class Switch:
    """A P4Runtime session with one device. Thread-safe for concurrent calls."""

    def __init__(self, options: SwitchOptions, schema: Schema) -> None:
        self.options = options
        self.schema = schema
        channel_options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
        if options.tls is not None:
            self._channel = grpc.secure_channel(options.address, options.tls.channel_credentials(),
                                                options=channel_options + options.tls.channel_options())
        else:
            self._channel = grpc.insecure_channel(options.address, options=channel_options)
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        self._cond = threading.Condition()
        self._requests: queue.Queue | None = None
        self._stream_open = False
        self._stream_error: grpc.RpcError | None = None
        self._arbitration: p4runtime_pb2.MasterArbitrationUpdate | None = None
        self.packets: queue.Queue = queue.Queue()  # packet-ins, for whoever wants them
        self._closed = False

    @property
    def name(self) -> str:
        return self.options.name

    def __repr__(self) -> str:
        return f"Switch({self.name!r}, {self.options.address}, device_id={self.options.device_id})"

    # --- session ------------------------------------------------------------------------------------
    def connect(self) -> bool:
        """Open the stream channel and send our election id; return whether we are primary.

        Retries until ``connect_timeout`` while the server is unreachable or refuses the arbitration
        (e.g. a killed predecessor's session is still registered with the same election id).
        """
        deadline = time.monotonic() + self.options.connect_timeout
        last: grpc.RpcError | None = None
        while True:
            self._open_stream()
            with self._cond:
                self._cond.wait_for(
                    lambda: self._arbitration is not None or not self._stream_open,
                    timeout=max(0.05, min(2.0, deadline - time.monotonic())),
                )
                if self._arbitration is not None:
                    primary = self.is_primary
                    log.info("%s: session up at %s, %s", self.name, self.options.address, "primary" if primary else "backup")
                    return primary
                last = self._stream_error
            self._close_stream()
            if time.monotonic() >= deadline:
                if last is not None:
                    raise SwitchError.from_rpc(self.name, f"connect to {self.options.address}", last)
                raise SwitchError(self.name, f"connect to {self.options.address}", grpc.StatusCode.DEADLINE_EXCEEDED, "no arbitration answer")
            time.sleep(0.1)

    def _open_stream(self) -> None:
        requests: queue.Queue = queue.Queue()
        with self._cond:
            self._requests = requests
            self._arbitration = None
            self._stream_error = None
            self._stream_open = True
        call = self._stub.StreamChannel(iter(requests.get, None))
        threading.Thread(target=self._receive, args=(call,), name=f"p4rt-{self.name}", daemon=True).start()
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.options.device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.options.election_id
        requests.put(req)

    def _receive(self, call) -> None:
        try:
            for msg in call:
                kind = msg.WhichOneof("update")
                if kind == "arbitration":
                    with self._cond:
                        self._arbitration = msg.arbitration
                        self._cond.notify_all()
                elif kind == "packet":
                    self.packets.put(msg.packet)
                elif kind == "error":
                    log.warning("%s: stream error: %s", self.name, msg.error)
        except grpc.RpcError as exc:
            with self._cond:
                self._stream_error = exc
            if not self._closed and exc.code() != grpc.StatusCode.CANCELLED:
                log.warning("%s: stream channel closed: %s", self.name, exc.details())
        finally:
            with self._cond:
                self._stream_open = False
                self._cond.notify_all()

    def _close_stream(self) -> None:
        with self._cond:
            requests, self._requests = self._requests, None
        if requests is not None:
            requests.put(None)

    @property
    def connected(self) -> bool:
        with self._cond:
            return self._stream_open and self._arbitration is not None

    @property
    def is_primary(self) -> bool:
        with self._cond:
            a = self._arbitration
            return self._stream_open and a is not None and a.status.code == code_pb2.OK

    @property
    def primary_election_id(self) -> tuple[int, int] | None:
        """The election id of the current primary, as the switch last told us."""
        with self._cond:
            a = self._arbitration
            return None if a is None or not a.HasField("election_id") else (a.election_id.high, a.election_id.low)

    def close(self) -> None:
        self._closed = True
        self._close_stream()
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- pipeline -----------------------------------------------------------------------------------
    def get_pipeline(self) -> p4info_pb2.P4Info | None:
        """The P4Info the device runs, or None if it has no pipeline yet."""
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.options.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE,
        )
        try:
            rep = self._stub.GetForwardingPipelineConfig(req, timeout=self.options.rpc_timeout)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                return None
            raise SwitchError.from_rpc(self.name, "get pipeline", exc) from None
        return rep.config.p4info if rep.config.HasField("p4info") else None

    def push_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes = b"", *,
                      action: int = VERIFY_AND_COMMIT) -> None:
        """SetForwardingPipelineConfig (VERIFY_AND_COMMIT resets the device's state; RECONCILE_AND_COMMIT
        keeps it): on BMv2 ``device_config`` is p4c's JSON.

        Before a VERIFY_AND_COMMIT the multicast groups the device holds are deleted: BMv2's replication engine
        keeps them across the push while its P4Runtime layer forgets them, so a group written again after it
        would be a second group of the same id, and every packet sent to it would be replicated twice."""
        if action == VERIFY_AND_COMMIT:
            self._delete_groups()
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=self.options.device_id, action=action)
        req.election_id.high, req.election_id.low = self.options.election_id
        req.config.p4info.CopyFrom(p4info)
        req.config.p4_device_config = device_config
        digest = hashlib.sha256(p4info.SerializeToString(deterministic=True) + device_config).digest()
        req.config.cookie.cookie = int.from_bytes(digest[:8], "big")
        try:
            self._stub.SetForwardingPipelineConfig(req, timeout=self.options.rpc_timeout)
        except grpc.RpcError as exc:
            raise SwitchError.from_rpc(self.name, "set pipeline", exc) from None

    def _delete_groups(self) -> None:
        """Delete every multicast group the device holds (none without a pipeline, or where groups cannot be read)."""
        try:
            groups = self.read_groups()
        except SwitchError as exc:
            if exc.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                return
            raise
        if groups:
            self.delete(*groups)
            log.info("%s: deleted %d multicast group(s) before pushing the pipeline", self.name, len(groups))

    def ensure_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes = b"", *, force: bool = False) -> bool:
        """Push the pipeline unless the device already runs this P4Info (pushing resets all its state,
        which would cost running jobs their in-flight aggregation). Returns whether it pushed."""
        if not force and self.get_pipeline() == p4info:
            return False
        self.push_pipeline(p4info, device_config)
        return True

    # --- writes -------------------------------------------------------------------------------------
    def _update(self, kind: int, ent: object) -> p4runtime_pb2.Update:
        u = p4runtime_pb2.Update(type=kind)
        if isinstance(ent, TableEntry):
            u.entity.table_entry.CopyFrom(self.schema.to_proto(ent))
        elif isinstance(ent, MulticastGroup):
            u.entity.packet_replication_engine_entry.CopyFrom(self.schema.group_to_proto(ent))
        else:
            raise TypeError(f"cannot write {ent!r}")
        return u

    def write(self, updates: Sequence[tuple[int, object]]) -> None:
        """One or more WriteRequests (batches of up to 256 updates), with our election id."""
        for start in range(0, len(updates), _BATCH):
            req = p4runtime_pb2.WriteRequest(device_id=self.options.device_id)
            req.election_id.high, req.election_id.low = self.options.election_id
            req.updates.extend(self._update(k, e) for k, e in updates[start : start + _BATCH])
            try:
                self._stub.Write(req, timeout=self.options.rpc_timeout)
            except grpc.RpcError as exc:
                kinds = sorted({_UPDATE_NAMES[k] for k, _ in updates[start : start + _BATCH]})
                raise SwitchError.from_rpc(self.name, "write " + "/".join(kinds), exc) from None

    def insert(self, *entities: object) -> None:
        self.write([(INSERT, e) for e in entities])

    def modify(self, *entities: object) -> None:
        self.write([(MODIFY, e) for e in entities])

    def delete(self, *entities: object) -> None:
        self.write([(DELETE, e) for e in entities])

    # --- reads --------------------------------------------------------------------------------------
    def _read(self, entity: p4runtime_pb2.Entity, op: str) -> list[p4runtime_pb2.Entity]:
        req = p4runtime_pb2.ReadRequest(device_id=self.options.device_id)
        req.entities.append(entity)
        try:
            return [e for rep in self._stub.Read(req, timeout=self.options.rpc_timeout) for e in rep.entities]
        except grpc.RpcError as exc:
            raise SwitchError.from_rpc(self.name, op, exc) from None

    def read_table(self, table: str) -> list[TableEntry]:
        """Every (non-default) entry of one table."""
        ent = p4runtime_pb2.Entity()
        ent.table_entry.table_id = self.schema.table(table).preamble.id
        return [self.schema.from_proto(e.table_entry) for e in self._read(ent, f"read {table}") if not e.table_entry.is_default_action]

    def read_groups(self) -> list[MulticastGroup]:
        """Every multicast group (a read with group id 0 is P4Runtime's wildcard)."""
        ent = p4runtime_pb2.Entity()
        ent.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        out = []
        for e in self._read(ent, "read multicast groups"):
            if e.packet_replication_engine_entry.HasField("multicast_group_entry"):
                out.append(self.schema.group_from_proto(e.packet_replication_engine_entry.multicast_group_entry))
        return out

    def read_counter(self, name: str, index: int | None = None) -> dict[int, int]:
        """Packet counts of one counter array: every index (P4Runtime wildcard read) or just `index`."""
        ent = p4runtime_pb2.Entity()
        ent.counter_entry.counter_id = self.schema.counter(name).preamble.id
        if index is not None:
            ent.counter_entry.index.index = index
        return {e.counter_entry.index.index: e.counter_entry.data.packet_count for e in self._read(ent, f"read counter {name}")}

    def read_state(self, tables: Iterable[str], groups: bool = True) -> SwitchState:
        entries = [e for t in tables for e in self.read_table(t)]
        return SwitchState.of(entries, self.read_groups() if groups else ())

    # --- packet I/O -------------------------------------------------------------------------------
    def send_packet_out(self, payload: bytes, **metadata: int) -> None:
        """A PacketOut on our stream; ``packet_out`` metadata by name (``egress_port=3``), others 0."""
        with self._cond:
            requests = self._requests
        if requests is None:
            raise SwitchError(self.name, "packet-out", grpc.StatusCode.UNAVAILABLE, "no stream: connect() first")
        msg = p4runtime_pb2.StreamMessageRequest()
        msg.packet.payload = payload
        fields = self.schema.packet_metadata("packet_out")
        unknown = set(metadata) - {f.name for f in fields}
        if unknown:
            raise SchemaError(f"packet_out has no metadata {min(unknown)!r}")
        for f in fields:
            msg.packet.metadata.add(metadata_id=f.id, value=encode_value(metadata.get(f.name, 0), f.bitwidth))
        requests.put(msg)

    def receive_packet_in(self, timeout: float | None = None) -> tuple[dict[str, int], bytes] | None:
        """The next PacketIn as ({metadata name: value}, payload), or None after ``timeout`` seconds."""
        try:
            packet = self.packets.get(timeout=timeout)
        except queue.Empty:
            return None
        names = {f.id: f.name for f in self.schema.packet_metadata("packet_in")}
        return {names.get(m.metadata_id, str(m.metadata_id)): int.from_bytes(m.value, "big") for m in packet.metadata}, packet.payload

    # --- reconcile ----------------------------------------------------------------------------------
    def apply(self, current: SwitchState, target: SwitchState, table_order: Sequence[str]) -> ReconcileReport:
        """Write the difference between `current` (what the switch holds) and `target`."""
        report = ReconcileReport()
        for phase in plan_writes(current, target, table_order):
            self.write(phase)
            for kind, ent in phase:
                {INSERT: report.inserted, MODIFY: report.modified, DELETE: report.deleted}[kind].append(ent)
        return report

    def reconcile(self, target: SwitchState, table_order: Sequence[str], groups: bool = True) -> ReconcileReport:
        """Read back the tables in `table_order` (and the multicast groups) and repair any difference
        from `target`: insert what is missing, modify what differs, delete what should not be there."""
        current = self.read_state(table_order, groups=False)
        current.groups = dict(target.groups)
        blind: list[MulticastGroup] = []
        if groups:
            try:
                current.groups = {g.group_id: g for g in self.read_groups()}
            except SwitchError as exc:
                if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                blind = list(target.groups.values())  # a target that cannot read groups: rewrite ours
        report = self.apply(current, target, table_order)
        for g in blind:
            try:
                self.modify(g)
            except SwitchError:
                self.insert(g)
            report.modified.append(g)
        if report.changed:
            log.info("%s: reconciled: %s", self.name, report)
        return report
