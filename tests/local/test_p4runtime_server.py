"""The P4Runtime service of ina-switch, driven as BMv2 is: by p4runtime-shell and by the raw gRPC stubs.

Every test starts its own server in-process on 127.0.0.1:0; nothing needs root.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.switch import SwitchError
from inaproto import wire
from inaproto.scapy_layer import INA
from p4src import tables as model
from p4src.ina_model import InaPipeline
from p4src.p4info import P4INFO_PATH, load_p4info
from softswitch.p4program import device_config_mismatch, p4info_mismatch
from softswitch.p4runtime_server import P4RuntimeServer
from tests.p4rt_client import P4RuntimeTestClient, table_entry
from tests.p4rt_malformed import BMV2 as BMV2_ANSWERS
from tests.p4rt_malformed import CASES as MALFORMED
from tests.p4rt_malformed import answer as malformed_answer
from tests.p4rt_malformed import check_unharmed
from tests.support.entries import install_job
from tests.support.frames import dissect, gradient, make_workers

DEVICE = 1
SetConfig = p4runtime_pb2.SetForwardingPipelineConfigRequest
Update = p4runtime_pb2.Update


def _start(**kwargs) -> SimpleNamespace:
    pipeline = InaPipeline()
    emitted: list[tuple[int, bytes]] = []
    server = P4RuntimeServer(pipeline, device_id=DEVICE, address="127.0.0.1:0", cpu_port=wire.CPU_PORT,
                             emit=emitted.extend, **kwargs)
    port = server.start()
    return SimpleNamespace(server=server, pipeline=pipeline, address=f"127.0.0.1:{port}", emitted=emitted)


@pytest.fixture
def switch():
    """A switch with no pipeline config yet, as simple_switch_grpc --no-p4."""
    sw = _start()
    yield sw
    sw.server.stop(0)


@pytest.fixture
def loaded():
    """A switch started with the program's P4Info, as simple_switch_grpc started with a JSON."""
    sw = _start(initial_p4info=load_p4info())
    yield sw
    sw.server.stop(0)


