"""The P4Runtime service of ina-switch: ``p4.v1.P4Runtime`` over grpcio, in front of an ``InaPipeline``.

Clients (p4runtime-shell, the controller, the tests) talk to it exactly as to BMv2 ``simple_switch_grpc``:
the behaviour follows the P4Runtime 1.4 specification and, where the two differ or the spec leaves room,
p4lang/PI's server (``proto/server/pi_server.cpp``, ``proto/frontend/src/device_mgr.cpp``), which is what
BMv2 runs. docs/p4runtime.md lists what is implemented and every remaining divergence.

The switch models one program, p4src/ina.p4: ``SetForwardingPipelineConfig`` accepts its P4Info (checked
name by name, id by id, width by width against the committed ``p4src/ina.p4info.txt``) and an empty or
p4c-generated BMv2 JSON device config, and refuses anything else with ``INVALID_ARGUMENT``.

Packet I/O: ``send_packet_in(frame)`` takes a frame the pipeline emitted on the CPU port (it starts with the
2-byte ``packet_in`` header) and streams it to the primary client; a ``PacketOut`` from the primary becomes a
frame with the 2-byte ``packet_out`` header, handed to ``packet_out`` (or run through the pipeline here when
``packet_out`` is None, see ``P4RuntimeServer``).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import grpc
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from softswitch import pipeline as model
from softswitch.pipeline import InaPipeline, PipelineError

logger = logging.getLogger("ina.p4runtime")

API_VERSION = "1.4.1"
P4INFO_PATH = Path(__file__).resolve().parents[1] / "p4src" / "ina.p4info.txt"
MAX_CONNECTIONS = 16  # stream clients per device, as PI
FIRST_RESERVED_GROUP = 1 << 15  # PI keeps multicast group ids from here on for clone sessions
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a BMv2 JSON can be large; PI's server allows this much too
ERROR_SPACE = "ALL-sswitch-p4org"  # p4.v1.Error.space as PI fills it for BMv2
READ_CHUNK = 1000  # entities per streamed ReadResponse
PACKET_IN_QUEUE_LIMIT = 10_000  # packet-ins waiting for a slow primary before new ones are dropped

Code = grpc.StatusCode
Update = p4runtime_pb2.Update
SetConfig = p4runtime_pb2.SetForwardingPipelineConfigRequest
GetConfig = p4runtime_pb2.GetForwardingPipelineConfigRequest
_MATCH_KINDS = {p4info_pb2.MatchField.EXACT: "exact", p4info_pb2.MatchField.LPM: "lpm"}


class P4RuntimeFailure(Exception):
    """A request (or one update of a batch) refused with a gRPC status code and a message naming the problem."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _fail(code: grpc.StatusCode, message: str) -> P4RuntimeFailure:
    return P4RuntimeFailure(code, message)


def _check_update_type(utype: int) -> None:
    if utype == Update.UNSPECIFIED:
        raise _fail(Code.INVALID_ARGUMENT, "Update type is not set")
    if utype not in (Update.INSERT, Update.MODIFY, Update.DELETE):
        raise _fail(Code.INVALID_ARGUMENT, f"Invalid update type {utype}")


# --- the program this switch runs ---------------------------------------------------------------------------


def load_p4info(path: Path | str = P4INFO_PATH) -> p4info_pb2.P4Info:
    """The committed P4Info (text format), the reference every pushed P4Info is held against."""
    return text_format.Parse(Path(path).read_text(), p4info_pb2.P4Info())


def _objects(info: p4info_pb2.P4Info) -> list[tuple[str, list]]:
    """(kind, objects with a preamble) for every P4Info category."""
    return [
        ("table", list(info.tables)),
        ("action", list(info.actions)),
        ("action profile", list(info.action_profiles)),
        ("counter", list(info.counters)),
        ("direct counter", list(info.direct_counters)),
        ("meter", list(info.meters)),
        ("direct meter", list(info.direct_meters)),
        ("controller header", list(info.controller_packet_metadata)),
        ("value set", list(info.value_sets)),
        ("register", list(info.registers)),
        ("digest", list(info.digests)),
    ]


def _fields(fields: Iterable, with_kind: bool = False) -> list[tuple]:
    out = []
    for f in fields:
        t = (f.id, f.name, f.bitwidth)
        if with_kind:
            t += (p4info_pb2.MatchField.MatchType.Name(f.match_type),)
        out.append(t)
    return out


def _describe(kind: str, here, there) -> str | None:
    """What differs between two P4Info objects of one kind with the same id and name (None: nothing)."""
    if kind == "table":
        a, b = _fields(here.match_fields, True), _fields(there.match_fields, True)
        if a != b:
            return f"match fields are {a} here but {b} in the request"
        if {r.id for r in here.action_refs} != {r.id for r in there.action_refs}:
            return (f"action ids are {sorted(r.id for r in here.action_refs)} here but "
                    f"{sorted(r.id for r in there.action_refs)} in the request")
        for attr in ("size", "const_default_action_id", "implementation_id", "is_const_table"):
            if getattr(here, attr) != getattr(there, attr):
                return f"{attr} is {getattr(here, attr)} here but {getattr(there, attr)} in the request"
        if list(here.direct_resource_ids) != list(there.direct_resource_ids):
            return (f"direct resources are {list(here.direct_resource_ids)} here but "
                    f"{list(there.direct_resource_ids)} in the request")
    elif kind == "action":
        a, b = _fields(here.params), _fields(there.params)
        if a != b:
            return f"parameters (id, name, bitwidth) are {a} here but {b} in the request"
    elif kind == "controller header":
        a, b = _fields(here.metadata), _fields(there.metadata)
        if a != b:
            return f"metadata (id, name, bitwidth) are {a} here but {b} in the request"
    elif kind in ("counter", "direct counter"):
        if here.spec.unit != there.spec.unit:
            return f"unit is {here.spec.unit} here but {there.spec.unit} in the request"
        if kind == "counter" and here.size != there.size:
            return f"size is {here.size} here but {there.size} in the request"
    elif kind == "register":
        a, b = here.type_spec.bitstring.bit.bitwidth, there.type_spec.bitstring.bit.bitwidth
        if (a, here.size) != (b, there.size):
            return f"bit<{a}>[{here.size}] here but bit<{b}>[{there.size}] in the request"
    elif here != there:
        return "its definition differs"
    return None


