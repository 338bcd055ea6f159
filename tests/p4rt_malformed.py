"""A catalogue of malformed P4Runtime requests and the status codes BMv2 (PI) answers them with.

Each case is a Write or a Read built from the committed P4Info; :func:`answer` sends it to a switch whose
pipeline is set (no stream open, no election id: PI accepts such calls) and returns what came back: the
call's gRPC status code and, for a failed Write, the canonical code of each update. ``BMV2`` holds the
answers of simple_switch_grpc 1.15.5; tests/local/test_p4runtime_server.py holds ina-switch to them and
tests/bmv2/test_bmv2_p4runtime.py checks them against the real BMv2.
"""
from __future__ import annotations

from collections.abc import Callable

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from tests.p4rt_client import SCHEMA, table_entry

__all__ = ["BMV2", "CASES", "answer", "check_unharmed"]

Update = p4runtime_pb2.Update
DEVICE = 1
JOB = ("MyIngress.ina_job", (5,), "MyIngress.set_job", (0, 8, 0b11, 2, 6, 0, 0))  # set_job(..., generation, owner_epoch)
UNKNOWN_ID = 0x02FFFFFF  # no P4Info object has it


def _upd(kind: int, te: p4runtime_pb2.TableEntry) -> p4runtime_pb2.Update:
    u = Update(type=kind)
    u.entity.table_entry.CopyFrom(te)
    return u


def _write(*updates: p4runtime_pb2.Update) -> p4runtime_pb2.WriteRequest:
    return p4runtime_pb2.WriteRequest(device_id=DEVICE, updates=list(updates))


def _read(*entities: p4runtime_pb2.Entity) -> p4runtime_pb2.ReadRequest:
    return p4runtime_pb2.ReadRequest(device_id=DEVICE, entities=list(entities))


def _job(**change) -> p4runtime_pb2.TableEntry:
    te = table_entry(*JOB)
    for k, v in change.items():
        setattr(te, k, v)
    return te


def unknown_table():
    return _write(_upd(Update.INSERT, _job(table_id=UNKNOWN_ID)))


def unknown_action():
    te = _job()
    te.action.action.action_id = UNKNOWN_ID
    return _write(_upd(Update.INSERT, te))


def unknown_match_field():
    te = _job()
    te.match[0].field_id = 99
    return _write(_upd(Update.INSERT, te))


def unknown_param():
    te = _job()
    te.action.action.params[0].param_id = 99
    return _write(_upd(Update.INSERT, te))


def missing_match_field():
    te = _job()
    del te.match[:]
    return _write(_upd(Update.INSERT, te))


def priority_on_exact_table():
    return _write(_upd(Update.INSERT, _job(priority=10)))


def param_too_wide():
    te = _job()
    te.action.action.params[3].value = b"\x01\x00"  # num_workers is bit<8>
    return _write(_upd(Update.INSERT, te))


def lpm_prefix_too_long():
    te = table_entry("MyIngress.ipv4_lpm", ((0x0A000001, 32),), "MyIngress.drop")
    te.match[0].lpm.prefix_len = 33
    return _write(_upd(Update.INSERT, te))


def unspecified_update_type():
    return _write(_upd(Update.UNSPECIFIED, _job()))


def update_without_entity():
    return _write(Update(type=Update.INSERT))


def counter_index_negative():
    u = Update(type=Update.MODIFY)
    u.entity.counter_entry.counter_id = SCHEMA.counter("MyIngress.ina_aggregated").preamble.id
    u.entity.counter_entry.index.index = -1
    u.entity.counter_entry.data.packet_count = 1
    return _write(u)


def unknown_counter_write():
    u = Update(type=Update.MODIFY)
    u.entity.counter_entry.counter_id = UNKNOWN_ID
    u.entity.counter_entry.index.index = 0
    return _write(u)


def counter_index_past_size():
    u = Update(type=Update.MODIFY)
    c = SCHEMA.counter("MyIngress.ina_aggregated")
    u.entity.counter_entry.counter_id = c.preamble.id
    u.entity.counter_entry.index.index = c.size
    u.entity.counter_entry.data.packet_count = 1
    return _write(u)


def read_counter_index_past_size():
    e = p4runtime_pb2.Entity()
    c = SCHEMA.counter("MyIngress.ina_aggregated")
    e.counter_entry.counter_id = c.preamble.id
    e.counter_entry.index.index = c.size
    return _read(e)


def read_unknown_table():
    e = p4runtime_pb2.Entity()
    e.table_entry.table_id = UNKNOWN_ID
    return _read(e)


def read_unknown_counter():
    e = p4runtime_pb2.Entity()
    e.counter_entry.counter_id = UNKNOWN_ID
    return _read(e)


def defaultonly_noaction_in_ina_job():
    """NoAction is @defaultonly in ina_job: an entry may not use it (PI: PERMISSION_DENIED)."""
    return _write(_upd(Update.INSERT, table_entry("MyIngress.ina_job", (5,), "NoAction")))


def defaultonly_noaction_in_ina_binding():
    return _write(_upd(Update.INSERT, table_entry("MyIngress.ina_binding", (5, 1), "NoAction")))