def _stub(sw) -> p4runtime_pb2_grpc.P4RuntimeStub:
    return p4runtime_pb2_grpc.P4RuntimeStub(grpc.insecure_channel(sw.address))


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _details(err: grpc.RpcError) -> list[p4runtime_pb2.Error]:
    """The per-update p4.v1.Error list of a failed Write, from the grpc-status-details-bin trailer."""
    (raw,) = [v for k, v in err.trailing_metadata() if k == "grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    assert status.code == code_pb2.UNKNOWN
    out = []
    for d in status.details:
        e = p4runtime_pb2.Error()
        assert d.Unpack(e)
        out.append(e)
    return out


class Stream:
    """A raw StreamChannel: sends one arbitration update, collects everything the server streams back."""

    def __init__(self, sw, election_id: int, device_id: int = DEVICE, role: str | None = None):
        self.channel = grpc.insecure_channel(sw.address)
        self.out: queue.Queue = queue.Queue()
        self.inbox: queue.Queue = queue.Queue()
        self.call = p4runtime_pb2_grpc.P4RuntimeStub(self.channel).StreamChannel(iter(self.out.get, None))
        threading.Thread(target=self._read, daemon=True).start()
        self.arbitrate(election_id, device_id, role)

    def _read(self):
        try:
            for msg in self.call:
                self.inbox.put(msg)
        except grpc.RpcError as e:
            self.inbox.put(e)

    def arbitrate(self, election_id: int, device_id: int = DEVICE, role: str | None = None):
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = device_id
        req.arbitration.election_id.low = election_id
        if role is not None:
            req.arbitration.role.name = role
        self.out.put(req)

    def next(self, timeout: float = 2.0):
        return self.inbox.get(timeout=timeout)

    def arbitration(self) -> tuple[int, int]:
        """(status code, primary's election id) of the next arbitration message."""
        msg = self.next()
        assert isinstance(msg, p4runtime_pb2.StreamMessageResponse) and msg.HasField("arbitration"), msg
        return msg.arbitration.status.code, msg.arbitration.election_id.low

    def quiet(self, timeout: float = 0.2) -> bool:
        try:
            self.inbox.get(timeout=timeout)
        except queue.Empty:
            return True
        return False

    def close(self):
        self.out.put(None)
        self.channel.close()


def _write(sw, client: P4RuntimeTestClient, *updates, election_id: int | None = None) -> None:
    req = p4runtime_pb2.WriteRequest(device_id=DEVICE)
    req.election_id.low = client.election_id[1] if election_id is None else election_id
    req.updates.extend(updates)
    _stub(sw).Write(req, timeout=5)


def _upd(kind: int, te: p4runtime_pb2.TableEntry) -> p4runtime_pb2.Update:
    u = Update(type=kind)
    u.entity.table_entry.CopyFrom(te)
    return u


JOB = ("MyIngress.ina_job", (5,), "MyIngress.set_job", (0, 8, 0b11, 2, 6, 0, 0))


# --- p4runtime-shell as the client ---------------------------------------------------------------------------


@pytest.fixture
def shell(switch, tmp_path):
    import p4runtime_sh.shell as sh

    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    sh.setup(device_id=DEVICE, grpc_addr=switch.address, election_id=(0, 1),
             config=sh.FwdPipeConfig(str(P4INFO_PATH), str(empty)), verbose=False)
    try:
        yield sh
    finally:
        sh.teardown()


def test_p4runtime_shell_tables_counters_groups(switch, shell):
    sh = shell
    assert sh.APIVersion() == "1.4.1"
    te = sh.TableEntry("MyIngress.ina_job")(action="MyIngress.set_job")
    te.match["hdr.ina.job_id"] = "5"
    for name, value in zip(("base_slot", "num_slots", "worker_mask", "num_workers", "mcast_grp", "generation", "owner_epoch"), JOB[3]):
        te.action[name] = str(value)
    te.insert()
    lpm = sh.TableEntry("MyIngress.ipv4_lpm")(action="MyIngress.ipv4_forward")
    lpm.match["hdr.ipv4.dstAddr"] = "10.0.1.0/24"
    lpm.action["dstAddr"] = "02:00:00:00:00:01"
    lpm.action["port"] = "3"
    lpm.insert()
    assert switch.pipeline.tables["MyIngress.ina_job"].entries[(5,)].params == JOB[3]
    assert ((0x0A000100, 24),) in switch.pipeline.tables["MyIngress.ipv4_lpm"].entries

    (got,) = list(sh.TableEntry("MyIngress.ina_job").read())
    assert got.match["hdr.ina.job_id"].exact.value == b"\x05"
    assert [p.value for p in got.action.msg().params] == [b"\x00", b"\x08", b"\x03", b"\x02", b"\x06", b"\x00", b"\x00"]
    (got,) = list(sh.TableEntry("MyIngress.ipv4_lpm").read())
    assert (got.match["hdr.ipv4.dstAddr"].lpm.value, got.match["hdr.ipv4.dstAddr"].lpm.prefix_len) == (bytes([10, 0, 1, 0]), 24)

    # Default entry: read, set, reset.
    (d,) = list(sh.TableEntry("MyIngress.ipv4_lpm")(is_default=True).read())
    assert d.action.action_name == "MyIngress.drop"
    sh.TableEntry("MyIngress.ipv4_lpm")(is_default=True, action="NoAction").modify()
    assert switch.pipeline.tables["MyIngress.ipv4_lpm"].default == ("NoAction", ())

    from p4runtime_sh.p4runtime import P4RuntimeWriteException

    with pytest.raises(P4RuntimeWriteException) as info:
        te.insert()
    ((index, error),) = info.value.errors
    assert index == 0 and error.canonical_code == code_pb2.ALREADY_EXISTS and "exists" in error.message

    # Counters: a frame for an unknown job counts one UNKNOWN_JOB drop.
    w = make_workers(1)[0]
    assert switch.pipeline.process(1, gradient(w, 9, 0, [1] * wire.LANES)) == []
    c = sh.CounterEntry("MyIngress.ina_drops")
    c.index = int(wire.DropReason.UNKNOWN_JOB)
    (got,) = list(c.read())
    assert got.packet_count == 1
    every = list(sh.CounterEntry("MyIngress.ina_drops").read())
    assert [e.index for e in every] == list(range(wire.NUM_DROP_REASONS))
    assert [e.packet_count for e in every] == switch.pipeline.counter("MyIngress.ina_drops")

    # Multicast groups.
    sh.MulticastGroupEntry(6).add(1, 0).add(2, 1).insert()
    assert sorted(switch.pipeline.multicast_groups[6]) == [(1, 0), (2, 1)]
    (g,) = list(sh.MulticastGroupEntry(0).read())
    assert g.group_id == 6 and [(r.egress_port, r.instance) for r in g.replicas] == [(1, 0), (2, 1)]
    sh.MulticastGroupEntry(6).add(3, 0).modify()
    assert switch.pipeline.multicast_groups[6] == ((3, 0),)
    sh.MulticastGroupEntry(6).delete()
    assert 6 not in switch.pipeline.multicast_groups


def test_p4runtime_shell_packet_out_and_in(switch, shell):
    sh = shell
    frame = bytes.fromhex("020000000003" "020000000001" "88b5") + b"hello"  # not IPv4: the pipeline leaves it as it is
    sh.PacketOut(frame, egress_port="3").send()
    deadline = time.time() + 2
    while not switch.emitted and time.time() < deadline:
        time.sleep(0.01)
    assert switch.emitted == [(3, frame)]

    pin = sh.PacketIn()
    # A packet-out to the CPU port comes back as a packet-in from the CPU port.
    sh.PacketOut(frame, egress_port=str(wire.CPU_PORT)).send()
    # An IPv4 frame that ipv4_lpm sends to the CPU comes in with its ingress port.
    lpm = sh.TableEntry("MyIngress.ipv4_lpm")(action="MyIngress.send_to_cpu")
    lpm.match["hdr.ipv4.dstAddr"] = "10.0.9.0/24"
    lpm.insert()
    w = make_workers(1)[0]
    ip_frame = bytearray(gradient(w, 1, 0, [0] * wire.LANES))
    ip_frame[wire.ETH_LEN + 16:wire.ETH_LEN + 20] = bytes([10, 0, 9, 7])  # to 10.0.9.7
    ip = wire.ETH_LEN
    ip_frame[ip + 10:ip + 12] = b"\x00\x00"
    ip_frame[ip + 10:ip + 12] = wire.ipv4_checksum(bytes(ip_frame[ip:ip + 20])).to_bytes(2, "big")
    ip_frame[wire.ETH_LEN + 22:wire.ETH_LEN + 24] = b"\x1f\x90"  # not the INA port: plain IPv4 forwarding
    ((port, out),) = switch.pipeline.process(4, bytes(ip_frame))
    assert port == wire.CPU_PORT
    switch.server.send_packet_in(out)

    # The two packet-ins come from two sources (the stream's own packet-out path and the data plane): the
    # server promises no order between them, so they are matched by their ingress-port metadata (id 1).
    msgs = []
    deadline = time.monotonic() + 10
    while len(msgs) < 2 and time.monotonic() < deadline:
        msgs += [m.packet for m in pin.sniff(timeout=0.1)]
    by_port = {next(md.value for md in m.metadata if md.metadata_id == 1): m for m in msgs}
    assert len(msgs) == 2 and set(by_port) == {bytes([wire.CPU_PORT]), b"\x04"}
    from_cpu, from_lpm = by_port[bytes([wire.CPU_PORT])], by_port[b"\x04"]
    assert {m.metadata_id: m.value for m in from_cpu.metadata} == {1: bytes([wire.CPU_PORT]), 2: b"\x00"}
    assert from_cpu.payload == frame and from_lpm.payload == out[2:]
    assert switch.server.packets_in == 2


# --- raw stubs: arbitration ------------------------------------------------------------------------------


def test_arbitration_primary_backup_and_promotion(loaded):
    a = Stream(loaded, election_id=2)
    assert a.arbitration() == (code_pb2.OK, 2)
    b = Stream(loaded, election_id=1)
    assert b.arbitration() == (code_pb2.ALREADY_EXISTS, 2)  # backup; the primary's election id
    assert a.quiet(), "a new backup does not disturb the primary"

    client_b = SimpleNamespace(election_id=(0, 1))
    te = table_entry(*JOB)
    err = _code(lambda: _write(loaded, client_b, _upd(Update.INSERT, te)))
    assert err == grpc.StatusCode.PERMISSION_DENIED
    _write(loaded, client_b, _upd(Update.INSERT, te), election_id=2)  # the primary's election id works

    a.close()
    assert b.arbitration() == (code_pb2.OK, 1), "the backup is promoted and told so"
    _write(loaded, client_b, _upd(Update.DELETE, te))

    c = Stream(loaded, election_id=5)
    assert c.arbitration() == (code_pb2.OK, 5)
    assert b.arbitration() == (code_pb2.ALREADY_EXISTS, 5), "every client hears of a new primary"
    b.arbitrate(7)  # a backup raising its election id above the primary's takes over
    assert b.arbitration() == (code_pb2.OK, 7)
    assert c.arbitration() == (code_pb2.ALREADY_EXISTS, 7)
    b.close()
    c.close()


def test_arbitration_refusals(loaded):
    a = Stream(loaded, election_id=3)
    assert a.arbitration()[0] == code_pb2.OK
    dup = Stream(loaded, election_id=3)
    assert dup.next().code() == grpc.StatusCode.INVALID_ARGUMENT
    other = Stream(loaded, election_id=4, device_id=DEVICE + 1)
    err = other.next()
    assert err.code() == grpc.StatusCode.NOT_FOUND and str(DEVICE + 1) in err.details()
    role = Stream(loaded, election_id=4, role="aggregation")
    err = role.next()
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED and "role" in err.details().lower()
    a.arbitrate(3, device_id=DEVICE + 1)
    assert a.next().code() == grpc.StatusCode.FAILED_PRECONDITION
    for s in (a, dup, other, role):
        s.close()


def test_write_without_stream_follows_pi(loaded):
    te = table_entry(*JOB)
    req = p4runtime_pb2.WriteRequest(device_id=DEVICE)
    req.updates.add().CopyFrom(_upd(Update.INSERT, te))
    _stub(loaded).Write(req)  # no client holds a stream, no election id: accepted (PI's debugging rule)
    req.election_id.low = 1
    assert _code(lambda: _stub(loaded).Write(req)) == grpc.StatusCode.PERMISSION_DENIED
    req.device_id = DEVICE + 1
    assert _code(lambda: _stub(loaded).Write(req)) == grpc.StatusCode.NOT_FOUND


# --- raw stubs: Write errors -----------------------------------------------------------------------------


def test_batch_reports_one_error_per_update(loaded):
    from p4runtime_sh.p4runtime import P4RuntimeWriteException

    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        good = table_entry(*JOB)
        bad_action = table_entry(*JOB)
        bad_action.action.action.action_id = client.schema.action("MyEgress.set_worker_addr").preamble.id
        wide = table_entry("MyIngress.ina_job", (6,), *JOB[2:])
        wide.action.action.params[3].value = b"\x01\x00"  # num_workers is bit<8>
        missing = table_entry("MyIngress.ina_job", (6,), *JOB[2:])
        del missing.action.action.params[5]
        other = table_entry("MyIngress.ina_job", (7,), *JOB[2:])
        default = table_entry("MyIngress.ina_job", None, "NoAction")
        updates = [
            _upd(Update.INSERT, good),
            _upd(Update.INSERT, good),  # duplicate
            _upd(Update.DELETE, table_entry("MyIngress.ina_job", (99,))),  # missing
            _upd(Update.INSERT, bad_action),
            _upd(Update.INSERT, wide),
            _upd(Update.INSERT, missing),
            _upd(Update.INSERT, default),
            _upd(Update.INSERT, other),
        ]
        with pytest.raises(grpc.RpcError) as info:
            _write(loaded, client, *updates)
        err = info.value
        assert err.code() == grpc.StatusCode.UNKNOWN
        codes = [e.canonical_code for e in _details(err)]
        assert codes == [code_pb2.OK, code_pb2.ALREADY_EXISTS, code_pb2.NOT_FOUND, code_pb2.INVALID_ARGUMENT,
                         code_pb2.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT, code_pb2.OK]
        messages = [e.message for e in _details(err)]
        assert "set_worker_addr" in messages[3] and "8 bits" in messages[4] and "generation" in messages[5]
        assert "default" in messages[6]
        # p4runtime-shell reads the details as it reads BMv2's. (Its 0.0.6 parser loops forever on a batch that
        # has a successful update, whoever the server is: it only ever sends one update per Write itself.)
        with pytest.raises(grpc.RpcError) as info:
            _write(loaded, client, *updates[1:7])
        parsed = P4RuntimeWriteException(info.value)
        assert [(i, e.canonical_code) for i, e in parsed.errors] == list(enumerate(codes[1:7]))
        # CONTINUE_ON_ERROR: the good updates were applied.
        assert set(loaded.pipeline.tables["MyIngress.ina_job"].entries) == {(5,), (7,)}
        with pytest.raises(SwitchError) as info:
            client.insert_entry(*JOB)
        assert info.value.errors == [(0, "ALREADY_EXISTS", info.value.errors[0][2])]


def test_bytestrings_minimal_or_padded(loaded):
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        te = table_entry(*JOB)
        te.match[0].exact.value = b"\x00\x00\x00\x05"  # padded beyond the width: accepted
        for p in te.action.action.params:
            p.value = p.value.lstrip(b"\x00") or b"\x00"  # canonical
        client.raw.write(_upd(Update.INSERT, te))
        assert loaded.pipeline.tables["MyIngress.ina_job"].entries[(5,)].params == JOB[3]
        te.match[0].exact.value = b"\x01\x00\x05"  # 0x10005 needs 17 bits
        with pytest.raises(SwitchError) as info:
            client.raw.write(_upd(Update.INSERT, te))
        assert info.value.errors[0][1] == "INVALID_ARGUMENT" and "16 bits" in info.value.errors[0][2]


def test_lpm_rules_and_reads(loaded):
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        client.insert_entry("MyIngress.ipv4_lpm", ((0x0A000000, 8),), "MyIngress.ipv4_forward", (0x020000000001, 1))
        client.insert_entry("MyIngress.ipv4_lpm", ((0, 0),), "MyIngress.ipv4_forward", (0x020000000002, 2))  # omitted field: /0
        assert client.read_table("MyIngress.ipv4_lpm") == [
            (((0x0A000000, 8),), "MyIngress.ipv4_forward", (0x020000000001, 1)),
            (((0, 0),), "MyIngress.ipv4_forward", (0x020000000002, 2)),
        ]
        te = table_entry("MyIngress.ipv4_lpm", ((0x0A000100, 24),), "NoAction")
        te.match[0].lpm.prefix_len = 0
        bits = table_entry("MyIngress.ipv4_lpm", ((0x0A000101, 24),), "NoAction")
        with pytest.raises(SwitchError) as info:
            client.raw.write(_upd(Update.INSERT, te), _upd(Update.INSERT, bits))
        assert [c for _, c, _ in info.value.errors] == ["INVALID_ARGUMENT", "INVALID_ARGUMENT"]
        # A read for one match key returns that entry only.
        e = p4runtime_pb2.Entity()
        e.table_entry.CopyFrom(table_entry("MyIngress.ipv4_lpm", ((0x0A000000, 8),)))
        (got,) = client.raw.read(e)
        assert got.table_entry.match[0].lpm.prefix_len == 8
        e.table_entry.match[0].lpm.value = bytes([11, 0, 0, 0])
        assert client.raw.read(e) == []


def test_default_entries(loaded):
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        nexthop = (0x020000000009, 3)
        client.set_default_action("MyIngress.ipv4_lpm", "MyIngress.ipv4_forward", nexthop)
        assert loaded.pipeline.tables["MyIngress.ipv4_lpm"].default == ("MyIngress.ipv4_forward", nexthop)
        e = p4runtime_pb2.Entity()
        e.table_entry.is_default_action = True  # table_id 0: every table's default entry
        got = {x.table_entry.table_id: x.table_entry for x in client.raw.read(e)}
        assert len(got) == len(client.p4info.tables) and all(t.is_default_action for t in got.values())
        ids = {t.preamble.name: t.preamble.id for t in client.p4info.tables}
        assert got[ids["MyIngress.ina_job"]].action.action.action_id == client.schema.action("NoAction").preamble.id
        params = got[ids["MyIngress.ipv4_lpm"]].action.action.params
        assert [p.value for p in params] == [bytes.fromhex("020000000009"), b"\x03"]  # canonical (shortest) bytestrings
        reset = table_entry("MyIngress.ipv4_lpm", None)  # MODIFY without action: back to the P4's default
        client.raw.write(_upd(Update.MODIFY, reset))
        assert loaded.pipeline.tables["MyIngress.ipv4_lpm"].default == ("MyIngress.drop", ())
        with pytest.raises(SwitchError) as info:
            client.raw.write(_upd(Update.DELETE, reset))
        assert info.value.errors[0][1] == "INVALID_ARGUMENT"
        # ina_job and ina_worker have a const default action, and their default-only action cannot be an entry
        with pytest.raises(SwitchError) as info:
            client.set_default_action("MyEgress.ina_worker", "MyEgress.set_worker_addr", (1, 2, 3))
        assert info.value.errors[0][1] == "PERMISSION_DENIED"
        with pytest.raises(SwitchError) as info:  # as PI: "Cannot use DEFAULT_ONLY action in table entry"
            client.insert_entry("MyEgress.ina_worker", (1, 0), "MyEgress.drop")
        assert info.value.errors[0][1] == "PERMISSION_DENIED"
        with pytest.raises(SwitchError) as info:
            client.insert_entry("MyIngress.ina_job", (1,), "NoAction")
        assert info.value.errors[0][1] == "PERMISSION_DENIED"


def test_registers_are_unimplemented_as_on_bmv2(loaded):
    info = load_p4info()
    reg = info.registers[0].preamble.id
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        u = Update(type=Update.MODIFY)
        u.entity.register_entry.register_id = reg
        u.entity.register_entry.index.index = 0
        u.entity.register_entry.data.bitstring = b"\x01"
        with pytest.raises(SwitchError) as err:
            client.raw.write(u)
        assert err.value.code == grpc.StatusCode.UNKNOWN and err.value.errors[0][1] == "UNIMPLEMENTED"
        e = p4runtime_pb2.Entity()
        e.register_entry.register_id = reg
        with pytest.raises(SwitchError) as err:
            client.raw.read(e)
        assert err.value.code == grpc.StatusCode.UNIMPLEMENTED
        req = p4runtime_pb2.WriteRequest(device_id=DEVICE, atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR)
        req.election_id.low = 1
        req.updates.add().CopyFrom(_upd(Update.INSERT, table_entry(*JOB)))
        assert _code(lambda: _stub(loaded).Write(req)) == grpc.StatusCode.UNIMPLEMENTED
        assert loaded.pipeline.tables["MyIngress.ina_job"].entries == {}


def test_counters_read_and_write(loaded):
    with P4RuntimeTestClient(loaded.address, DEVICE, 1, timeout=30.0) as client:  # reads every counter cell (5,136)
        loaded.pipeline.counter("MyIngress.ina_aggregated")[3] = 41
        assert client.read_counter("MyIngress.ina_aggregated", 3) == 41
        cid = client.schema.counter("MyIngress.ina_aggregated").preamble.id
        u = Update(type=Update.MODIFY)
        u.entity.counter_entry.counter_id = cid
        u.entity.counter_entry.index.index = 3
        u.entity.counter_entry.data.packet_count = 7
        client.raw.write(u)
        assert loaded.pipeline.counter("MyIngress.ina_aggregated")[3] == 7
        u.type = Update.DELETE
        client.raw.write(u)
        assert loaded.pipeline.counter("MyIngress.ina_aggregated")[3] == 0
        u.type = Update.INSERT
        with pytest.raises(SwitchError) as info:
            client.raw.write(u)
        assert info.value.errors[0][1] == "INVALID_ARGUMENT"
        u.type = Update.MODIFY
        u.entity.counter_entry.index.index = 256
        with pytest.raises(SwitchError) as info:
            client.raw.write(u)
        assert info.value.errors[0][1] == "UNKNOWN"  # as PI: the target's refusal
        e = p4runtime_pb2.Entity()
        e.counter_entry.counter_id = 0  # every index of every counter
        got = client.raw.read(e)
        assert len(got) == sum(model.COUNTERS.values())
        assert all(x.counter_entry.data.byte_count == 0 for x in got)
        e.counter_entry.counter_id = cid
        e.counter_entry.index.index = 256
        with pytest.raises(SwitchError) as info:
            client.raw.read(e)
        assert info.value.code == grpc.StatusCode.UNKNOWN


def test_multicast_group_errors(loaded):
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        client.set_multicast_group(3, [(1, 0), (2, 1)])
        client.set_multicast_group(3, [(4, 2)])  # the second call modifies
        assert loaded.pipeline.multicast_groups[3] == ((4, 2),)

        def pre(gid, replicas, kind):
            u = Update(type=kind)
            g = u.entity.packet_replication_engine_entry.multicast_group_entry
            g.multicast_group_id = gid
            for port, rid in replicas:
                g.replicas.add(egress_port=port, instance=rid)
            return u

        with pytest.raises(SwitchError) as info:
            client.raw.write(pre(0, [], Update.INSERT), pre(1 << 15, [], Update.INSERT), pre(4, [(1, 0), (1, 0)], Update.INSERT),
                         pre(5, [], Update.MODIFY), pre(5, [], Update.DELETE), pre(3, [], Update.INSERT))
        assert [c for _, c, _ in info.value.errors] == [
            "INVALID_ARGUMENT", "OUT_OF_RANGE", "INVALID_ARGUMENT", "NOT_FOUND", "NOT_FOUND", "ALREADY_EXISTS"]
        e = p4runtime_pb2.Entity()
        e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 9
        with pytest.raises(SwitchError) as info:
            client.raw.read(e)
        assert info.value.code == grpc.StatusCode.NOT_FOUND


# --- raw stubs: the pipeline config ----------------------------------------------------------------------


def _set(sw, p4info, device_config=b"", action=SetConfig.VERIFY_AND_COMMIT, election_id=None):
    req = SetConfig(device_id=DEVICE, action=action)
    if election_id is not None:
        req.election_id.low = election_id
    if p4info is not None:
        req.config.p4info.CopyFrom(p4info)
        req.config.p4_device_config = device_config
    _stub(sw).SetForwardingPipelineConfig(req, timeout=5)


def _bmv2_json(**drop) -> bytes:
    """A BMv2 JSON with the program's control-plane objects, the shape p4c-bm2-ss gives them."""
    doc = {
        "pipelines": [{"name": "ingress", "tables": [
            {"name": name, "key": [{"match_type": k} for _, _, k in spec.keys], "actions": list(spec.actions)}
            for name, spec in model.TABLES.items()] + [{"name": "tbl_ina300", "key": [], "actions": ["ina300"]}]}],
        "actions": [{"name": a.name, "runtime_data": [{"name": n, "bitwidth": w} for n, w in a.params]}
                    for a in model.ACTIONS.values()],
        "register_arrays": [{"name": n, "bitwidth": w, "size": s} for n, (w, s) in model.REGISTERS.items()],
        "counter_arrays": [{"name": n, "size": s, "is_direct": False} for n, s in model.COUNTERS.items()],
    }
    for key, name in drop.items():
        doc[key] = [x for x in doc[key] if x["name"] != name]
    return json.dumps(doc).encode()


def test_read_write_before_pipeline_config_fail_precondition(switch):
    e = p4runtime_pb2.Entity()
    e.table_entry.table_id = 0
    read = p4runtime_pb2.ReadRequest(device_id=DEVICE, entities=[e])
    assert _code(lambda: list(_stub(switch).Read(read))) == grpc.StatusCode.FAILED_PRECONDITION
    req = p4runtime_pb2.WriteRequest(device_id=DEVICE)
    req.updates.add().CopyFrom(_upd(Update.INSERT, table_entry(*JOB)))
    assert _code(lambda: _stub(switch).Write(req)) == grpc.StatusCode.FAILED_PRECONDITION
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=DEVICE)
    assert _code(lambda: _stub(switch).GetForwardingPipelineConfig(get)) == grpc.StatusCode.FAILED_PRECONDITION
    _set(switch, load_p4info())  # no stream open, no election id: accepted, as PI
    (rep,) = _stub(switch).Read(read)
    assert len(rep.entities) == 0