def p4info_mismatch(expected: p4info_pb2.P4Info, got: p4info_pb2.P4Info) -> str | None:
    """The first difference that makes ``got`` another program than ``expected``, in words; None if none.

    Compared: every table, action (and parameter), counter, register, controller header (and metadata),
    by id, name, width, match kind and size; objects of kinds the program does not have must be absent.
    Aliases, annotations and documentation may differ.
    """
    if got.pkg_info.arch and expected.pkg_info.arch and got.pkg_info.arch != expected.pkg_info.arch:
        return f"architecture is {got.pkg_info.arch!r} in the request but {expected.pkg_info.arch!r} here"
    for (kind, here), (_, there) in zip(_objects(expected), _objects(got)):
        by_id = {o.preamble.id: o for o in here}
        by_name = {o.preamble.name: o for o in here}
        seen: set[int] = set()
        for o in there:
            pid, name = o.preamble.id, o.preamble.name
            if pid in seen:
                return f"{kind} id {pid} appears twice in the request"
            seen.add(pid)
            if pid not in by_id:
                if name in by_name:
                    return f"{kind} {name} has id {pid} in the request but {by_name[name].preamble.id} here"
                return f"{kind} {name} (id {pid}) is not part of the program this switch runs"
            mine = by_id[pid]
            if mine.preamble.name != name:
                return f"{kind} id {pid} is {name!r} in the request but {mine.preamble.name!r} here"
            diff = _describe(kind, mine, o)
            if diff:
                return f"{kind} {name}: {diff}"
        for o in here:
            if o.preamble.id not in seen:
                return f"{kind} {o.preamble.name} (id {o.preamble.id}) is missing from the request"
    if len(got.externs):
        return "the request declares externs, which the program this switch runs does not have"
    return None


def device_config_mismatch(data: bytes) -> str | None:
    """Why ``data`` is not a device config for this switch (None if it is): empty, or a BMv2 JSON of the program.

    A BMv2 JSON must hold every table (with its match kinds and actions), action (with its parameter widths),
    counter and register the model has, under the same names (``MyIngress.ina_job`` ...), and no other
    control-plane table, counter or register of ``MyIngress``/``MyEgress`` (p4c's hidden ``tbl_*`` tables aside).
    """
    if not data:
        return None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return ("p4_device_config is neither empty nor JSON: ina-switch accepts an empty device config or the "
                "BMv2 JSON p4c makes from p4src/ina.p4")
    if not isinstance(doc, dict) or not isinstance(doc.get("pipelines"), list) or not isinstance(doc.get("actions"), list):
        return "p4_device_config is JSON but not a BMv2 JSON (it needs 'pipelines' and 'actions' lists)"
    try:
        tables = {t["name"]: t for p in doc["pipelines"] for t in p.get("tables", [])}
        actions = {a["name"]: a for a in doc["actions"]}
        registers = {r["name"]: r for r in doc.get("register_arrays", [])}
        counters = {c["name"]: c for c in doc.get("counter_arrays", [])}
        for name, spec in model.TABLES.items():
            t = tables.get(name)
            if t is None:
                return f"BMv2 JSON has no table {name}"
            kinds = [k.get("match_type") for k in t.get("key", [])]
            if kinds != [kind for _, _, kind in spec.keys]:
                return f"BMv2 JSON table {name} matches {kinds}, the program {[k for _, _, k in spec.keys]}"
            if set(t.get("actions", [])) != set(spec.actions):
                return f"BMv2 JSON table {name} has actions {sorted(t.get('actions', []))}, the program {sorted(spec.actions)}"
        for name, aspec in model.ACTIONS.items():
            a = actions.get(name)
            if a is None:
                return f"BMv2 JSON has no action {name}"
            params = [(p.get("name"), p.get("bitwidth")) for p in a.get("runtime_data", [])]
            if params != list(aspec.params):
                return f"BMv2 JSON action {name} has parameters {params}, the program {list(aspec.params)}"
        for name, (width, size) in model.REGISTERS.items():
            r = registers.get(name)
            if r is None:
                return f"BMv2 JSON has no register {name}"
            if (r.get("bitwidth"), r.get("size")) != (width, size):
                return f"BMv2 JSON register {name} is bit<{r.get('bitwidth')}>[{r.get('size')}], the program bit<{width}>[{size}]"
        for name, size in model.COUNTERS.items():
            c = counters.get(name)
            if c is None:
                return f"BMv2 JSON has no counter {name}"
            if c.get("size") != size or c.get("is_direct", False):
                return f"BMv2 JSON counter {name} has size {c.get('size')}, the program an indirect counter of {size}"
        controls = ("MyIngress.", "MyEgress.")
        for kind, found, known in (("table", tables, model.TABLES), ("register", registers, model.REGISTERS),
                                   ("counter", counters, model.COUNTERS)):
            for name in found:
                if name.startswith(controls) and name not in known and not name.split(".")[-1].startswith("tbl_"):
                    return f"BMv2 JSON has {kind} {name}, which the program this switch runs does not have"
        for extra in ("meter_arrays",):
            if doc.get(extra):
                return f"BMv2 JSON has {extra}, which the program this switch runs does not have"
    except (AttributeError, TypeError, KeyError) as e:
        return f"p4_device_config is not a well-formed BMv2 JSON ({type(e).__name__}: {e})"
    return None


@dataclass(frozen=True)
class _Field:
    id: int
    name: str
    bitwidth: int
    kind: str  # "exact" | "lpm" (match fields); "" (parameters, metadata)


@dataclass(frozen=True)
class _TableInfo:
    id: int
    name: str
    fields: tuple[_Field, ...]
    action_ids: frozenset[int]
    default_action: str


@dataclass(frozen=True)
class _ActionInfo:
    id: int
    name: str
    params: tuple[_Field, ...]


class _Schema:
    """Name <-> id <-> width of every control-plane object, from the committed P4Info, checked against the model."""

    def __init__(self, info: p4info_pb2.P4Info):
        self.actions = {
            a.preamble.id: _ActionInfo(
                a.preamble.id, a.preamble.name, tuple(_Field(p.id, p.name, p.bitwidth, "") for p in a.params))
            for a in info.actions
        }
        self.action_ids = {a.name: a.id for a in self.actions.values()}
        self.tables: dict[int, _TableInfo] = {}
        for t in info.tables:
            spec = model.TABLES.get(t.preamble.name)
            if spec is None:
                raise ValueError(f"P4Info table {t.preamble.name} is not in the switch model")
            fields = tuple(_Field(m.id, m.name, m.bitwidth, _MATCH_KINDS.get(m.match_type, "?")) for m in t.match_fields)
            if tuple((f.name, f.bitwidth, f.kind) for f in fields) != spec.keys:
                raise ValueError(f"P4Info table {t.preamble.name} does not match the switch model")
            self.tables[t.preamble.id] = _TableInfo(
                t.preamble.id, t.preamble.name, fields, frozenset(r.id for r in t.action_refs), spec.default_action)
        self.table_ids = {t.name: t.id for t in self.tables.values()}
        self.counters = {c.preamble.id: (c.preamble.name, c.size) for c in info.counters}
        self.counter_ids = {name: cid for cid, (name, _) in self.counters.items()}
        headers = {h.preamble.name: tuple(_Field(m.id, m.name, m.bitwidth, "") for m in h.metadata)
                   for h in info.controller_packet_metadata}
        self.packet_in = headers.get("packet_in", ())
        self.packet_out = headers.get("packet_out", ())
        for name in model.COUNTERS:
            if name not in self.counter_ids:
                raise ValueError(f"P4Info has no counter {name}")


# --- bytestrings ---------------------------------------------------------------------------------------------


def _to_int(value: bytes, bitwidth: int, what: str) -> int:
    """A P4Runtime bytestring as an int: any length (minimal or zero-padded) whose value fits ``bitwidth`` bits."""
    v = int.from_bytes(value, "big")
    if v >> bitwidth:
        raise _fail(Code.INVALID_ARGUMENT, f"{what}: value 0x{value.hex()} does not fit within {bitwidth} bits")
    return v


