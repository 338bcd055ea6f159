"""Agent building blocks without sockets: fixed point, overflow split, job specs, grants and plans."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.fixedpoint import (
    INT32_MAX,
    INT32_MIN,
    chunk_count,
    dequantize,
    join_split,
    quantize,
    quantize_chunks,
    split_chunks,
    to_chunks,
)
from host_agent.grant import Grant, JobSpec, SwitchGrant, Worker, parse_workers, plan_for
from host_agent.stream import StreamOptions
from inaproto import wire


def test_quantize_rounds_saturates_and_maps_nan_to_zero() -> None:
    x = np.array([0.5, 1.5, -0.5, 1e12, -1e12, np.nan, np.inf, -np.inf, 1 / 3], dtype=np.float64)
    q = quantize(x, 4.0)
    assert q.dtype == np.int32
    assert q.tolist() == [2, 6, -2, INT32_MAX, INT32_MIN, 0, INT32_MAX, INT32_MIN, 1]
    with pytest.raises(ValueError, match="scale"):
        quantize(x, 0.0)


def test_dequantize_rounds_once_from_float64() -> None:
    total = np.array([3, -(2**40) - 1, 0], dtype=np.int64)
    out = dequantize(total, 2.0**16)
    assert out.dtype == np.float32
    assert out.tolist() == [np.float32(3 / 65536), np.float32((-(2**40) - 1) / 65536), 0.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32), max_size=100), st.sampled_from([2.0**16, 2.0**-3, 2.0**30, 1000.0, 3.7]))
def test_fast_paths_match_the_float64_definitions(values: list[float], scale: float) -> None:
    """quantize_chunks and dequantize take float32 shortcuts for power-of-two scales: same bits."""
    x = np.array(values, dtype=np.float32)
    assert quantize_chunks(x, scale).tobytes() == to_chunks(quantize(x, scale)).tobytes()
    total = quantize(x, scale).astype(np.int64) * 7
    assert dequantize(total, scale).tobytes() == (total.astype(np.float64) / scale).astype(np.float32).tobytes()


def test_chunks_pad_with_zeros() -> None:
    assert chunk_count(0) == 0 and chunk_count(1) == 1 and chunk_count(wire.LANES + 1) == 2
    c = to_chunks(np.arange(wire.LANES + 3, dtype=np.int32))
    assert c.shape == (2, wire.LANES)
    assert c[1, :3].tolist() == [32, 33, 34] and not c[1, 3:].any()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(INT32_MIN, INT32_MAX), min_size=wire.LANES, max_size=wire.LANES), min_size=1,
                max_size=32))
def test_split_parts_never_overflow_and_rejoin_exactly(rows: list[list[int]]) -> None:
    """32 workers' hi and lo parts sum inside int32 in any order; the parts rejoin to the exact int64 sum."""
    workers = [np.array([r], dtype=np.int32) for r in rows]
    parts = np.stack([split_chunks(w) for w in workers]).astype(np.int64)  # (workers, 2, LANES)
    partial = np.cumsum(parts, axis=0)
    assert partial.max() <= INT32_MAX and partial.min() >= INT32_MIN
    total = join_split(parts.sum(axis=0))
    assert total[0].tolist() == np.sum(np.array(rows, dtype=np.int64), axis=0).tolist()


def test_parse_workers_and_errors() -> None:
    ws = parse_workers("10.0.1.1:40000@h1, 10.0.1.2:40001/02:00:00:00:01:02@h2")
    assert ws == (Worker(0, "10.0.1.1", 40000, "", "h1"), Worker(1, "10.0.1.2", 40001, "02:00:00:00:01:02", "h2"))
    for bad, match in (("10.0.1.1", "IP:PORT"), ("10.0.1.1:x", "IP:PORT"), ("nohost:1", "IPv4"),
                       ("10.0.0.1:1,,", "empty"), ("10.0.0.1:70000", "out of range")):
        with pytest.raises(ValueError, match=match):
            parse_workers(bad)


def test_job_spec_json_round_trip_and_checks() -> None:
    spec = JobSpec("j", parse_workers("127.0.0.1:1@a,127.0.0.1:2@b"), backend="rina", requested_slots=8)
    assert JobSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="backend"):
        JobSpec("j", spec.workers, backend="fast")
    with pytest.raises(ValueError, match="unique"):
        JobSpec("j", (Worker(0, "127.0.0.1", 1), Worker(0, "127.0.0.1", 2)))
    with pytest.raises(KeyError, match="no worker 5"):
        spec.worker(5)
    req = spec.register_request()
    assert req.name == "j" and [w.host for w in req.workers] == ["a", "b"] and req.requested_slots == 8


def _grant(backend: str, *switches: SwitchGrant, generation: int = 3) -> Grant:
    return Grant(job_id=4, generation=generation, backend=backend, switches=switches, ina_port=47000)


def test_plan_ina_ring_and_rina_on_chains() -> None:
    ids = range(6)
    one = _grant("ina", SwitchGrant("s1", "10.0.0.254", num_slots=16, worker_ids=tuple(ids)))
    p = plan_for(one, ids, "auto")
    assert p.kind == "ina" and p.racks[0].address == ("10.0.0.254", 47000) and p.generation == 3
    assert plan_for(one, ids, "rina").kind == "ina"  # one rack: Rina is plain INA
    assert plan_for(one, ids, "ring").kind == "ring"

    racks = _grant("rina", SwitchGrant("r1", "10.0.1.254", num_slots=8, worker_ids=(2, 0, 1)),
                   SwitchGrant("r2", "10.0.2.254", num_slots=0, worker_ids=(3, 4)),
                   SwitchGrant("r3", "10.0.3.254", num_slots=4, worker_ids=(5,)))
    p = plan_for(racks, ids, "auto")  # Rina on chains: every worker plain INA towards its switch or its own copy
    assert p.kind == "ina" and p.ring == ()
    assert [r.worker_ids for r in p.racks] == [(0, 1, 2), (5,), (3,), (4,)]
    assert [r.switch for r in p.racks[2:]] == ["host-copy-3", "host-copy-4"]
    assert {r.num_slots for r in p.racks} == {4} and p.rack_of(3).chains == 4  # 4 members, a partition each
    assert plan_for(racks, ids, "ina").kind == "ring"  # ina needs one switch holding everyone
    chainless = _grant("rina", SwitchGrant("r1", "10.0.1.254", num_slots=2, worker_ids=(0, 1, 2)),
                       SwitchGrant("r2", "", num_slots=0, worker_ids=(3, 4, 5)))
    assert plan_for(chainless, ids, "auto").kind == "ring"  # 2 slots for 4 members: no chain, the ring

    none = _grant("ring", SwitchGrant("s1", "10.0.0.254", num_slots=0, worker_ids=tuple(ids)))
    p = plan_for(none, ids, "auto")
    assert p.kind == "ring" and p.ring == tuple(ids)
    with pytest.raises(ValueError, match="lanes"):
        plan_for(Grant(1, 1, "ina", lanes=64), ids)
    with pytest.raises(ValueError, match="backend"):
        plan_for(one, ids, "fast")


def test_stream_options_are_checked() -> None:
    with pytest.raises(ValueError, match="op_timeout"):
        StreamOptions(op_timeout=0)
    with pytest.raises(ValueError, match="rto"):
        StreamOptions(rto_min=1.0, rto_initial=0.1)
    with pytest.raises(ValueError, match="reorder_guard"):
        StreamOptions(reorder_guard=-1)