def test_wrong_p4info_and_device_config_are_refused(switch):
    stream = Stream(switch, election_id=1)
    assert stream.arbitration()[0] == code_pb2.OK

    def refused(p4info, device_config=b""):
        with pytest.raises(grpc.RpcError) as info:
            _set(switch, p4info, device_config, election_id=1)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return info.value.details()

    wide = load_p4info()
    next(a for a in wide.actions if a.preamble.name == "MyIngress.set_job").params[3].bitwidth = 16
    assert "MyIngress.set_job" in refused(wide) and "num_workers" in refused(wide)
    renamed = load_p4info()
    renamed.tables[1].preamble.name = "MyIngress.jobs"
    assert "MyIngress.jobs" in refused(renamed)
    fewer = load_p4info()
    del fewer.counters[0]
    assert "missing" in refused(fewer)
    extra = load_p4info()
    extra.meters.add().preamble.name = "MyIngress.m"
    assert "MyIngress.m" in refused(extra)
    header = load_p4info()
    header.controller_packet_metadata[0].metadata[0].bitwidth = 16
    assert "packet_out" in refused(header)
    assert "BMv2 JSON" in refused(load_p4info(), b"\x08\x01 not json")
    assert "ina_lanes" in refused(load_p4info(), _bmv2_json(register_arrays="MyIngress.ina_lanes"))
    assert not switch.server.configured, "nothing refused was applied"
    _set(switch, load_p4info(), _bmv2_json(), election_id=1)
    assert switch.server.configured
    Get = p4runtime_pb2.GetForwardingPipelineConfigRequest
    get = Get(device_id=DEVICE, response_type=Get.ALL)
    rep = _stub(switch).GetForwardingPipelineConfig(get)
    assert rep.config.p4info == load_p4info() and rep.config.p4_device_config == _bmv2_json()
    get.response_type = Get.COOKIE_ONLY
    assert not _stub(switch).GetForwardingPipelineConfig(get).config.HasField("p4info")
    # Only the primary may set the pipeline.
    assert _code(lambda: _set(switch, load_p4info(), election_id=2)) == grpc.StatusCode.PERMISSION_DENIED
    stream.close()


