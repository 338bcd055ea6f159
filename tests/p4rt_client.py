"""The tests' P4Runtime clients: by-name control through the project's one client, and raw stubs.

:class:`P4RuntimeTestClient` controls a switch by P4Info names with the same method names and value shapes as
``tests.targets.ModelTarget`` (exact match: int; LPM match: ``(value, prefix_len)``; parameters: ints), so a
process-level target can forward its control methods here. It is a thin adapter over
``controller.switch.Switch``, the client the controller itself uses (errors are ``SwitchError``).

:class:`RawStub` sends hand-made (often malformed) requests straight through the gRPC stubs, for the tests that
hold ina-switch's P4Runtime server to what PI answers; :func:`table_entry` builds the messages they start from.

    with P4RuntimeTestClient("127.0.0.1:9559", device_id=1, election_id=1, device_config=b"") as sw:
        sw.insert_entry("MyIngress.ina_job", (7,), "MyIngress.set_job", (0, 8, 0b11, 2, 8, 0))
        sw.set_multicast_group(8, [(1, 0), (2, 1)])
        sw.read_counter("MyIngress.ina_aggregated", 7)
        sw.raw.write(update)  # the same session's election id, no checks on the client side
"""
from __future__ import annotations

from pathlib import Path
from typing import Self

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4entity import MulticastGroup, Schema, TableEntry
from controller.switch import Switch, SwitchError, SwitchOptions, update_errors
from p4src.p4info import P4INFO_PATH, load_p4info

VERIFY_AND_COMMIT = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
SCHEMA = Schema(load_p4info())


class P4RuntimeError(SwitchError):
    """A failed raw RPC, as ``SwitchError`` (which the by-name client raises) reports it: gRPC status code,
    details and, for a Write, one (index, code name, message) per failed update."""

    def __init__(self, err: grpc.RpcError, what: str):
        super().__init__("raw", what, err.code(), err.details() or "", update_errors(err))


def table_entry(table: str, match: tuple | None, action: str | None = None, params: tuple[int, ...] = (),
                schema: Schema = SCHEMA) -> p4runtime_pb2.TableEntry:
    """A TableEntry message by names, unchecked (values zero-padded to their field width, even ones that do
    not fit it): ``match=None`` is the table's default entry, ``action=None`` leaves the action out."""
    t = schema.table(table)
    te = p4runtime_pb2.TableEntry(table_id=t.preamble.id, is_default_action=match is None)
    for mf, value in zip(t.match_fields, match or ()):
        if mf.match_type == p4info_pb2.MatchField.LPM:
            v, plen = value
            if plen:  # a /0 ("don't care") field is omitted
                te.match.add(field_id=mf.id).lpm.CopyFrom(p4runtime_pb2.FieldMatch.LPM(value=_padded(v, mf.bitwidth), prefix_len=plen))
        else:
            te.match.add(field_id=mf.id).exact.value = _padded(value, mf.bitwidth)
    if action is not None:
        a = schema.action(action)
        te.action.action.action_id = a.preamble.id
        for p, value in zip(a.params, params):
            te.action.action.params.add(param_id=p.id, value=_padded(value, p.bitwidth))
    return te


