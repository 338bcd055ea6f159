"""InaPipeline.process_batch gives exactly what process gives frame after frame: outputs, registers, counters."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from softswitch import pipeline_batch
from softswitch.pipeline import InaPipeline

SWITCH_MAC, SWITCH_IP = bytes.fromhex("0200000000fe"), bytes([10, 0, 0, 254])
# Two jobs whose slot ranges overlap (slots 2-3): a gradient of one takes the slot over from the other.
JOBS = {1: {"workers": 4, "base": 0, "num_slots": 4, "generation": 3, "group": 1}, 2: {"workers": 2, "base": 2, "num_slots": 4, "generation": 0, "group": 2}}


def _pipeline() -> InaPipeline:
    p = InaPipeline()
    for job_id, j in JOBS.items():
        workers = [WorkerAddress(i, i + 1, bytes.fromhex(f"0200000001{i + 1:02x}"), bytes([10, 0, 1, i + 1]), 40000 + i)
                   for i in range(j["workers"])]
        job_entries(job_id, workers, base_slot=j["base"], num_slots=j["num_slots"], generation=j["generation"],
                    mcast_grp=j["group"]).insert_into(p)
    p.insert_entry("MyIngress.ipv4_lpm", ((0x0A000200, 24),), "MyIngress.ipv4_forward", (0x0200000000AA, 3))
    return p


def _frame(wid: int, job: int, slot: int, seq: int, shadow: int, lanes: list[int], *, msg_type=wire.MsgType.GRADIENT,
           generation: int | None = None, corrupt: str = "", flags: int = 0, reserved: int = 0) -> bytes:
    gen = JOBS.get(job, {}).get("generation", 0) if generation is None else generation
    header = wire.InaHeader(msg_type, flags, job, gen, slot, seq, wid, shadow, reserved)
    frame = bytearray(wire.udp_frame(bytes.fromhex(f"0200000001{wid + 1:02x}"), SWITCH_MAC, bytes([10, 0, 1, wid + 1]),
                                     SWITCH_IP, 40000 + wid, wire.INA_UDP_PORT, wire.encode_payload(header, np.array(lanes))))
    if corrupt == "checksum":
        frame[24] ^= 0xFF
    elif corrupt == "short":
        frame = frame[:-3]
    elif corrupt == "routed":  # plain IPv4/UDP to a routed address: the LPM path
        frame = bytearray(wire.udp_frame(frame[6:12], frame[0:6], bytes(frame[26:30]), bytes([10, 0, 2, 9]), 5000, 5001, b"x" * 40))
    elif corrupt == "arp":
        frame[12:14] = b"\x08\x06"
    return bytes(frame)


_LANE = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-100, 100), st.sampled_from([2**31 - 1, -(2**31)]))
_FRAME = st.builds(
    _frame,
    wid=st.integers(0, 4),  # worker 4 is foreign to both jobs
    job=st.sampled_from([1, 1, 1, 2, 3]),  # job 3 is unknown
    slot=st.integers(0, 4),  # slot 4 is out of range
    seq=st.integers(0, 3),
    shadow=st.integers(0, 1),
    lanes=st.lists(_LANE, min_size=wire.LANES, max_size=wire.LANES),
    msg_type=st.sampled_from([wire.MsgType.GRADIENT] * 8 + [wire.MsgType.BROADCAST, wire.MsgType.RESULT]),
    generation=st.sampled_from([None] * 8 + [7]),
    corrupt=st.sampled_from([""] * 12 + ["checksum", "short", "routed", "arp"]),
)
_BATCHES = st.lists(st.tuples(st.integers(1, 4), st.lists(_FRAME, min_size=1, max_size=24)), min_size=1, max_size=6)


def _state(p: InaPipeline):
    """Every register (ina_tx_next and ina_last_done included), the lanes' bytes and every counter."""
    return p.register_snapshot()[:-1], p.ina_lanes.tobytes(), {k: list(v) for k, v in p.counters.items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=_BATCHES, vector_min=st.sampled_from([1, 4]))