def test_pipeline_actions_and_state_reset(loaded):
    p = loaded.pipeline
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:
        client.insert_entry(*JOB)
        client.set_multicast_group(6, [(1, 0)])
        p.counter("MyIngress.ina_drops")[1] = 5
        p.ina_owner[0] = 99
        for action in (SetConfig.VERIFY, SetConfig.RECONCILE_AND_COMMIT):
            client.raw.set_forwarding_pipeline(b"", action)
            assert (5,) in p.tables["MyIngress.ina_job"].entries and 6 in p.multicast_groups, SetConfig.Action.Name(action)
        client.raw.set_forwarding_pipeline(b"", SetConfig.VERIFY_AND_SAVE)
        assert (5,) in p.tables["MyIngress.ina_job"].entries
        client.raw.set_forwarding_pipeline(b"", SetConfig.COMMIT)  # commits the saved config: a fresh pipeline
        assert p.tables["MyIngress.ina_job"].entries == {} and p.multicast_groups == {}
        assert p.counter("MyIngress.ina_drops")[1] == 0 and p.ina_owner[0] == 0
        with pytest.raises(SwitchError) as info:
            client.raw.set_forwarding_pipeline(b"", SetConfig.COMMIT)
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        client.insert_entry(*JOB)
        client.set_default_action("MyIngress.ipv4_lpm", "NoAction")
        client.raw.set_forwarding_pipeline(b"", SetConfig.VERIFY_AND_COMMIT)
        assert p.tables["MyIngress.ina_job"].entries == {} and p.tables["MyIngress.ipv4_lpm"].default == ("MyIngress.drop", ())