def defaultonly_drop_in_ina_worker():
    """MyEgress.drop is @defaultonly in ina_worker (its const default action)."""
    return _write(_upd(Update.INSERT, table_entry("MyEgress.ina_worker", (5, 1), "MyEgress.drop")))


def batch_beyond_table_size(extra: int = 4):
    """One batch of size + extra distinct /32 routes: the table takes ``size``, the rest do not fit."""
    size = SCHEMA.table("MyIngress.ipv4_lpm").size
    return _write(*[_upd(Update.INSERT, table_entry("MyIngress.ipv4_lpm", ((0x0A000000 + i, 32),), "MyIngress.drop"))
                    for i in range(size + extra)])


CASES: dict[str, Callable[[], object]] = {
    f.__name__: f for f in (
        unknown_table, unknown_action, unknown_match_field, unknown_param, missing_match_field,
        priority_on_exact_table, param_too_wide, lpm_prefix_too_long, unspecified_update_type,
        update_without_entity, counter_index_negative, counter_index_past_size, unknown_counter_write,
        read_counter_index_past_size, read_unknown_table,
        read_unknown_counter, defaultonly_noaction_in_ina_job, defaultonly_noaction_in_ina_binding,
        defaultonly_drop_in_ina_worker, batch_beyond_table_size,
    )
}

# (gRPC status code of the call, canonical code of each update of a failed Write (None: not a Write failure))
BMV2: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "unknown_table": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "unknown_action": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "unknown_match_field": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "unknown_param": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "missing_match_field": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "priority_on_exact_table": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "param_too_wide": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "lpm_prefix_too_long": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "unspecified_update_type": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "update_without_entity": ("UNKNOWN", ("UNKNOWN",)),  # PI: "Incorrect entity type"
    "counter_index_negative": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "counter_index_past_size": ("UNKNOWN", ("UNKNOWN",)),  # PI: "Error when writing to counter"
    "unknown_counter_write": ("UNKNOWN", ("INVALID_ARGUMENT",)),
    "read_counter_index_past_size": ("UNKNOWN", None),
    "read_unknown_table": ("INVALID_ARGUMENT", None),
    "read_unknown_counter": ("INVALID_ARGUMENT", None),
    # PI: "Cannot use DEFAULT_ONLY action in table entry"
    "defaultonly_noaction_in_ina_job": ("UNKNOWN", ("PERMISSION_DENIED",)),
    "defaultonly_noaction_in_ina_binding": ("UNKNOWN", ("PERMISSION_DENIED",)),
    "defaultonly_drop_in_ina_worker": ("UNKNOWN", ("PERMISSION_DENIED",)),
    # the table takes its size; PI reports the target's refusal of the rest as UNKNOWN, not RESOURCE_EXHAUSTED
    "batch_beyond_table_size": ("UNKNOWN", ("OKx1024", "UNKNOWNx4")),
}


def _update_codes(err: grpc.RpcError) -> tuple[str, ...] | None:
    raw = [v for k, v in (err.trailing_metadata() or ()) if k == "grpc-status-details-bin"]
    if not raw:
        return None
    status = status_pb2.Status.FromString(raw[0])
    out = []
    for d in status.details:
        e = p4runtime_pb2.Error()
        d.Unpack(e)
        out.append(code_pb2.Code.Name(e.canonical_code))
    return tuple(out)


def answer(address: str, name: str) -> tuple[str, tuple[str, ...] | None]:
    """(gRPC code name, per-update canonical code names or None) of case ``name`` at ``address``."""
    req = CASES[name]()
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_metadata_size", 4 << 20)]  # 1028 errors
    with grpc.insecure_channel(address, options=options) as channel:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        try:
            if isinstance(req, p4runtime_pb2.WriteRequest):
                stub.Write(req, timeout=60)
            else:
                list(stub.Read(req, timeout=60))
        except grpc.RpcError as err:
            codes = _update_codes(err) if isinstance(req, p4runtime_pb2.WriteRequest) else None
            return err.code().name, _summarise(codes)
        return "OK", None


def _summarise(codes: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Runs of equal codes as 'CODE' or 'CODExN' (a batch of 1028 updates stays readable)."""
    if codes is None:
        return None
    out: list[str] = []
    run, n = None, 0
    for c in (*codes, None):
        if c == run:
            n += 1
            continue
        if run is not None:
            out.append(run if n == 1 else f"{run}x{n}")
        run, n = c, 1
    return tuple(out)


def check_unharmed(address: str) -> None:
    """The server still serves: a good write and the read of it succeed (then the entry is removed)."""
    with grpc.insecure_channel(address) as channel:
        stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        te = table_entry("MyIngress.ina_job", (9,), *JOB[2:])
        stub.Write(_write(_upd(Update.INSERT, te)), timeout=10)
        e = p4runtime_pb2.Entity()
        e.table_entry.CopyFrom(table_entry("MyIngress.ina_job", (9,)))
        (resp,) = list(stub.Read(_read(e), timeout=10))
        assert len(resp.entities) == 1
        stub.Write(_write(_upd(Update.DELETE, table_entry("MyIngress.ina_job", (9,)))), timeout=10)