def test_batch_equals_one_frame_at_a_time(batches, vector_min):
    one, batch = _pipeline(), _pipeline()
    for port, frames in batches:
        expected = [out for f in frames for out in one.process(port, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, port, frames, vector_min=vector_min)
        assert got == expected
        assert _state(batch) == _state(one)


def _as_rows(frames: list[bytes]) -> np.ndarray | list[bytes]:
    """The frames as the packet rings hand them over: one (n, length) array when they share a length."""
    if len({len(f) for f in frames}) != 1:
        return frames
    return np.frombuffer(b"".join(frames), np.uint8).reshape(len(frames), -1).copy()


def _listed(out) -> list[tuple[int, bytes]]:
    return out.as_list() if isinstance(out, pipeline_batch.FrameBlock) else out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=_BATCHES, vector_min=st.sampled_from([1, 4]))
def test_array_batches_and_frame_blocks_equal_one_frame_at_a_time(batches, vector_min):
    """The rings' form: frames as one array in, a FrameBlock out where possible; the same bytes and state."""
    one, batch = _pipeline(), _pipeline()
    for port, frames in batches:
        expected = [out for f in frames for out in one.process(port, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, port, _as_rows(frames), vector_min=vector_min, as_block=True)
        assert _listed(got) == expected
        if isinstance(got, pipeline_batch.FrameBlock):
            by_port = got.by_port()
            assert {p: [r.tobytes() for r in rows] for p, rows in by_port.items()} == {
                p: [f for q, f in expected if q == p] for p in {q for q, _ in expected}}
        assert _state(batch) == _state(one)


def test_distinct_slots_come_back_as_one_block():
    """Four workers' rounds as arrays: the last one's results come back as a FrameBlock, port by port in order."""
    rng = np.random.default_rng(1)
    one, batch = _pipeline(), _pipeline()
    for wid in range(4):
        frames = _round(5, range(4), wid, rng)
        expected = [out for f in frames for out in one.process(wid + 1, f)]
        got = pipeline_batch.process_batch(batch, wid + 1, _as_rows(frames), vector_min=1, as_block=True)
        assert _listed(got) == expected
    assert isinstance(got, pipeline_batch.FrameBlock) and len(got) == 16
    assert _state(batch) == _state(one)


def _round(seq: int, slots: range, wid: int, rng: np.random.Generator) -> list[bytes]:
    return [_frame(wid, 1, s, seq, seq & 1, rng.integers(-(2**31), 2**31, wire.LANES).tolist()) for s in slots]


def test_distinct_slots_take_the_vector_path(monkeypatch):
    """Four workers' rounds over four slots, one port batch each: no frame goes through the per-frame path,
    and the last worker's batch emits every slot's result to every worker, byte for byte as process does."""
    rng = np.random.default_rng(1)
    one, batch = _pipeline(), _pipeline()
    rounds = [_round(5, range(4), wid, rng) for wid in range(4)]
    per_frame = []
    real = InaPipeline._process
    monkeypatch.setattr(InaPipeline, "_process", lambda self, port, f: per_frame.append(f) or real(self, port, f))
    for wid, frames in enumerate(rounds):
        got = pipeline_batch.process_batch(batch, wid + 1, frames, vector_min=1)
        expected = [out for f in frames for out in real(one, wid + 1, f)]
        assert got == expected
    assert per_frame == []
    assert len(got) == 16 and {port for port, _ in got} == {1, 2, 3, 4}
    assert _state(batch) == _state(one)
    assert batch.counter("MyIngress.ina_aggregated")[1] == 16


def test_retransmission_in_a_batch_answers_its_sender():
    """A completed slot's gradient sent again (a lost result) is answered to its sender alone, in batch order."""
    rng = np.random.default_rng(2)
    one, batch = _pipeline(), _pipeline()
    rounds = [_round(9, range(4), wid, rng) for wid in range(4)]
    for wid, frames in enumerate(rounds[1:], start=1):  # workers 1-3 first, each from its own port
        assert batch.process_batch(wid + 1, frames) == [out for f in frames for out in one.process(wid + 1, f)]
    frames = rounds[0] + rounds[0][:2]  # worker 0 completes every slot, then resends slots 0 and 1
    expected = [out for f in frames for out in one.process(1, f)]
    assert batch.process_batch(1, frames) == expected
    assert [port for port, _ in expected[-2:]] == [1, 1]
    assert _state(batch) == _state(one)


def test_spoofed_frames_in_a_batch_are_dropped_and_counted():
    """Worker 1's gradients arriving on worker 0's port are not aggregated: DROP_SPOOFED, as process counts."""
    rng = np.random.default_rng(4)
    one, batch = _pipeline(), _pipeline()
    frames = _round(3, range(4), 0, rng) + _round(3, range(4), 1, rng)
    assert batch.process_batch(1, frames) == [out for f in frames for out in one.process(1, f)]
    assert _state(batch) == _state(one)
    assert batch.counter("MyIngress.ina_aggregated")[1] == 4
    assert batch.counter("MyIngress.ina_drops")[wire.DropReason.SPOOFED] == 4
    assert batch.counter("MyIngress.ina_job_drops")[1 * wire.NUM_DROP_REASONS + wire.DropReason.SPOOFED] == 4


@pytest.mark.parametrize("n", [0, 1, 7])
def test_small_batches(n):
    rng = np.random.default_rng(3)
    one, batch = _pipeline(), _pipeline()
    frames = _round(1, range(n), 0, rng)
    assert batch.process_batch(1, frames) == [out for f in frames for out in one.process(1, f)]
    assert _state(batch) == _state(one)


def test_chain_and_transit_jobs_go_one_frame_at_a_time_with_the_same_outputs():
    """A job with chain entries (partials onward, results from upstream) or in transit is never vectorised:
    batches of its frames, gradients, upstream partials and results give exactly what process gives."""
    from inaproto.job_entries import ChainHop, ChainLink, ChainPartition, TransitEntry, chain_entries

    def pipe() -> InaPipeline:
        p = _pipeline()
        workers = [WorkerAddress(i, i + 1, bytes.fromhex(f"0200000001{i + 1:02x}"), bytes([10, 0, 1, i + 1]), 40000 + i)
                   for i in range(4)]
        job = job_entries(1, workers, base_slot=0, num_slots=4, generation=3, mcast_grp=1)
        hop = ChainHop(20, 9, "02:00:00:00:ee:01", "10.0.254.1", wire.INA_UDP_PORT)
        chain_entries(job, 21, hop, [ChainPartition(0, 15, (20,), True, (hop,)), ChainPartition(2, 15, (), False)],
                      {20: ChainLink(9, 40020), 21: ChainLink(9, 40021)}).insert_into(p)  # _frame: UDP 40000 + id
        t = TransitEntry(2)
        p.insert_entry(t.table, t.match, t.action, t.params)
        return p

    rng = np.random.default_rng(4)
    one, batch = pipe(), pipe()
    batches = [(wid + 1, _round(5, range(4), wid, rng)) for wid in range(4)]  # each worker from its bound port
    batches.append((9, [_frame(20, 1, s, 5, 1, rng.integers(-100, 100, wire.LANES).tolist()) for s in (0, 1)]  # upstream
                    + [_frame(21, 1, s, 5, 1, [7] * wire.LANES, msg_type=wire.MsgType.RESULT) for s in (2, 3)]))  # finals
    batches.append((1, [_frame(w, 2, 0, 1, 0, [1] * wire.LANES) for w in range(2)]  # transit (no route: dropped)
                    + batches[0][1][:3]))  # retransmissions: answered or partials resent
    expected = [out for port, frames in batches for f in frames for out in one.process(port, f)]
    assert [out for port, frames in batches for out in batch.process_batch(port, frames)] == expected
    assert _state(batch) == _state(one) and batch.ina_final == one.ina_final
    assert one.counter("MyIngress.ina_partials")[1] >= 2


# Whole rounds of job 1 (workers 0-3 on ports 1-4, copy = seq's parity) mixed with anything else: runs of several
# workers' gradients into one slot in one batch, completed within it or not, with resends and overflows.
_ROUND_FRAME = st.builds(
    lambda wid, slot, seq, lanes: (wid + 1, _frame(wid, 1, slot, seq, seq & 1, lanes)),
    wid=st.integers(0, 3), slot=st.integers(0, 1), seq=st.integers(0, 2),
    lanes=st.lists(_LANE, min_size=wire.LANES, max_size=wire.LANES),
)
_PORTED = st.one_of(_ROUND_FRAME, _ROUND_FRAME, st.tuples(st.integers(0, 4), _FRAME))
_UNION_BATCHES = st.lists(st.lists(_PORTED, min_size=1, max_size=32), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=_UNION_BATCHES, vector_min=st.sampled_from([1, 4]), rows=st.booleans())
def test_union_of_ports_equals_one_frame_at_a_time(batches, vector_min, rows):
    """One batch of several ports' frames (a port per frame, what the rings gather per wake-up): same-slot gradients
    of several workers are summed in one pass, and outputs, registers and counters are those of ``process``."""
    one, batch = _pipeline(), _pipeline()
    for ported in batches:
        ports = np.array([p for p, _ in ported], np.int64)
        frames = [f for _, f in ported]
        expected = [out for p, f in ported for out in one.process(p, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, ports, _as_rows(frames) if rows else frames,
                                               vector_min=vector_min, as_block=rows)
        assert _listed(got) == expected
        assert _state(batch) == _state(one)


def test_a_round_of_every_worker_in_one_union_batch_is_summed_at_once(monkeypatch):
    """Four workers' gradients into the same slots, interleaved, in one batch: aggregated as runs (no frame
    through the per-frame path), one result per slot, the exact sums."""
    one, batch = _pipeline(), _pipeline()
    ported = [(wid + 1, _frame(wid, 1, slot, 1, 1, [wid * 10 + slot] * wire.LANES)) for slot in range(4) for wid in range(4)]
    expected = [out for p, f in ported for out in one.process(p, f)]
    monkeypatch.setattr(batch, "_process", lambda *a: pytest.fail("a frame took the per-frame path"))
    with batch.lock:
        got = pipeline_batch.process_batch(batch, np.array([p for p, _ in ported]), _as_rows([f for _, f in ported]),
                                           vector_min=1, as_block=True)
    assert isinstance(got, pipeline_batch.FrameBlock)
    assert got.as_list() == expected
    assert len(expected) == 4 * 4  # a result per slot, to each of the 4 workers
    assert _state(batch) == _state(one)


# --- Loss signals (docs/protocol.md, "Loss signals"): counted gradients in batches --------------------------------
_COUNTED = int(wire.Flags.TX_COUNTED)


def _counted_stream(specs, start: dict[tuple[int, int], int]) -> list[tuple[int, bytes]]:
    """(port, frame) for specs (job, wid, slot, seq, lanes, lost, flags) in order: each of a worker's frames takes
    the next value of its transmission counter (from ``start``), a lost one too, but is not sent. ``lost`` < 0: a
    late frame (reordered or duplicated by the network), sent with the counter ``-lost`` behind the next value,
    which it does not take."""
    counters = dict(start)
    out = []
    for job, wid, slot, seq, lanes, lost, flags in specs:
        wid %= JOBS[job]["workers"]
        tx = counters.get((job, wid), 0)
        if lost < 0:
            tx += lost
        else:
            counters[(job, wid)] = tx + 1
        if lost <= 0:
            out.append((wid + 1, _frame(wid, job, slot, seq, seq & 1, lanes, flags=flags, reserved=tx % 128)))
    return out


_COUNTED_SPEC = st.tuples(
    st.sampled_from([1, 1, 1, 2]), st.integers(0, 3), st.integers(0, 1), st.integers(0, 2),
    st.lists(_LANE, min_size=wire.LANES, max_size=wire.LANES),
    # lost (1), or late by 1, 2, 63, 64 (the boundary: 64 behind is 64 ahead, late) or 65 (63 ahead: a gap)
    st.sampled_from([0] * 14 + [1] * 2 + [-1, -2, -63, -64, -65]),
    st.sampled_from([_COUNTED] * 6 + [_COUNTED | int(wire.Flags.RETRANSMIT), 0]),  # an uncounted frame now and then
)
# A whole round of a job's slot (every worker, in worker order; one of them lost now and then): completions.
_COUNTED_ROUND = st.builds(
    lambda job, slot, seq, lanes, lost, flags: [(job, wid, slot, seq, lanes, int(wid == lost), flags)
                                                for wid in range(JOBS[job]["workers"])],
    st.sampled_from([1, 2]), st.integers(0, 3), st.integers(0, 5), st.lists(_LANE, min_size=wire.LANES, max_size=wire.LANES),
    st.sampled_from([-1] * 8 + [0, 1]), st.sampled_from([_COUNTED] * 8 + [0]),
)
_COUNTED_BATCH = st.lists(st.one_of(_COUNTED_SPEC.map(lambda spec: [spec]), _COUNTED_ROUND), min_size=1, max_size=12).map(
    lambda items: [spec for item in items for spec in item])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=st.lists(_COUNTED_BATCH, min_size=1, max_size=6),
       start=st.integers(0, 127), vector_min=st.sampled_from([1, 4]), rows=st.booleans(), loop=st.booleans())
def test_counted_batches_equal_one_frame_at_a_time(batches, start, vector_min, rows, loop):
    """Counted gradients of two jobs (counters from ``start``, wrapping at 128), some lost (gap reports), some late
    (no report, the counter left), resends (answers with reserved 0) and completions (PREV_DONE), in union
    batches: the outputs and every register and counter are those of ``process``. The counters checked in the
    Python loop or with numpy (``loop``)."""
    saved = pipeline_batch.TX_LOOP_MAX
    pipeline_batch.TX_LOOP_MAX = saved if loop else 0
    try:
        _check_counted_batches(batches, start, vector_min, rows)
    finally:
        pipeline_batch.TX_LOOP_MAX = saved


def _check_counted_batches(batches, start: int, vector_min: int, rows: bool) -> None:
    one, batch = _pipeline(), _pipeline()
    starts = {(job, wid): start + 7 * wid + job for job in JOBS for wid in range(4)}
    for specs in batches:
        ported = _counted_stream(specs, starts)
        for job, wid, _slot, _seq, _lanes, lost, _flags in specs:  # the next batch continues every counter
            starts[(job, wid % JOBS[job]["workers"])] += lost >= 0
        if not ported:
            continue
        ports = np.array([p for p, _ in ported], np.int64)
        frames = [f for _, f in ported]
        expected = [out for p, f in ported for out in one.process(p, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, ports, _as_rows(frames) if rows else frames,
                                               vector_min=vector_min, as_block=rows)
        assert _listed(got) == expected
        assert _state(batch) == _state(one)


def _counted_rounds(rounds: range, start: int, rng: np.random.Generator, lose: set[tuple[int, int]] = frozenset()):
    """Job 1's workers 0-3, each its own port batch per round (slots 0-3, seq = round): counted from ``start``;
    (round, worker) in ``lose`` loses that worker's frame for slot 1 of the round."""
    batches = []
    for r in rounds:
        for wid in range(4):
            frames = []
            for slot in range(4):
                tx = (start + (r - rounds[0]) * 4 + slot) % 128
                if (r, wid) not in lose or slot != 1:
                    frames.append(_frame(wid, 1, slot, 4 * r + slot, r & 1, rng.integers(-(2**20), 2**20, wire.LANES).tolist(),
                                         flags=_COUNTED, reserved=tx))
            batches.append((wid + 1, frames))
    return batches


def test_lossless_counted_batches_take_the_vector_path(monkeypatch):
    """The common case (every gradient counted, nothing lost): no frame through the per-frame path; each result
    names the previous completion, the first of each batch the register's, the counters wrap at 128."""
    rng = np.random.default_rng(5)
    one, batch = _pipeline(), _pipeline()
    per_frame = []
    real = InaPipeline._process
    monkeypatch.setattr(InaPipeline, "_process", lambda self, port, f: per_frame.append(f) or real(self, port, f))
    results = []
    for port, frames in _counted_rounds(range(40, 75), 120, rng):  # counters 120 ... past 127
        expected = [out for f in frames for out in real(one, port, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, port, _as_rows(frames), vector_min=1, as_block=True)
        assert isinstance(got, pipeline_batch.FrameBlock)
        assert got.as_list() == expected
        results += expected
        assert _state(batch) == _state(one)
    assert per_frame == []
    heads = [wire.unpack_header(f, wire.INA_OFFSET) for _, f in results[::4]]  # one replica per result
    assert [h.seq for h in heads] == list(range(160, 300))
    assert heads[0].flags == 0 and heads[0].reserved == 0
    assert all(h.flags == wire.Flags.PREV_DONE and h.reserved == (h.seq - 1) & 0x7F for h in heads[1:])
    assert batch.ina_last_done[1] == 3 << 8 | 0x80 | (299 & 0x7F)
    assert [batch.ina_tx_next[32 + wid] for wid in range(4)] == [3 << 8 | 0x80 | ((120 + 35 * 4) % 128)] * 4


def test_counters_of_another_generation_read_as_none_in_the_vector_path(monkeypatch):
    """Registers holding job 1's earlier generation (2; it is 3 now): the first counted frames are in sequence
    whatever their counters and the first completion names no previous one, in the vector path as frame by frame."""
    rng = np.random.default_rng(6)
    one, batch = _pipeline(), _pipeline()
    for p in (one, batch):
        for wid in range(4):
            p.ina_tx_next[32 + wid] = 2 << 8 | 0x80 | 90  # 5 would be a gap of 43 in generation 3
        p.ina_last_done[1] = 2 << 8 | 0x80 | 7
    per_frame = []
    real = InaPipeline._process
    monkeypatch.setattr(InaPipeline, "_process", lambda self, port, f: per_frame.append(f) or real(self, port, f))
    results = []
    for port, frames in _counted_rounds(range(40, 44), 5, rng):
        expected = [out for f in frames for out in real(one, port, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, port, _as_rows(frames), vector_min=1, as_block=True)
        assert got.as_list() == expected
        results += expected
        assert _state(batch) == _state(one)
    assert per_frame == []
    heads = [wire.unpack_header(f, wire.INA_OFFSET) for _, f in results[::4]]
    assert heads[0].flags == 0 and heads[0].reserved == 0
    assert not [f for _, f in results if len(f) == wire.INA_QUERY_FRAME_LEN]  # no gap report
    assert [batch.ina_tx_next[32 + wid] for wid in range(4)] == [3 << 8 | 0x80 | (5 + 16) % 128] * 4


def test_a_lost_frame_sends_its_batch_one_frame_at_a_time_with_the_gap_report(monkeypatch):
    """Worker 2 loses its slot 1 frame of round 3: its next frame (slot 2, not completing) becomes the gap report;
    that batch goes one frame at a time, the next ones take the vector path again."""
    rng = np.random.default_rng(6)
    one, batch = _pipeline(), _pipeline()
    outs = []
    for port, frames in _counted_rounds(range(1, 6), 0, rng, lose={(3, 2)}):
        expected = [out for f in frames for out in one.process(port, f)]
        got = batch.process_batch(port, frames)
        assert got == expected
        assert _state(batch) == _state(one)
        outs += got
    reports = [(p, wire.unpack_header(f, wire.INA_OFFSET)) for p, f in outs if len(f) == wire.INA_QUERY_FRAME_LEN]
    assert [(p, h.msg_type, h.flags, h.slot, h.reserved, h.seq) for p, h in reports] == [
        (3, wire.MsgType.STATUS, wire.Flags.GAP, 1, (2 * 4 + 2) % 128, 4 * 3 + 2)]


@pytest.mark.parametrize("loop_max", [pipeline_batch.TX_LOOP_MAX, 0])
@pytest.mark.parametrize("behind", [1, 5, wire.TX_LATE_HALF])
def test_a_late_frame_sends_its_batch_one_frame_at_a_time_without_a_report(monkeypatch, loop_max, behind):
    """Worker 1's round 17 batch ends with a copy of its frame ``behind`` counters behind the one expected next,
    reordered or duplicated by the network (1: the batch's last frame again, whose copy waits; 5: the previous
    round's, answered; 64, the farthest behind, (tx - expected) mod 128 = 64: round 2's, long gone): that batch
    goes one frame at a time, with no gap report and the counter left where it was, so the next batches take the
    vector path again; outputs and state exact."""
    rng = np.random.default_rng(7)
    one, batch = _pipeline(), _pipeline()
    monkeypatch.setattr(pipeline_batch, "TX_LOOP_MAX", loop_max)
    per_frame = []
    real = InaPipeline._process
    monkeypatch.setattr(InaPipeline, "_process", lambda self, port, f: per_frame.append(f) or real(self, port, f))
    sent: list[bytes] = []  # worker 1's frames in order: sent[k] carries counter (100 + k) mod 128
    outs = []
    late = False
    for port, frames in _counted_rounds(range(1, 21), 100, rng):
        if port == 2:
            sent += frames
            if len(sent) == 68:  # round 17
                frames = [*frames, sent[-behind]]
                late = True
        expected = [out for f in frames for out in real(one, port, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, port, frames, vector_min=1)
        assert got == expected
        assert _state(batch) == _state(one)
        outs += got
        assert len(per_frame) == (5 if late else 0)  # only the batch with the late frame, one frame at a time
        if len(sent) == 68 and port == 2:
            assert batch.ina_tx_next[32 + 1] == 3 << 8 | 0x80 | (100 + 68) % 128
    assert not [f for _, f in outs if len(f) == wire.INA_QUERY_FRAME_LEN]  # no gap report, no status
    assert [batch.ina_tx_next[32 + wid] for wid in range(4)] == [3 << 8 | 0x80 | (100 + 80) % 128] * 4
    assert batch.counters["MyIngress.ina_duplicates"][1] == 1


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("loop_max", [pipeline_batch.TX_LOOP_MAX, 0])
def test_two_jobs_and_uncounted_frames_in_one_vectorised_batch(monkeypatch, loop_max, stale):
    """Union batches of whole rounds of both jobs (disjoint slots), each job's completions named in its own order,
    job 2's frames counted in some batches only: every frame on the vector path, outputs and state exact.
    ``stale``: the registers first hold values of earlier generations of both jobs, which read as none."""
    one, batch = _pipeline(), _pipeline()
    if stale:
        for p in (one, batch):
            for w in range(4):
                p.ina_tx_next[32 + w] = 2 << 8 | 0x80 | 50  # job 1 is at generation 3: 100 would be a gap here
            for w in range(2):
                p.ina_tx_next[64 + w] = 9 << 8 | 0x80 | 3  # job 2 at generation 0
            p.ina_last_done[1], p.ina_last_done[2] = 2 << 8 | 0x80 | 77, 9 << 8 | 0x80 | 88
    monkeypatch.setattr(batch, "_process", lambda *a: pytest.fail("a frame took the per-frame path"))
    monkeypatch.setattr(pipeline_batch, "TX_LOOP_MAX", loop_max)
    tx = {(1, w): 100 + w for w in range(4)} | {(2, w): 126 + w for w in range(2)}
    heads = []
    for r in range(6):
        ported = []
        job2_counted = r % 3 != 1
        for job, slots, workers in ((1, (0, 1), 4), (2, (2, 3), 2)):
            for wid in range(workers):
                for slot in slots:
                    counted = job == 1 or job2_counted
                    flags, reserved = (_COUNTED, tx[(job, wid)] % 128) if counted else (0, 5)
                    tx[(job, wid)] += counted
                    ported.append((wid + 1, _frame(wid, job, slot, 10 * r + slot, r & 1, [r + wid + slot] * wire.LANES,
                                                   flags=flags, reserved=reserved)))
        expected = [out for p, f in ported for out in one.process(p, f)]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, np.array([p for p, _ in ported]), [f for _, f in ported], vector_min=1)
        assert got == expected
        assert _state(batch) == _state(one)
        heads += [wire.unpack_header(f, wire.INA_OFFSET) for _, f in got]
    job2 = [h for h in heads[::2] if h.job_id == 2]  # one replica of each (two workers)
    assert [(h.seq, h.flags, h.reserved) for h in job2] == [
        (2, 0, 0), (3, wire.Flags.PREV_DONE, 2), (12, 0, 5), (13, 0, 5), (22, wire.Flags.PREV_DONE, 3),
        (23, wire.Flags.PREV_DONE, 22), (32, wire.Flags.PREV_DONE, 23), (33, wire.Flags.PREV_DONE, 32),
        (42, 0, 5), (43, 0, 5), (52, wire.Flags.PREV_DONE, 33), (53, wire.Flags.PREV_DONE, 52)]
    assert batch.ina_last_done[1] == 3 << 8 | 0x80 | 51 and batch.ina_last_done[2] == 0x80 | 53


@pytest.mark.parametrize("sized_counted", [True, False])
def test_a_counted_frame_of_another_length_in_a_batch(sized_counted):
    """A counted gradient with trailing bytes (still INA: the lengths are in its headers) among whole frames of the
    same worker, counted (the batch goes one frame at a time) or not (only it touches the loss signals' state)."""
    one, batch = _pipeline(), _pipeline()
    flags = _COUNTED if sized_counted else 0
    # counted: every frame after 0 a gap (of 6 frames)
    frames = [_frame(0, 1, s, 1, 1, [s] * wire.LANES, flags=flags, reserved=7 * s) for s in range(4)]
    frames[1] = _frame(0, 1, 1, 1, 1, [1] * wire.LANES, flags=_COUNTED, reserved=7) + b"\x00" * 6  # longer
    expected = [out for f in frames for out in one.process(1, f)]
    with batch.lock:
        got = pipeline_batch.process_batch(batch, 1, frames, vector_min=1)
    assert got == expected
    assert [f[wire.INA_OFFSET] for _, f in got] == [wire.MsgType.STATUS] * (3 if sized_counted else 0)
    assert _state(batch) == _state(one)