# --- the data plane follows what P4Runtime writes --------------------------------------------------------


def test_entries_written_over_p4runtime_drive_aggregation(loaded):
    workers = make_workers(3)
    with P4RuntimeTestClient(loaded.address, DEVICE, (0, 1), device_config=b"") as client:
        install_job(client, job_id=4, workers=workers, base=10, num_slots=4, mcast_grp=9)
        assert sorted(loaded.pipeline.multicast_groups[9]) == [(w.port, w.wid) for w in workers]
        data = [np.full(wire.LANES, 10 * (i + 1), dtype=np.int32) for i in range(3)]
        out = []
        for w, d in zip(workers, data):
            out = loaded.pipeline.process(w.port, gradient(w, 4, slot=2, lanes=d, seq=77))
        assert sorted(port for port, _ in out) == [w.port for w in workers]
        for port, frame in out:
            pkt = dissect(frame)[INA]
            assert pkt.msg_type == wire.MsgType.RESULT and pkt.lanes == [60] * wire.LANES
            assert pkt.worker_id == workers[port - 1].wid
        assert client.read_counter("MyIngress.ina_aggregated", 4) == 3
        assert client.read_counter("MyEgress.ina_results", 4) == 3
        # A MODIFY over P4Runtime changes the next packet's fate: the job's generation moves on.
        client.modify_entry("MyIngress.ina_job", (4,), "MyIngress.set_job", (10, 4, 0b111, 3, 9, 1, 0))
        assert loaded.pipeline.process(1, gradient(workers[0], 4, slot=2, lanes=data[0], seq=78)) == []
        assert client.read_counter("MyIngress.ina_drops", int(wire.DropReason.STALE_GENERATION)) == 1


