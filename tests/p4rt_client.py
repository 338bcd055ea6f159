"""A small P4Runtime client over the raw stubs, for driving ina-switch and BMv2 alike from tests.

Control is by P4Info names with the same method names and value shapes as ``tests.targets.ModelTarget``
(exact match: int; LPM match: ``(value, prefix_len)``; parameters: ints), so a process-level target can
forward its control methods here. Values go out zero-padded to the field width, which every PI version
accepts (newer ones take the canonical shortest form too).

    with P4RuntimeTestClient("127.0.0.1:9559", device_id=1, election_id=1, device_config=b"") as sw:
        sw.insert_entry("MyIngress.ina_job", (7,), "MyIngress.set_job", (0, 8, 0b11, 2, 8, 0))
        sw.set_multicast_group(8, [(1, 0), (2, 1)])
        sw.read_counter("MyIngress.ina_aggregated", 7)
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path

import grpc
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

P4INFO_PATH = Path(__file__).resolve().parent.parent / "p4src" / "ina.p4info.txt"
VERIFY_AND_COMMIT = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT


class P4RuntimeError(Exception):
    """A failed P4Runtime RPC: the gRPC status code, its message and, for a Write, one (index, code name,
    message) per failed update, parsed from the ``grpc-status-details-bin`` trailer."""

    def __init__(self, err: grpc.RpcError, what: str):
        self.code: grpc.StatusCode = err.code()
        self.message: str = err.details() or ""
        self.errors: list[tuple[int, str, str]] = []
        for key, value in err.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = status_pb2.Status.FromString(value)
                for i, detail in enumerate(status.details):
                    e = p4runtime_pb2.Error()
                    detail.Unpack(e)
                    if e.canonical_code != code_pb2.OK:
                        self.errors.append((i, code_pb2.Code.Name(e.canonical_code), e.message))
        text = f"{what}: {self.code.name}: {self.message}"
        if self.errors:
            text += "".join(f"\n  update {i}: {c}: {m}" for i, c, m in self.errors)
        super().__init__(text)


def _encode(value: int, bitwidth: int) -> bytes:
    return int(value).to_bytes((bitwidth + 7) // 8, "big")


class P4InfoIndex:
    """One program's P4Info by name, and P4Runtime messages built from names and ints (no connection needed)."""

    def __init__(self, p4info: str | Path | p4info_pb2.P4Info = P4INFO_PATH):
        if not isinstance(p4info, p4info_pb2.P4Info):
            p4info = text_format.Parse(Path(p4info).read_text(), p4info_pb2.P4Info())
        self.p4info = p4info
        self.tables = {t.preamble.name: t for t in p4info.tables}
        self.actions = {a.preamble.name: a for a in p4info.actions}
        self.actions_by_id = {a.preamble.id: a for a in p4info.actions}
        self.counters = {c.preamble.name: c for c in p4info.counters}
        headers = {h.preamble.name: h for h in p4info.controller_packet_metadata}
        self.packet_out = {m.name: m for m in headers["packet_out"].metadata} if "packet_out" in headers else {}
        self.packet_in = {m.id: m for m in headers["packet_in"].metadata} if "packet_in" in headers else {}

    def table_entry(self, table: str, match: tuple | None, action: str | None = None,
                    params: tuple[int, ...] = ()) -> p4runtime_pb2.TableEntry:
        """A TableEntry by names; ``match=None`` is the table's default entry."""
        t = self.tables[table]
        te = p4runtime_pb2.TableEntry(table_id=t.preamble.id)
        if match is None:
            te.is_default_action = True
        else:
            if len(match) != len(t.match_fields):
                raise ValueError(f"{table} has {len(t.match_fields)} match fields, got {len(match)}")
            for mf, value in zip(t.match_fields, match):
                if mf.match_type == p4info_pb2.MatchField.LPM:
                    v, plen = value
                    if plen == 0:
                        continue  # "don't care": the field is omitted
                    fm = te.match.add(field_id=mf.id)
                    fm.lpm.value, fm.lpm.prefix_len = _encode(v, mf.bitwidth), plen
                else:
                    fm = te.match.add(field_id=mf.id)
                    fm.exact.value = _encode(value, mf.bitwidth)
        if action is not None:
            a = self.actions[action]
            if len(params) != len(a.params):
                raise ValueError(f"{action} takes {len(a.params)} parameters, got {len(params)}")
            te.action.action.action_id = a.preamble.id
            for p, value in zip(a.params, params):
                te.action.action.params.add(param_id=p.id, value=_encode(value, p.bitwidth))
        return te