def _canonical(v: int) -> bytes:
    """The canonical (shortest, at least one byte) bytestring of a non-negative int, as PI returns in reads."""
    return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")


def _pack_header(fields: tuple[_Field, ...], values: dict[int, int]) -> bytes:
    """A controller header (fields MSB first) as bytes."""
    total, acc = 0, 0
    for f in fields:
        acc = (acc << f.bitwidth) | values.get(f.id, 0)
        total += f.bitwidth
    return acc.to_bytes((total + 7) // 8, "big")


def _unpack_header(fields: tuple[_Field, ...], frame: bytes) -> tuple[dict[int, int], bytes] | None:
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


# --- client arbitration --------------------------------------------------------------------------------------

_CLOSE = object()  # stream outbox sentinel: end the RPC with OK


@dataclass
class _Abort:
    code: grpc.StatusCode
    message: str


class _Connection:
    """One StreamChannel: its election id once it has sent an arbitration update, and its outgoing messages."""

    def __init__(self, peer: str):
        self.peer = peer
        self.election_id: int | None = None
        self.device_id: int | None = None
        self.outbox: queue.Queue = queue.Queue()


def _u128(msg: p4runtime_pb2.Uint128) -> int:
    return (msg.high << 64) | msg.low


def _eid_str(eid: int) -> str:
    return f"({eid >> 64}, {eid & ((1 << 64) - 1)})"


class _Arbiter:
    """Primary election for the default role, as PI does it: the highest election id among open streams."""

    def __init__(self, device_id: int):
        self.device_id = device_id
        self.lock = threading.Lock()
        self.connections: list[_Connection] = []  # sorted by election id, highest first

    def primary(self) -> _Connection | None:
        return self.connections[0] if self.connections else None

    def _sort(self) -> None:
        self.connections.sort(key=lambda c: c.election_id, reverse=True)

    def _notify(self, conn: _Connection) -> None:
        primary = self.connections[0]
        msg = p4runtime_pb2.StreamMessageResponse()
        arb = msg.arbitration
        arb.device_id = self.device_id
        arb.election_id.high, arb.election_id.low = primary.election_id >> 64, primary.election_id & ((1 << 64) - 1)
        if conn is primary:
            arb.status.code, arb.status.message = code_pb2.OK, "Is primary"
        else:
            arb.status.code, arb.status.message = code_pb2.ALREADY_EXISTS, "Is backup"
        conn.outbox.put(msg)

    def _notify_all(self) -> None:
        for c in self.connections:
            self._notify(c)

    def update(self, conn: _Connection, election_id: int) -> None:
        """First or later arbitration update of ``conn``; raises P4RuntimeFailure to end the stream."""
        with self.lock:
            if any(c is not conn and c.election_id == election_id for c in self.connections):
                raise _fail(Code.INVALID_ARGUMENT, f"Election id {_eid_str(election_id)} already exists")
            was_primary = self.primary() is conn
            if conn.election_id is None:
                if len(self.connections) >= MAX_CONNECTIONS:
                    raise _fail(Code.RESOURCE_EXHAUSTED, f"Too many connections (at most {MAX_CONNECTIONS})")
                conn.election_id = election_id
                self.connections.append(conn)
            else:
                conn.election_id = election_id
            self._sort()
            is_primary = self.primary() is conn
            if is_primary != was_primary:
                logger.info("P4Runtime: primary is now %s with election id %s", conn.peer, _eid_str(election_id))
                self._notify_all()
            else:
                self._notify(conn)

    def remove(self, conn: _Connection) -> None:
        with self.lock:
            if conn not in self.connections:
                return
            was_primary = self.primary() is conn
            self.connections.remove(conn)
            logger.info("P4Runtime: stream of %s closed", conn.peer)
            if was_primary and self.connections:
                logger.info("P4Runtime: primary is now %s with election id %s",
                            self.connections[0].peer, _eid_str(self.connections[0].election_id))
                self._notify_all()

    def check_primary(self, request) -> None:
        """PI's rule for Write and SetForwardingPipelineConfig: with no stream open, only a request without an
        election id is accepted; otherwise its election id must be the primary's."""
        has = request.HasField("election_id")
        eid = _u128(request.election_id)
        with self.lock:
            primary = self.primary()
            if primary is None:
                if has:
                    raise _fail(Code.PERMISSION_DENIED,
                                f"Not primary: election id {_eid_str(eid)} given but no client holds a stream")
            elif primary.election_id != eid:
                raise _fail(Code.PERMISSION_DENIED,
                            f"Not primary: election id {_eid_str(eid)}, the primary's is {_eid_str(primary.election_id)}")


# --- the server ----------------------------------------------------------------------------------------------


@dataclass
class _Config:
    p4info: p4info_pb2.P4Info
    device_config: bytes
    cookie: p4runtime_pb2.ForwardingPipelineConfig.Cookie | None


class P4RuntimeServer:
    """The P4Runtime gRPC service of one ina-switch device, usable in-process.

    Args:
        pipeline: the data plane whose tables, multicast groups and counters the service reads and writes
            (under ``pipeline.lock``).
        device_id: the P4Runtime device id (``--device-id``); requests for another id get NOT_FOUND.
        address: where to listen, ``host:port``; port 0 picks a free one (``start()`` returns it).
        cpu_port: the pipeline's CPU port (``--cpu-port``, 255 for ina.p4). None: no packet-out.
        packet_out: called with each PacketOut of the primary as a frame that already carries the 2-byte
            ``packet_out`` header (egress_port:9, _pad:7), from the stream's reader thread; the data-plane
            owner feeds it to ``pipeline.process(cpu_port, frame)`` and sends the outputs. If None, the
            server does that itself: it runs ``pipeline.process(cpu_port, frame)``, streams outputs on
            ``cpu_port`` back as PacketIns (``send_packet_in``) and hands all others, as one list of
            ``(port, frame)``, to ``emit``.
        emit: receives those other outputs when ``packet_out`` is None (``None``: they are dropped and logged).
        initial_p4info: a P4Info to start with, as ``simple_switch_grpc`` started with a JSON: Write and Read
            work before any SetForwardingPipelineConfig. Must be the program's P4Info (ValueError if not).
        initial_device_config: the device config reported by GetForwardingPipelineConfig with that P4Info.
        reference_p4info: the program's P4Info every pushed P4Info is held against (default: the committed
            ``p4src/ina.p4info.txt``).

    Example::

        server = P4RuntimeServer(InaPipeline(), device_id=1, address="127.0.0.1:0", cpu_port=255)
        port = server.start()
        ...
        server.stop()
    """

    def __init__(
        self,
        pipeline: InaPipeline,
        *,
        device_id: int,
        address: str = "127.0.0.1:9559",
        cpu_port: int | None = None,
        packet_out: Callable[[bytes], None] | None = None,
        emit: Callable[[list[tuple[int, bytes]]], None] | None = None,
        initial_p4info: p4info_pb2.P4Info | None = None,
        initial_device_config: bytes = b"",
        reference_p4info: p4info_pb2.P4Info | None = None,
    ):
        self.pipeline = pipeline
        self.device_id = device_id
        self.address = address
        self.cpu_port = cpu_port
        self._packet_out_fn = packet_out
        self._emit = emit
        self.reference_p4info = reference_p4info if reference_p4info is not None else load_p4info()
        self._schema = _Schema(self.reference_p4info)
        self._arbiter = _Arbiter(device_id)
        self._write_lock = threading.Lock()  # one Write / SetForwardingPipelineConfig at a time
        self._config: _Config | None = None
        self._saved: _Config | None = None  # VERIFY_AND_SAVE, waiting for COMMIT
        # Per-entry state that P4Runtime round-trips but the data plane does not keep.
        # (table, match, or None for the default entry) -> (controller_metadata, metadata)
        self._entry_meta: dict[tuple[str, tuple | None], tuple[int, bytes]] = {}
        self._groups_written: dict[int, p4runtime_pb2.MulticastGroupEntry] = {}
        self._server: grpc.Server | None = None
        self.port: int | None = None
        self.packets_in = 0  # PacketIns streamed to a primary
        self.packets_in_dropped = 0  # no primary, no config, or primary too slow
        self.packets_out = 0  # PacketOuts accepted from the primary
        if initial_p4info is not None:
            why = p4info_mismatch(self.reference_p4info, initial_p4info) or device_config_mismatch(initial_device_config)
            if why:
                raise ValueError(f"initial P4Info / device config is not the program this switch runs: {why}")
            self._config = _Config(initial_p4info, initial_device_config, None)

    @property
    def configured(self) -> bool:
        """True once a forwarding pipeline config is set (or ``initial_p4info`` was given)."""
        return self._config is not None

    # --- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> int:
        """Listen on ``address``; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("P4Runtime server already started")
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=MAX_CONNECTIONS + 8, thread_name_prefix="p4rt"),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
        )
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(_Service(self), server)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as e:
            raise RuntimeError(f"P4Runtime server cannot listen on {self.address}: {e}") from None
        if port == 0:
            raise RuntimeError(f"P4Runtime server cannot listen on {self.address}")
        server.start()
        self._server, self.port = server, port
        logger.info("P4Runtime server for device %d listening on %s (port %d)", self.device_id, self.address, port)
        return port

    def stop(self, grace: float = 0.5) -> None:
        """End every stream and stop serving; waits at most ``grace`` seconds for RPCs in flight."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._arbiter.lock:
            conns = list(self._arbiter.connections)
        for c in conns:
            c.outbox.put(_CLOSE)
        server.stop(grace).wait()
        logger.info("P4Runtime server for device %d stopped", self.device_id)

    def __enter__(self) -> "P4RuntimeServer":
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- packet I/O ------------------------------------------------------------------------------------------
    def send_packet_in(self, frame_with_packet_in_header: bytes) -> None:
        """Stream a frame the pipeline emitted on the CPU port to the primary client as a PacketIn.

        The frame starts with the ``packet_in`` header (ingress_port:9, _pad:7), which becomes the PacketIn's
        metadata (ids from the P4Info, canonical bytestrings); the rest is the payload. Dropped (and counted
        in ``packets_in_dropped``) when no pipeline config is set, no client is primary, or the primary has
        ``PACKET_IN_QUEUE_LIMIT`` messages waiting. Thread-safe.
        """
        if self._config is None:
            self.packets_in_dropped += 1
            logger.debug("packet-in dropped: no forwarding pipeline config set")
            return
        parsed = _unpack_header(self._schema.packet_in, frame_with_packet_in_header)
        if parsed is None:
            self.packets_in_dropped += 1
            logger.warning("packet-in dropped: %d-byte frame is shorter than the packet_in header",
                           len(frame_with_packet_in_header))
            return
        values, payload = parsed
        msg = p4runtime_pb2.StreamMessageResponse()
        msg.packet.payload = payload
        for f in self._schema.packet_in:
            md = msg.packet.metadata.add()
            md.metadata_id, md.value = f.id, _canonical(values[f.id])
        with self._arbiter.lock:
            primary = self._arbiter.primary()
            if primary is None or primary.outbox.qsize() >= PACKET_IN_QUEUE_LIMIT:
                self.packets_in_dropped += 1
                logger.debug("packet-in dropped: %s", "no primary client" if primary is None else "primary too slow")
                return
            primary.outbox.put(msg)
            self.packets_in += 1

    def _packet_out(self, conn: _Connection, packet: p4runtime_pb2.PacketOut) -> None:
        with self._arbiter.lock:
            is_primary = self._arbiter.primary() is conn
        if not is_primary:
            logger.info("packet-out from %s dropped: not the primary client", conn.peer)
            return
        if self._config is None:
            logger.info("packet-out dropped: no forwarding pipeline config set")
            return
        try:
            fields = {f.id: f for f in self._schema.packet_out}
            values: dict[int, int] = {}
            for md in packet.metadata:
                f = fields.get(md.metadata_id)
                if f is None:
                    raise _fail(Code.INVALID_ARGUMENT, f"Unknown metadata id {md.metadata_id} in PacketOut message")
                values[f.id] = _to_int(md.value, f.bitwidth, f"PacketOut metadata {f.name}")
            frame = _pack_header(self._schema.packet_out, values) + packet.payload
            if self._packet_out_fn is None and self.cpu_port is None:
                raise _fail(Code.FAILED_PRECONDITION, "this switch was started without a CPU port: no packet-out")
            try:
                self._inject(frame)
            except Exception as e:  # a data-plane failure must not end the client's stream
                logger.exception("packet-out from %s failed in the data plane", conn.peer)
                raise _fail(Code.UNKNOWN, f"Unknown error when target sending packet-out: {e}") from None
            self.packets_out += 1
        except P4RuntimeFailure as f:
            logger.info("packet-out from %s refused: %s", conn.peer, f.message)
            err = p4runtime_pb2.StreamMessageResponse()
            err.error.canonical_code = f.code.value[0]
            err.error.message = f.message
            err.error.space = ERROR_SPACE
            err.error.packet_out.SetInParent()
            conn.outbox.put(err)

    def _inject(self, frame: bytes) -> None:
        """A packet-out frame (packet_out header first) into the data plane: ``packet_out``, or the pipeline here."""
        if self._packet_out_fn is not None:
            self._packet_out_fn(frame)
            return
        others = []
        for port, out in self.pipeline.process(self.cpu_port, frame):
            if port == self.cpu_port:
                self.send_packet_in(out)
            else:
                others.append((port, out))
        if not others:
            return
        if self._emit is not None:
            self._emit(others)
        else:
            logger.debug("packet-out outputs dropped (no emit callback): ports %s", [p for p, _ in others])

    # --- StreamChannel ---------------------------------------------------------------------------------------
    def _stream(self, requests: Iterator[p4runtime_pb2.StreamMessageRequest],
                context) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        conn = _Connection(context.peer())
        context.add_callback(lambda: conn.outbox.put(_CLOSE))
        reader = threading.Thread(target=self._read_stream, args=(requests, conn), name="p4rt-stream", daemon=True)
        reader.start()
        try:
            while True:
                item = conn.outbox.get()
                if item is _CLOSE:
                    return
                if isinstance(item, _Abort):
                    context.abort(item.code, item.message)
                yield item
        finally:
            self._arbiter.remove(conn)

    def _read_stream(self, requests: Iterator[p4runtime_pb2.StreamMessageRequest], conn: _Connection) -> None:
        try:
            for req in requests:
                kind = req.WhichOneof("update")
                if kind == "arbitration":
                    try:
                        self._arbitrate(conn, req.arbitration)
                    except P4RuntimeFailure as f:
                        logger.info("P4Runtime: stream of %s refused: %s", conn.peer, f.message)
                        conn.outbox.put(_Abort(f.code, f.message))
                        return
                elif kind == "packet":
                    if conn.election_id is None:
                        logger.info("packet-out from %s dropped: no arbitration update on its stream yet", conn.peer)
                    else:
                        self._packet_out(conn, req.packet)
                elif kind == "digest_ack":
                    logger.debug("digest ack from %s ignored: the program has no digests", conn.peer)
                else:
                    logger.info("stream message of type %s from %s ignored", kind, conn.peer)
        except grpc.RpcError:
            pass  # the client went away
        except Exception:  # keep the server alive whatever a stream does; say what happened
            logger.exception("P4Runtime: error on the stream of %s", conn.peer)
        finally:
            self._arbiter.remove(conn)
            conn.outbox.put(_CLOSE)

    def _arbitrate(self, conn: _Connection, arb: p4runtime_pb2.MasterArbitrationUpdate) -> None:
        if conn.device_id is not None and arb.device_id != conn.device_id:
            raise _fail(Code.FAILED_PRECONDITION,
                        f"Invalid device id {arb.device_id}: this stream is for device {conn.device_id}")
        if arb.device_id != self.device_id:
            raise _fail(Code.NOT_FOUND, f"Unknown device id {arb.device_id}: this switch is device {self.device_id}")
        if arb.HasField("role") and (arb.role.name or arb.role.id or arb.role.HasField("config")):
            raise _fail(Code.UNIMPLEMENTED,
                        "Roles are not implemented: only the default role (no role) is, got "
                        f"{text_format.MessageToString(arb.role, as_one_line=True)!r}")
        conn.device_id = arb.device_id
        eid = _u128(arb.election_id)
        logger.info("P4Runtime: arbitration update from %s, election id %s", conn.peer, _eid_str(eid))
        self._arbiter.update(conn, eid)

    # --- request checks --------------------------------------------------------------------------------------
    def _check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise _fail(Code.NOT_FOUND, f"Unknown device id {device_id}: this switch is device {self.device_id}")

    @staticmethod
    def _check_role(request) -> None:
        if request.role or getattr(request, "role_id", 0):
            raise _fail(Code.UNIMPLEMENTED,
                        f"Roles are not implemented: only the default role is, got {request.role or request.role_id!r}")

    def _require_config(self) -> _Config:
        config = self._config
        if config is None:
            raise _fail(Code.FAILED_PRECONDITION, "No forwarding pipeline config set for this device")
        return config

    # --- SetForwardingPipelineConfig / GetForwardingPipelineConfig -------------------------------------------
    def _set_pipeline(self, request: p4runtime_pb2.SetForwardingPipelineConfigRequest) -> None:
        self._check_device(request.device_id)
        self._check_role(request)
        self._arbiter.check_primary(request)
        action = request.action
        name = SetConfig.Action.Name(action)
        logger.info("P4Runtime SetForwardingPipelineConfig %s", name)
        if action == SetConfig.UNSPECIFIED:
            raise _fail(Code.INVALID_ARGUMENT, "Invalid SetForwardingPipeline action UNSPECIFIED")
        config = None
        if action != SetConfig.COMMIT:
            if not request.HasField("config"):
                raise _fail(Code.INVALID_ARGUMENT, f"{name} needs a config")
            why = p4info_mismatch(self.reference_p4info, request.config.p4info)
            if why:
                raise _fail(Code.INVALID_ARGUMENT,
                            f"P4Info is not the program this switch runs (p4src/ina.p4info.txt): {why}")
            why = device_config_mismatch(request.config.p4_device_config)
            if why:
                raise _fail(Code.INVALID_ARGUMENT, why)
            cookie = request.config.cookie if request.config.HasField("cookie") else None
            config = _Config(request.config.p4info, request.config.p4_device_config, cookie)
        if action == SetConfig.VERIFY:
            return
        with self._write_lock:
            if action == SetConfig.VERIFY_AND_SAVE:
                self._saved = config
                return
            if action == SetConfig.COMMIT:
                if self._saved is None:
                    raise _fail(Code.FAILED_PRECONDITION, "COMMIT without a config saved by VERIFY_AND_SAVE")
                config, self._saved = self._saved, None
            if action != SetConfig.RECONCILE_AND_COMMIT:
                self._reset_state()  # a new pipeline starts empty, as on BMv2
            self._config = config

    def _reset_state(self) -> None:
        """Tables empty with their P4 default actions, no multicast groups, counters and registers zero."""
        p = self.pipeline
        for name, table in p.tables.items():
            with p.lock:
                matches = list(table.entries)
            for m in matches:
                try:
                    p.delete_entry(name, m)
                except LookupError:
                    pass
            if not table.spec.const_default:
                p.set_default_action(name, table.spec.default_action, ())
        for g in list(p.multicast_groups):
            try:
                p.delete_multicast_group(g)
            except LookupError:
                pass
        with p.lock:
            for values in p.counters.values():
                values[:] = [0] * len(values)
            p.reset_registers()
        self._entry_meta.clear()
        self._groups_written.clear()
        logger.info("pipeline state reset: tables, multicast groups, counters and registers")

    def _get_pipeline(self, request: p4runtime_pb2.GetForwardingPipelineConfigRequest
                      ) -> p4runtime_pb2.GetForwardingPipelineConfigResponse:
        self._check_device(request.device_id)
        config = self._require_config()
        rep = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        rt = request.response_type
        if rt not in (GetConfig.ALL, GetConfig.COOKIE_ONLY, GetConfig.P4INFO_AND_COOKIE, GetConfig.DEVICE_CONFIG_AND_COOKIE):
            raise _fail(Code.INVALID_ARGUMENT, f"Invalid response_type {rt} in GetForwardingPipelineConfigRequest")
        if rt in (GetConfig.ALL, GetConfig.P4INFO_AND_COOKIE):
            rep.config.p4info.CopyFrom(config.p4info)
        if rt in (GetConfig.ALL, GetConfig.DEVICE_CONFIG_AND_COOKIE):
            rep.config.p4_device_config = config.device_config
        if config.cookie is not None:
            rep.config.cookie.CopyFrom(config.cookie)
        return rep

    # --- Write -----------------------------------------------------------------------------------------------
    def _write(self, request: p4runtime_pb2.WriteRequest, context) -> p4runtime_pb2.WriteResponse:
        self._check_device(request.device_id)
        self._check_role(request)
        self._arbiter.check_primary(request)
        self._require_config()
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            raise _fail(Code.UNIMPLEMENTED, "Support for atomic write modes has not been implemented yet")
        logger.debug("P4Runtime Write\n%s", request)
        errors: list[p4runtime_pb2.Error] = []
        with self._write_lock:
            for update in request.updates:
                err = p4runtime_pb2.Error()
                try:
                    self._apply(update)
                except P4RuntimeFailure as f:
                    err.canonical_code, err.message, err.space = f.code.value[0], f.message, ERROR_SPACE
                    logger.info("P4Runtime Write: update %d refused: %s: %s", len(errors), f.code.name, f.message)
                errors.append(err)
        failed = [(i, e) for i, e in enumerate(errors) if e.canonical_code != code_pb2.OK]
        if failed:
            i, first = failed[0]
            message = (f"Write failure: {len(failed)} of {len(errors)} updates failed; first at index {i}: "
                       f"{code_pb2.Code.Name(first.canonical_code)}: {first.message}")
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message=message)
            for e in errors:
                status.details.add().Pack(e)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(Code.UNKNOWN, message)
        return p4runtime_pb2.WriteResponse()

    def _apply(self, update: p4runtime_pb2.Update) -> None:
        kind = update.entity.WhichOneof("entity")
        if kind == "table_entry":
            self._table_write(update.type, update.entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            self._pre_write(update.type, update.entity.packet_replication_engine_entry)
        elif kind == "counter_entry":
            self._counter_write(update.type, update.entity.counter_entry)
        elif kind == "register_entry":
            raise _fail(Code.UNIMPLEMENTED, "Register writes are not supported yet (as on BMv2)")
        elif kind == "value_set_entry":
            raise _fail(Code.UNIMPLEMENTED, "ValueSet writes are not supported yet")
        elif kind == "extern_entry":
            raise _fail(Code.UNIMPLEMENTED, "No extern support yet")
        elif kind in ("action_profile_member", "action_profile_group"):
            ap_id = getattr(update.entity, kind).action_profile_id
            raise _fail(Code.INVALID_ARGUMENT,
                        f"Not a valid action profile id: {ap_id} (the program has no action profiles)")
        elif kind in ("meter_entry", "direct_meter_entry"):
            raise _fail(Code.INVALID_ARGUMENT, "the program has no meters")
        elif kind == "direct_counter_entry":
            raise _fail(Code.INVALID_ARGUMENT, "Table has no direct counters (the program has none)")
        elif kind == "digest_entry":
            raise _fail(Code.INVALID_ARGUMENT,
                        f"Not a valid digest id: {update.entity.digest_entry.digest_id} (the program has no digests)")
        else:
            raise _fail(Code.INVALID_ARGUMENT, "Update has no entity")

    def _table(self, table_id: int) -> _TableInfo:
        t = self._schema.tables.get(table_id)
        if t is None:
            raise _fail(Code.INVALID_ARGUMENT, f"Invalid table id {table_id}: not a table of the program")
        return t

    def _match(self, t: _TableInfo, te: p4runtime_pb2.TableEntry) -> tuple:
        """The pipeline's match tuple for a non-default entry (exact: value; lpm: (value, prefix_len))."""
        given: dict[int, p4runtime_pb2.FieldMatch] = {}
        fields = {f.id: f for f in t.fields}
        for fm in te.match:
            if fm.field_id not in fields:
                raise _fail(Code.INVALID_ARGUMENT, f"Unknown field id {fm.field_id} in match key of {t.name}")
            if fm.field_id in given:
                raise _fail(Code.INVALID_ARGUMENT, f"Field id {fm.field_id} given twice in match key of {t.name}")
            given[fm.field_id] = fm
        match = []
        for f in t.fields:
            fm = given.get(f.id)
            what = f"{t.name} match field {f.name}"
            if f.kind == "exact":
                if fm is None:
                    raise _fail(Code.INVALID_ARGUMENT, f"Missing non-ternary field {f.name} in match key of {t.name}")
                if fm.WhichOneof("field_match_type") != "exact":
                    raise _fail(Code.INVALID_ARGUMENT, f"Invalid match type for {what}: it is exact")
                match.append(_to_int(fm.exact.value, f.bitwidth, what))
            else:  # lpm; an omitted field is the "don't care" /0 match
                if fm is None:
                    match.append((0, 0))
                    continue
                if fm.WhichOneof("field_match_type") != "lpm":
                    raise _fail(Code.INVALID_ARGUMENT, f"Invalid match type for {what}: it is lpm")
                value = _to_int(fm.lpm.value, f.bitwidth, what)
                plen = fm.lpm.prefix_len
                if plen < 0 or plen > f.bitwidth:
                    raise _fail(Code.INVALID_ARGUMENT, f"{what}: prefix length {plen} is not in 0..{f.bitwidth}")
                if plen == 0:
                    raise _fail(Code.INVALID_ARGUMENT,
                                f"{what}: invalid representation of 'don't care' LPM match, "
                                "omit match field instead of using a prefix length of 0")
                if value & ((1 << (f.bitwidth - plen)) - 1):
                    raise _fail(Code.INVALID_ARGUMENT, f"{what}: invalid LPM value, bits set beyond prefix length {plen}")
                match.append((value, plen))
        if te.priority:
            raise _fail(Code.INVALID_ARGUMENT, f"Non-zero priority {te.priority} for non-ternary match in {t.name}")
        return tuple(match)

    def _action(self, t: _TableInfo, ta: p4runtime_pb2.TableAction) -> tuple[str, tuple[int, ...]]:
        kind = ta.WhichOneof("type")
        if kind != "action":
            raise _fail(Code.INVALID_ARGUMENT, f"Cannot provide indirect action ({kind}) for direct table {t.name}")
        a = self._schema.actions.get(ta.action.action_id)
        if a is None:
            raise _fail(Code.INVALID_ARGUMENT, f"Invalid action id {ta.action.action_id}: not an action of the program")
        if a.id not in t.action_ids:
            raise _fail(Code.INVALID_ARGUMENT, f"Invalid action for table: {a.name} is not an action of {t.name}")
        fields = {p.id: p for p in a.params}
        values: dict[int, int] = {}
        for p in ta.action.params:
            f = fields.get(p.param_id)
            if f is None:
                raise _fail(Code.INVALID_ARGUMENT, f"Invalid param id {p.param_id} for action {a.name}")
            if p.param_id in values:
                raise _fail(Code.INVALID_ARGUMENT, f"Duplicate param id {p.param_id} ({f.name}) for action {a.name}")
            values[p.param_id] = _to_int(p.value, f.bitwidth, f"{a.name} parameter {f.name}")
        missing = [f.name for f in a.params if f.id not in values]
        if missing:
            raise _fail(Code.INVALID_ARGUMENT, f"Missing param(s) {', '.join(missing)} for action {a.name}")
        return a.name, tuple(values[f.id] for f in a.params)

    @staticmethod
    def _check_entry_extras(t: _TableInfo, te: p4runtime_pb2.TableEntry) -> None:
        if te.HasField("time_since_last_hit"):
            raise _fail(Code.INVALID_ARGUMENT, "has_time_since_last_hit must not be set in WriteRequest")
        if te.idle_timeout_ns:
            raise _fail(Code.INVALID_ARGUMENT,
                        f"idle_timeout_ns must be set to 0 for tables which do not support idle timeout ({t.name})")
        if te.HasField("meter_config") or te.HasField("meter_counter_data"):
            raise _fail(Code.INVALID_ARGUMENT, f"Table has no direct meters ({t.name})")
        if te.HasField("counter_data"):
            raise _fail(Code.INVALID_ARGUMENT, f"Table has no direct counters ({t.name})")

    def _table_write(self, utype: int, te: p4runtime_pb2.TableEntry) -> None:
        t = self._table(te.table_id)
        _check_update_type(utype)
        self._check_entry_extras(t, te)
        p = self.pipeline
        if te.is_default_action:
            if utype == Update.INSERT:
                raise _fail(Code.INVALID_ARGUMENT, "Cannot use INSERT for default entry")
            if utype == Update.DELETE:
                raise _fail(Code.INVALID_ARGUMENT, "Cannot use DELETE for default entry")
            if len(te.match):
                raise _fail(Code.INVALID_ARGUMENT, "Non-empty key for default entry")
            if te.priority:
                raise _fail(Code.INVALID_ARGUMENT, "Non-zero priority for default entry")
            if p.tables[t.name].spec.const_default:  # as PI: the P4's const default_action stays
                raise _fail(Code.PERMISSION_DENIED, f"Cannot change the const default action of table {t.name}")
            if te.HasField("action"):
                action, params = self._action(t, te.action)
                p.set_default_action(t.name, action, params)
                self._entry_meta[(t.name, None)] = (te.controller_metadata, te.metadata)
            else:  # MODIFY without an action resets the default entry to the P4's default_action
                p.set_default_action(t.name, t.default_action, ())
                self._entry_meta.pop((t.name, None), None)
            return
        if utype == Update.INSERT and not te.HasField("action"):
            raise _fail(Code.INVALID_ARGUMENT, "'action' field must be set")
        match = self._match(t, te)
        try:
            if utype == Update.DELETE:
                p.delete_entry(t.name, match)
                self._entry_meta.pop((t.name, match), None)
                return
            if not te.HasField("action"):
                raise _fail(Code.INVALID_ARGUMENT, "'action' field must be set for non-default entries")
            action, params = self._action(t, te.action)
            if utype == Update.INSERT:
                try:
                    p.insert_entry(t.name, match, action, params)
                except KeyError:
                    raise _fail(Code.ALREADY_EXISTS,
                                f"Match entry exists in {t.name}, use MODIFY if you wish to change action") from None
                except OverflowError as e:
                    raise _fail(Code.RESOURCE_EXHAUSTED, str(e)) from None
            else:
                p.modify_entry(t.name, match, action, params)
            self._entry_meta[(t.name, match)] = (te.controller_metadata, te.metadata)
        except LookupError:
            raise _fail(Code.NOT_FOUND, f"Cannot find match entry in {t.name}") from None
        except PipelineError as e:
            raise _fail(Code.INVALID_ARGUMENT, str(e)) from None

    def _pre_write(self, utype: int, pre: p4runtime_pb2.PacketReplicationEngineEntry) -> None:
        kind = pre.WhichOneof("type")
        if kind == "clone_session_entry":
            raise _fail(Code.UNIMPLEMENTED, "Clone sessions are not implemented: the program does not clone")
        if kind != "multicast_group_entry":
            raise _fail(Code.INVALID_ARGUMENT, "Invalid PRE operation")
        g = pre.multicast_group_entry
        gid = g.multicast_group_id
        if gid == 0:
            raise _fail(Code.INVALID_ARGUMENT, "0 is not a valid group id")
        if gid >= FIRST_RESERVED_GROUP:
            raise _fail(Code.OUT_OF_RANGE, f"Group id value {gid} is too high (at most {FIRST_RESERVED_GROUP - 1})")
        _check_update_type(utype)
        p = self.pipeline
        exists = gid in p.multicast_groups
        if utype == Update.DELETE:
            try:
                p.delete_multicast_group(gid)
            except LookupError:
                raise _fail(Code.NOT_FOUND, f"Multicast group {gid} does not exist") from None
            self._groups_written.pop(gid, None)
            return
        if utype == Update.INSERT and exists:
            raise _fail(Code.ALREADY_EXISTS, f"Multicast group {gid} already exists")
        if utype == Update.MODIFY and not exists:
            raise _fail(Code.NOT_FOUND, f"Multicast group {gid} does not exist")
        replicas = []
        for r in g.replicas:
            if r.WhichOneof("port_kind") == "port":
                if not r.port:
                    raise _fail(Code.INVALID_ARGUMENT, "Port must not be the empty string")
                if len(r.port) > 4:
                    raise _fail(Code.UNIMPLEMENTED, f"Got port of {len(r.port)} bytes, but only 4 bytes are supported")
                port = int.from_bytes(r.port, "big")
            else:
                port = r.egress_port
            if port >= 1 << 9:
                raise _fail(Code.INVALID_ARGUMENT, f"Replica port {port} does not fit the 9-bit egress port")
            if r.instance >= 1 << 16:
                raise _fail(Code.INVALID_ARGUMENT, f"Replica instance {r.instance} does not fit the 16-bit egress_rid")
            if (port, r.instance) in replicas:
                raise _fail(Code.INVALID_ARGUMENT,
                            f"Duplicate replica in multicast group (port {port}, instance {r.instance})")
            replicas.append((port, r.instance))
        try:
            p.set_multicast_group(gid, replicas)
        except PipelineError as e:
            raise _fail(Code.INVALID_ARGUMENT, str(e)) from None
        stored = p4runtime_pb2.MulticastGroupEntry()
        stored.CopyFrom(g)
        self._groups_written[gid] = stored

    def _counter(self, counter_id: int) -> tuple[str, int]:
        c = self._schema.counters.get(counter_id)
        if c is None:
            raise _fail(Code.INVALID_ARGUMENT, f"Invalid counter id {counter_id}: not a counter of the program")
        return c

    def _counter_write(self, utype: int, ce: p4runtime_pb2.CounterEntry) -> None:
        name, size = self._counter(ce.counter_id)
        if not ce.HasField("index"):
            raise _fail(Code.UNIMPLEMENTED, "Wildcard write is not supported for indirect counters yet")
        index = ce.index.index
        if index < 0:
            raise _fail(Code.INVALID_ARGUMENT, "A negative number is not a valid index value")
        if utype == Update.INSERT:
            raise _fail(Code.INVALID_ARGUMENT, "INSERT update type not supported for counters")
        _check_update_type(utype)
        if index >= size:
            raise _fail(Code.OUT_OF_RANGE, f"Index {index} is out of range for counter {name} of size {size}")
        value = ce.data.packet_count if utype == Update.MODIFY else 0  # the counters count packets
        if value < 0:
            raise _fail(Code.INVALID_ARGUMENT, f"Negative packet count {value}")
        with self.pipeline.lock:
            self.pipeline.counters[name][index] = value

    # --- Read ------------------------------------------------------------------------------------------------
    def _read(self, request: p4runtime_pb2.ReadRequest, context) -> Iterator[p4runtime_pb2.ReadResponse]:
        self._check_device(request.device_id)
        self._require_config()
        logger.debug("P4Runtime Read\n%s", request)
        response = p4runtime_pb2.ReadResponse()
        sent = False
        for entity in request.entities:
            try:
                for e in self._read_entity(entity):
                    response.entities.add().CopyFrom(e)
                    if len(response.entities) >= READ_CHUNK:
                        yield response
                        sent = True
                        response = p4runtime_pb2.ReadResponse()
            except P4RuntimeFailure as f:
                logger.info("P4Runtime Read refused: %s: %s", f.code.name, f.message)
                if len(response.entities):
                    yield response
                context.abort(f.code, f.message)
        if len(response.entities) or not sent:
            yield response

    def _read_entity(self, entity: p4runtime_pb2.Entity) -> Iterator[p4runtime_pb2.Entity]:
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            yield from self._read_tables(entity.table_entry)
        elif kind == "counter_entry":
            yield from self._read_counters(entity.counter_entry)
        elif kind == "packet_replication_engine_entry":
            yield from self._read_pre(entity.packet_replication_engine_entry)
        elif kind == "register_entry":
            raise _fail(Code.UNIMPLEMENTED, "Register reads are not supported yet (as on BMv2)")
        elif kind == "value_set_entry":
            raise _fail(Code.UNIMPLEMENTED, "ValueSet reads are not supported yet")
        elif kind in ("action_profile_member", "action_profile_group"):
            ap_id = getattr(entity, kind).action_profile_id
            if ap_id:
                raise _fail(Code.INVALID_ARGUMENT,
                            f"Not a valid action profile id: {ap_id} (the program has no action profiles)")
        elif kind == "meter_entry":
            if entity.meter_entry.meter_id:
                raise _fail(Code.INVALID_ARGUMENT, "the program has no meters")
        elif kind == "direct_meter_entry":
            raise _fail(Code.INVALID_ARGUMENT, "Table has no direct meters (the program has none)")
        elif kind == "direct_counter_entry":
            raise _fail(Code.INVALID_ARGUMENT, "Table has no direct counters (the program has none)")
        elif kind == "digest_entry":
            if entity.digest_entry.digest_id:
                raise _fail(Code.INVALID_ARGUMENT, "the program has no digests")
        else:
            raise _fail(Code.UNKNOWN, "Incorrect entity type")

    def _read_tables(self, req: p4runtime_pb2.TableEntry) -> Iterator[p4runtime_pb2.Entity]:
        if req.table_id == 0:
            tables = sorted(self._schema.tables.values(), key=lambda t: t.id)
        else:
            tables = [self._table(req.table_id)]
        if req.HasField("time_since_last_hit"):
            raise _fail(Code.INVALID_ARGUMENT,
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
                        fm.field_id, fm.exact.value = f.id, _canonical(v)
                    elif v[1]:  # lpm; a /0 match is omitted, as PI returns it
                        fm = te.match.add()
                        fm.field_id, fm.lpm.value, fm.lpm.prefix_len = f.id, _canonical(v[0]), v[1]
                self._fill_action(te, e.action, e.params)
                meta = self._entry_meta.get((t.name, e.match))
                if meta:
                    te.controller_metadata, te.metadata = meta
                yield out

    def _fill_action(self, te: p4runtime_pb2.TableEntry, action: str, params: tuple[int, ...]) -> None:
        a = self._schema.actions[self._schema.action_ids[action]]
        te.action.action.action_id = a.id
        for f, v in zip(a.params, params):
            p = te.action.action.params.add()
            p.param_id, p.value = f.id, _canonical(v)

    def _read_counters(self, req: p4runtime_pb2.CounterEntry) -> Iterator[p4runtime_pb2.Entity]:
        if req.counter_id == 0:
            counters = sorted(self._schema.counters.items())
        else:
            counters = [(req.counter_id, self._counter(req.counter_id))]
        for cid, (name, size) in counters:
            if req.HasField("index"):
                index = req.index.index
                if index < 0:
                    raise _fail(Code.INVALID_ARGUMENT, "A negative number is not a valid index value")
                if index >= size:
                    raise _fail(Code.OUT_OF_RANGE, f"Index {index} is out of range for counter {name} of size {size}")
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

    def _read_pre(self, req: p4runtime_pb2.PacketReplicationEngineEntry) -> Iterator[p4runtime_pb2.Entity]:
        kind = req.WhichOneof("type")
        if kind == "clone_session_entry":
            if req.clone_session_entry.session_id:
                raise _fail(Code.NOT_FOUND, f"Clone session {req.clone_session_entry.session_id} does not exist")
            return  # no clone sessions can exist here
        if kind != "multicast_group_entry":
            raise _fail(Code.INVALID_ARGUMENT, "Invalid PRE operation")
        gid = req.multicast_group_entry.multicast_group_id
        if gid >= FIRST_RESERVED_GROUP:
            raise _fail(Code.OUT_OF_RANGE, f"Group id value {gid} is too high (at most {FIRST_RESERVED_GROUP - 1})")
        with self.pipeline.lock:
            groups = dict(self.pipeline.multicast_groups)
        if gid:
            if gid not in groups:
                raise _fail(Code.NOT_FOUND, f"Multicast group {gid} does not exist")
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
                for port, rid in sorted(replicas, key=lambda pr: (pr[1], pr[0])):  # PI: by instance, then port
                    r = entry.replicas.add()
                    r.egress_port, r.instance = port, rid
            yield out

    @staticmethod
    def _replica_key(r: p4runtime_pb2.Replica) -> tuple[int, int]:
        port = int.from_bytes(r.port, "big") if r.WhichOneof("port_kind") == "port" else r.egress_port
        return port, r.instance


class _Service(p4runtime_pb2_grpc.P4RuntimeServicer):
    """The gRPC face of a P4RuntimeServer: every RPC maps a P4RuntimeFailure to its status code and message."""

    def __init__(self, server: P4RuntimeServer):
        self._s = server

    @staticmethod
    def _abort(context, f: P4RuntimeFailure, rpc: str):
        logger.info("P4Runtime %s refused: %s: %s", rpc, f.code.name, f.message)
        context.abort(f.code, f.message)

    def Write(self, request, context):
        try:
            return self._s._write(request, context)
        except P4RuntimeFailure as f:
            self._abort(context, f, "Write")

    def Read(self, request, context):
        try:
            yield from self._s._read(request, context)
        except P4RuntimeFailure as f:
            self._abort(context, f, "Read")

    def SetForwardingPipelineConfig(self, request, context):
        try:
            self._s._set_pipeline(request)
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        except P4RuntimeFailure as f:
            self._abort(context, f, "SetForwardingPipelineConfig")

    def GetForwardingPipelineConfig(self, request, context):
        try:
            return self._s._get_pipeline(request)
        except P4RuntimeFailure as f:
            self._abort(context, f, "GetForwardingPipelineConfig")

    def StreamChannel(self, request_iterator, context):
        yield from self._s._stream(request_iterator, context)

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)