def test_packet_out_only_from_the_primary_and_checked(loaded):
    frame = bytes.fromhex("ffffffffffff0200000000018822") + b"x" * 10
    with P4RuntimeTestClient(loaded.address, DEVICE, 2) as primary:
        backup = Stream(loaded, election_id=1)
        assert backup.arbitration()[0] == code_pb2.ALREADY_EXISTS
        msg = p4runtime_pb2.StreamMessageRequest()
        msg.packet.payload = frame
        msg.packet.metadata.add(metadata_id=1, value=b"\x02")
        backup.out.put(msg)
        primary.send_packet_out(frame, egress_port=5)
        deadline = time.time() + 2
        while not loaded.emitted and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert loaded.emitted == [(5, frame)], "the backup's packet-out is dropped"
    raw = Stream(loaded, election_id=3)  # a raw stream for the malformed packet-out
    assert raw.arbitration()[0] == code_pb2.OK
    bad = p4runtime_pb2.StreamMessageRequest()
    bad.packet.payload = frame
    bad.packet.metadata.add(metadata_id=9, value=b"\x01")
    raw.out.put(bad)
    err = raw.next()
    assert err.HasField("error"), err
    assert err.error.canonical_code == code_pb2.INVALID_ARGUMENT and "metadata id 9" in err.error.message
    raw.close()
    backup.close()