class P4RuntimeTestClient:
    """One P4Runtime client: a stream that wins primary arbitration, Write/Read by P4Info names, packet I/O.

    Args:
        address: ``host:port`` of the P4Runtime server.
        device_id: the device id the switch was started with.
        election_id: an int or ``(high, low)``; must be the highest among the switch's clients to write.
        p4info: the P4Info (text file or message) names and ids come from (the committed one by default).
        device_config: if not None, push ``p4info`` with this device config (bytes or a path; ``b""`` for an
            empty one) by SetForwardingPipelineConfig(VERIFY_AND_COMMIT) once primary: BMv2 needs that even
            when started with a JSON, and it resets the switch's tables.
        timeout: seconds to wait for arbitration and for each RPC.

    Raises P4RuntimeError on a failed RPC, RuntimeError if nothing answers at ``address`` within ``timeout`` or
    the client does not become primary.
    """

    def __init__(
        self,
        address: str,
        device_id: int,
        election_id: int | tuple[int, int] = 1,
        *,
        p4info: str | Path | p4info_pb2.P4Info = P4INFO_PATH,
        device_config: bytes | str | Path | None = None,
        timeout: float = 5.0,
    ):
        self.address = address
        self.device_id = device_id
        if isinstance(election_id, tuple):
            self.election_id = (int(election_id[0]), int(election_id[1]))
        else:
            self.election_id = (int(election_id) >> 64, int(election_id) & ((1 << 64) - 1))
        self.timeout = timeout
        self.names = P4InfoIndex(p4info)
        self.p4info = self.names.p4info
        self._groups: set[int] = set()

        self.channel = grpc.insecure_channel(address)
        try:  # a switch process may still be starting: wait for it as long as for anything else
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise RuntimeError(f"no P4Runtime server answers at {address} within {timeout} s") from None
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._out: queue.Queue = queue.Queue()
        self.arbitration: queue.Queue = queue.Queue()  # MasterArbitrationUpdate responses
        self.packet_ins: queue.Queue = queue.Queue()  # PacketIn messages
        self.stream_errors: queue.Queue = queue.Queue()  # StreamError messages
        self._stream = self.stub.StreamChannel(iter(self._out.get, None))
        self._reader = threading.Thread(target=self._read_stream, name="p4rt-client", daemon=True)
        self._reader.start()
        try:
            self._become_primary()
            if device_config is not None:
                if isinstance(device_config, (str, Path)):
                    device_config = Path(device_config).read_bytes()
                self.set_forwarding_pipeline(device_config)
        except BaseException:
            self.close()
            raise

    # --- stream -------------------------------------------------------------------------------------------
    def _read_stream(self) -> None:
        try:
            for msg in self._stream:
                kind = msg.WhichOneof("update")
                if kind == "arbitration":
                    self.arbitration.put(msg.arbitration)
                elif kind == "packet":
                    self.packet_ins.put(msg.packet)
                elif kind == "error":
                    self.stream_errors.put(msg.error)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.arbitration.put(e)

    def _become_primary(self) -> None:
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.election_id
        self._out.put(req)
        try:
            rep = self.arbitration.get(timeout=self.timeout)
        except queue.Empty:
            raise RuntimeError(f"no arbitration response from {self.address} within {self.timeout} s") from None
        if isinstance(rep, grpc.RpcError):
            raise P4RuntimeError(rep, "StreamChannel arbitration")
        if rep.status.code != code_pb2.OK:
            raise RuntimeError(
                f"not primary on {self.address}: {rep.status.message} (primary's election id "
                f"({rep.election_id.high}, {rep.election_id.low}), ours {self.election_id})")

    def send_packet_out(self, payload: bytes, egress_port: int, **metadata: int) -> None:
        """A PacketOut to ``egress_port`` (other packet_out metadata by name, default 0)."""
        msg = p4runtime_pb2.StreamMessageRequest()
        msg.packet.payload = payload
        values = {"egress_port": egress_port, **metadata}
        for name, md in self.names.packet_out.items():
            m = msg.packet.metadata.add()
            m.metadata_id, m.value = md.id, _encode(values.get(name, 0), md.bitwidth)
        self._out.put(msg)

    def receive_packet_in(self, timeout: float = 2.0) -> tuple[dict[str, int], bytes] | None:
        """The next PacketIn as ({metadata name: value}, payload), or None after ``timeout`` seconds."""
        try:
            pkt = self.packet_ins.get(timeout=timeout)
        except queue.Empty:
            return None
        md = {self.names.packet_in[m.metadata_id].name: int.from_bytes(m.value, "big") for m in pkt.metadata}
        return md, pkt.payload

    # --- RPC helpers --------------------------------------------------------------------------------------
    def _election(self, req) -> None:
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id

    def set_forwarding_pipeline(self, device_config: bytes = b"", action: int = VERIFY_AND_COMMIT) -> None:
        """Push the P4Info with ``device_config`` (VERIFY_AND_COMMIT resets the switch's state)."""
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(action=action)
        self._election(req)
        req.config.p4info.CopyFrom(self.p4info)
        req.config.p4_device_config = device_config
        try:
            self.stub.SetForwardingPipelineConfig(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise P4RuntimeError(e, "SetForwardingPipelineConfig") from None
        self._groups.clear()

    def write(self, *updates: p4runtime_pb2.Update) -> None:
        req = p4runtime_pb2.WriteRequest()
        self._election(req)
        req.updates.extend(updates)
        try:
            self.stub.Write(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise P4RuntimeError(e, "Write") from None

    def read(self, *entities: p4runtime_pb2.Entity) -> list[p4runtime_pb2.Entity]:
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        req.entities.extend(entities)
        try:
            return [e for rep in self.stub.Read(req, timeout=self.timeout) for e in rep.entities]
        except grpc.RpcError as e:
            raise P4RuntimeError(e, "Read") from None

    def table_entry(self, table: str, match: tuple | None, action: str | None = None,
                    params: tuple[int, ...] = ()) -> p4runtime_pb2.TableEntry:
        """A TableEntry by names; ``match=None`` is the table's default entry."""
        return self.names.table_entry(table, match, action, params)

    def _update(self, kind: int, entity_field: str, msg) -> p4runtime_pb2.Update:
        u = p4runtime_pb2.Update(type=kind)
        getattr(u.entity, entity_field).CopyFrom(msg)
        return u

    # --- the Target control methods (same names and shapes as tests.targets.ModelTarget) ------------------
    def insert_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None:
        self.write(self._update(p4runtime_pb2.Update.INSERT, "table_entry", self.table_entry(table, match, action, params)))

    def modify_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None:
        self.write(self._update(p4runtime_pb2.Update.MODIFY, "table_entry", self.table_entry(table, match, action, params)))

    def delete_entry(self, table: str, match: tuple) -> None:
        self.write(self._update(p4runtime_pb2.Update.DELETE, "table_entry", self.table_entry(table, match)))

    def set_default_action(self, table: str, action: str, params: tuple[int, ...] = ()) -> None:
        self.write(self._update(p4runtime_pb2.Update.MODIFY, "table_entry", self.table_entry(table, None, action, params)))

    def set_multicast_group(self, group: int, replicas: list[tuple[int, int]]) -> None:
        """Create or replace multicast group ``group`` with (egress port, instance) replicas."""
        pre = p4runtime_pb2.PacketReplicationEngineEntry()
        pre.multicast_group_entry.multicast_group_id = group
        for port, rid in replicas:
            pre.multicast_group_entry.replicas.add(egress_port=port, instance=rid)
        kind = p4runtime_pb2.Update.MODIFY if group in self._groups else p4runtime_pb2.Update.INSERT
        try:
            self.write(self._update(kind, "packet_replication_engine_entry", pre))
        except P4RuntimeError as e:
            codes = {c for _, c, _ in e.errors}
            if codes == {"ALREADY_EXISTS"}:
                kind = p4runtime_pb2.Update.MODIFY
            elif codes == {"NOT_FOUND"}:
                kind = p4runtime_pb2.Update.INSERT
            else:
                raise
            self.write(self._update(kind, "packet_replication_engine_entry", pre))
        self._groups.add(group)

    def delete_multicast_group(self, group: int) -> None:
        pre = p4runtime_pb2.PacketReplicationEngineEntry()
        pre.multicast_group_entry.multicast_group_id = group
        self.write(self._update(p4runtime_pb2.Update.DELETE, "packet_replication_engine_entry", pre))
        self._groups.discard(group)

    def read_counter(self, name: str, index: int) -> int:
        """Packets counted at ``index`` of counter ``name``."""
        e = p4runtime_pb2.Entity()
        e.counter_entry.counter_id = self.names.counters[name].preamble.id
        e.counter_entry.index.index = index
        (got,) = self.read(e)
        return got.counter_entry.data.packet_count

    def read_table(self, table: str) -> list[tuple[tuple, str, tuple[int, ...]]]:
        """Every entry of ``table`` as (match, action, params), in the shapes insert_entry takes."""
        t = self.names.tables[table]
        e = p4runtime_pb2.Entity()
        e.table_entry.table_id = t.preamble.id
        out = []
        for got in self.read(e):
            te = got.table_entry
            given = {fm.field_id: fm for fm in te.match}
            match = []
            for mf in t.match_fields:
                fm = given.get(mf.id)
                if mf.match_type == p4info_pb2.MatchField.LPM:
                    match.append((int.from_bytes(fm.lpm.value, "big"), fm.lpm.prefix_len) if fm else (0, 0))
                else:
                    match.append(int.from_bytes(fm.exact.value, "big"))
            a = self.names.actions_by_id[te.action.action.action_id]
            values = {p.param_id: int.from_bytes(p.value, "big") for p in te.action.action.params}
            out.append((tuple(match), a.preamble.name, tuple(values[p.id] for p in a.params)))
        return out

    # --- lifecycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """End the stream (the switch then elects another primary) and the channel."""
        self._out.put(None)
        self._reader.join(timeout=self.timeout)
        self.channel.close()

    def __enter__(self) -> "P4RuntimeTestClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