def _padded(value: int, bitwidth: int) -> bytes:
    return int(value).to_bytes(max((bitwidth + 7) // 8, (int(value).bit_length() + 7) // 8), "big")


def update(kind: int, entity: p4runtime_pb2.TableEntry | p4runtime_pb2.PacketReplicationEngineEntry) -> p4runtime_pb2.Update:
    """An Update of one table entry or PRE entry."""
    u = p4runtime_pb2.Update(type=kind)
    field = "table_entry" if isinstance(entity, p4runtime_pb2.TableEntry) else "packet_replication_engine_entry"
    getattr(u.entity, field).CopyFrom(entity)
    return u


class RawStub:
    """Requests exactly as given, through the raw P4Runtime stubs, with one device id and election id."""

    def __init__(self, address: str, device_id: int, election_id: tuple[int, int], p4info: p4info_pb2.P4Info,
                 timeout: float = 5.0):
        self.device_id, self.election_id, self.p4info, self.timeout = device_id, election_id, p4info, timeout
        self.channel = grpc.insecure_channel(address)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)

    def _election(self, req) -> None:
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id

    def set_forwarding_pipeline(self, device_config: bytes = b"", action: int = VERIFY_AND_COMMIT) -> None:
        """Push the P4Info with ``device_config`` (no cookie; VERIFY_AND_COMMIT resets the switch's state)."""
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(action=action)
        self._election(req)
        req.config.p4info.CopyFrom(self.p4info)
        req.config.p4_device_config = device_config
        try:
            self.stub.SetForwardingPipelineConfig(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise P4RuntimeError(e, "SetForwardingPipelineConfig") from None

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

    def close(self) -> None:
        self.channel.close()


class P4RuntimeTestClient:
    """A primary session with one switch (``controller.switch.Switch``), controlled by P4Info names.

    Args:
        address: ``host:port`` of the P4Runtime server.
        device_id: the device id the switch was started with.
        election_id: an int or ``(high, low)``; must be the highest among the switch's clients to write.
        p4info: the P4Info (text file or message) names and ids come from (the committed one by default).
        device_config: if not None, push ``p4info`` with this device config (bytes or a path; ``b""`` for an
            empty one) by SetForwardingPipelineConfig(VERIFY_AND_COMMIT) once primary: BMv2 needs that even
            when started with a JSON, and it resets the switch's tables.
        timeout: seconds to wait for arbitration and for each RPC.

    Raises SwitchError on a failed RPC (or if nothing answers at ``address`` within ``timeout``), RuntimeError
    if the client does not become primary.
    """

    def __init__(self, address: str, device_id: int, election_id: int | tuple[int, int] = 1, *,
                 p4info: str | Path | p4info_pb2.P4Info = P4INFO_PATH,
                 device_config: bytes | str | Path | None = None, timeout: float = 5.0):
        if isinstance(election_id, tuple):
            self.election_id = (int(election_id[0]), int(election_id[1]))
        else:
            self.election_id = (int(election_id) >> 64, int(election_id) & ((1 << 64) - 1))
        self.p4info = p4info if isinstance(p4info, p4info_pb2.P4Info) else load_p4info(p4info)
        self.schema = Schema(self.p4info)
        self.switch = Switch(SwitchOptions(f"device {device_id}", address, device_id, self.election_id,
                                           connect_timeout=timeout, rpc_timeout=timeout), self.schema)
        self.raw = RawStub(address, device_id, self.election_id, self.p4info, timeout)
        self._groups: set[int] = set()
        try:
            if not self.switch.connect():
                raise RuntimeError(f"not primary on {address}: primary's election id "
                                   f"{self.switch.primary_election_id}, ours {self.election_id}")
            if device_config is not None:
                if isinstance(device_config, (str, Path)):
                    device_config = Path(device_config).read_bytes()
                self.set_forwarding_pipeline(device_config)
        except BaseException:
            self.close()
            raise

    def set_forwarding_pipeline(self, device_config: bytes = b"", action: int = VERIFY_AND_COMMIT) -> None:
        """Push the P4Info with ``device_config`` (VERIFY_AND_COMMIT resets the switch's state)."""
        self.switch.push_pipeline(self.p4info, device_config, action=action)
        self._groups.clear()

    # --- the Target control methods (same names and shapes as tests.targets.ModelTarget) ------------------
    def insert_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None:
        self.switch.insert(self.schema.entry(table, tuple(match), action, tuple(params)))

    def modify_entry(self, table: str, match: tuple, action: str, params: tuple[int, ...] = ()) -> None:
        self.switch.modify(self.schema.entry(table, tuple(match), action, tuple(params)))

    def set_default_action(self, table: str, action: str, params: tuple[int, ...] = ()) -> None:
        self.switch.modify(TableEntry(table, (), action, tuple(params), 0, True))

    def set_multicast_group(self, group: int, replicas: list[tuple[int, int]]) -> None:
        """Create or replace multicast group ``group`` with (egress port, instance) replicas."""
        g = MulticastGroup(group, tuple(replicas))
        write = self.switch.modify if group in self._groups else self.switch.insert
        try:
            write(g)
        except SwitchError as e:
            codes = {c for _, c, _ in e.errors}
            if codes == {"ALREADY_EXISTS"}:
                self.switch.modify(g)
            elif codes == {"NOT_FOUND"}:
                self.switch.insert(g)
            else:
                raise
        self._groups.add(group)

    def read_counter(self, name: str, index: int) -> int:
        """Packets counted at ``index`` of counter ``name``."""
        return self.switch.read_counter(name, index)[index]

    def read_table(self, table: str) -> list[tuple[tuple, str, tuple[int, ...]]]:
        """Every entry of ``table`` as (match, action, params), in the shapes insert_entry takes."""
        return [(e.match, e.action, e.params) for e in self.switch.read_table(table)]

    # --- packet I/O -----------------------------------------------------------------------------------------
    def send_packet_out(self, payload: bytes, egress_port: int, **metadata: int) -> None:
        """A PacketOut to ``egress_port`` (other packet_out metadata by name, default 0)."""
        self.switch.send_packet_out(payload, egress_port=egress_port, **metadata)

    def receive_packet_in(self, timeout: float = 2.0) -> tuple[dict[str, int], bytes] | None:
        """The next PacketIn as ({metadata name: value}, payload), or None after ``timeout`` seconds."""
        return self.switch.receive_packet_in(timeout)

    # --- lifecycle ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """End the stream (the switch then elects another primary) and the channels."""
        self.switch.close()
        self.raw.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