def test_p4info_and_device_config_checks_accept_the_program():
    info = load_p4info()
    assert p4info_mismatch(info, info) is None
    assert device_config_mismatch(b"") is None and device_config_mismatch(_bmv2_json()) is None
    assert "no counter MyEgress.ina_results" in device_config_mismatch(_bmv2_json(counter_arrays="MyEgress.ina_results"))
    other = load_p4info()
    other.tables[0].preamble.id += 1
    assert "has id" in p4info_mismatch(info, other)
    with pytest.raises(ValueError):
        P4RuntimeServer(InaPipeline(), device_id=1, initial_p4info=other)


# --- malformed requests: BMv2's answers (tests/p4rt_malformed.py), the server unharmed -----------------------


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_request_gets_bmv2_s_status(loaded, name):
    assert malformed_answer(loaded.address, name) == BMV2_ANSWERS[name]
    if name != "batch_beyond_table_size":  # its fitting updates are applied (CONTINUE_ON_ERROR), as on BMv2
        assert all(not t.entries for t in loaded.pipeline.tables.values()), "a refused update changed a table"
    check_unharmed(loaded.address)


def test_server_unharmed_after_every_malformed_request(loaded):
    for name in MALFORMED:
        malformed_answer(loaded.address, name)
    check_unharmed(loaded.address)
    with P4RuntimeTestClient(loaded.address, DEVICE, 1) as client:  # a primary's session works as before
        client.insert_entry(*JOB)
        assert loaded.pipeline.tables["MyIngress.ina_job"].entries[(5,)].params == JOB[3]
