"""The agent's side of the switch's loss signals (docs/agent.md, "Loss signals"): gap reports and results naming the
job's previous completion resend exactly this worker's own losses; RACK leaves a peer's loss to the peer."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from host_agent.chunks import Segment
from host_agent.congestion import CongestionWindow
from host_agent.flight import Flight
from host_agent.ina_window import TX_MOD, ResultBatch, queue_signalled
from host_agent.rtt import RttEstimator
from host_agent.stats import StreamStats
from inaproto import wire

JOB, GEN = 3, 1


class _SenderStub:
    """What ResultBatch uses of an InaSender."""

    def __init__(self) -> None:
        self.stats = StreamStats()
        self.rbatch = bytearray(1 << 16)
        self.txlog = np.full(TX_MOD, -1, dtype=np.int64)
        self.signals_seen = False


def _window(a: int = 1000, K: int = 64, sent: int = 40) -> tuple[ResultBatch, _SenderStub, Flight, bytearray]:
    stub = _SenderStub()
    seg = Segment(a, np.zeros((K, wire.LANES), dtype=np.int32))
    got = bytearray(K)
    est = RttEstimator(0.05, 0.01, 1.0)
    est.sample(0.010)
    flight = Flight(K, 0, est, CongestionWindow(), 32, stub.stats)
    flight.numbered = True
    rb = ResultBatch(stub, seg, got, 0, JOB, GEN, flight)
    flight.sent(0, sent, 1.0)
    rb.sent = sent
    for i in range(sent):  # frame counters 100.. in sending order
        flight.txn[i] = 100 + i
        stub.txlog[(100 + i) % TX_MOD] = a + i
    rb.now = 1.5
    return rb, stub, flight, got


def _feed(rb: ResultBatch, datagrams: list[bytes]) -> None:
    for d in datagrams:
        rb.buf[: len(d)] = d
        kept = rb._on_run(0, len(d), 1)
        if kept:
            rb._apply(kept // wire.INA_PAYLOAD_LEN)


def _result(seq: int, prev: int | None = None) -> bytes:
    flags = int(wire.Flags.PREV_DONE) if prev is not None else 0
    h = wire.InaHeader(int(wire.MsgType.RESULT), flags, JOB, GEN, seq % 32, seq, 0, 0, reserved=prev or 0)
    return wire.encode_payload(h, np.zeros(wire.LANES, dtype=np.int32))


def _gap_report(revealed_tx: int, count: int, seq: int = 0) -> bytes:
    h = wire.InaHeader(int(wire.MsgType.STATUS), int(wire.Flags.GAP), JOB, GEN, count, seq, 0, 0,
                       reserved=revealed_tx % TX_MOD)
    return wire.pack_header(h)


def test_a_gap_report_names_the_chunks_of_the_lost_frames_that_are_still_their_latest_and_unanswered() -> None:
    rb, stub, flight, got = _window()
    got[12] = 1  # the report may name a frame whose chunk has its result (e.g. one the switch answered)
    flight.txn[13] = 200  # chunk 13 went again since: the lost frame is not its latest
    _feed(rb, [_gap_report(100 + 15, 5)])  # frames 110..114 (chunks 10..14) lost before frame 115
    assert rb.signalled == [14, 11, 10] and stub.stats.gap_reports == 1


def test_a_gap_report_never_names_a_chunk_that_went_without_a_counter() -> None:
    """A chunk never numbered (``Flight.txn`` -1, e.g. a skipped lane not sent yet) is not "counter 127" (-1 mod 128)."""
    rb, stub, flight, _got = _window()
    flight.txn[35] = -1
    stub.txlog[127] = 1000 + 35  # the counter value 127 last carried chunk 35 (e.g. of a replay's numbering)
    _feed(rb, [_gap_report(0, 1)])  # the frame numbered 127 before frame 0 was lost
    assert rb.signalled == [] and stub.stats.gap_reports == 1
    flight.txn[35] = 127 + TX_MOD
    _feed(rb, [_gap_report(0, 1)])
    assert rb.signalled == [35]


def test_a_chunk_named_twice_is_queued_once_in_the_order_named() -> None:
    """A gap report and a PREV_DONE (or two reports) may name one chunk: one resend, in the order first named; a chunk
    queued already (by RACK) keeps its place; one with a result is left alone."""
    rb, _stub, _flight, got = _window()
    got[4] = 1
    _feed(rb, [_gap_report(100 + 16, 2), _result(1000 + 20, prev=(1000 + 15) % TX_MOD),
               _gap_report(100 + 14, 1), _result(1000 + 21, prev=(1000 + 4) % TX_MOD)])
    assert rb.signalled == [15, 14, 15, 13]
    queued = bytearray(64)
    queued[13] = 1
    lost: deque[tuple[int, bool]] = deque([(13, True)])
    assert queue_signalled(rb.signalled, got, queued, lost) == 2
    assert list(lost) == [(15, True), (14, True), (13, True)] and rb.signalled == []
    assert [i for i in range(64) if queued[i]] == [13, 14, 15]


def test_a_completion_named_equally_near_two_outstanding_chunks_is_left_alone() -> None:
    """PREV_DONE names 7 bits: when lanes lag 64 chunks or more, the chunks 64 below and 64 above the result's are
    equally plausible; only a single outstanding candidate within half the counter space is resent."""
    rb, _stub, flight, got = _window(K=200, sent=140)
    _feed(rb, [_result(1000 + 70, prev=(1000 + 6) % TX_MOD)])  # 6 = 70 - 64 and 134 = 70 + 64: both outstanding
    assert rb.signalled == []
    got[135] = 1
    _feed(rb, [_result(1000 + 71, prev=(1000 + 7) % TX_MOD)])  # 135 has its result: 7 alone
    assert rb.signalled == [7]
    rb.signalled.clear()
    flight.sent_at[136] = 0.0  # a skipped lane's chunk, not sent yet, cannot have completed: 8 alone
    _feed(rb, [_result(1000 + 72, prev=(1000 + 8) % TX_MOD)])
    assert rb.signalled == [8]
    rb.signalled.clear()
    _feed(rb, [_result(1000 + 80, prev=(1000 + 13) % TX_MOD)])  # 13 is 67 below (beyond half the space), 141 unsent
    assert rb.signalled == []
    flight.resent(10, rb.now - 0.001, early=True)  # two candidates, one just resent: still ambiguous
    _feed(rb, [_result(1000 + 74, prev=(1000 + 10) % TX_MOD)])
    assert rb.signalled == []


def test_a_gap_report_of_another_generation_or_for_frames_never_sent_changes_nothing() -> None:
    rb, stub, _flight, _got = _window()
    h = wire.InaHeader(int(wire.MsgType.STATUS), int(wire.Flags.GAP), JOB, GEN + 1, 2, 0, 0, 0, reserved=20)
    _feed(rb, [wire.pack_header(h)])
    stub.txlog[:] = -1
    _feed(rb, [_gap_report(120, 3)])
    assert rb.signalled == [] and stub.stats.stale == 1


def test_a_result_naming_a_completion_this_worker_missed_resends_that_chunk_once_signals_are_seen() -> None:
    rb, stub, flight, got = _window()
    _feed(rb, [_result(1000 + 5, prev=(1000 + 4) % TX_MOD)])
    assert rb.signalled == [4] and flight.signals and stub.signals_seen
    rb.signalled.clear()
    got[6] = 1
    _feed(rb, [_result(1000 + 7, prev=(1000 + 6) % TX_MOD)])  # it has that one: nothing
    assert rb.signalled == []


def test_a_completion_named_from_an_earlier_call_or_a_chunk_just_resent_is_not_resent() -> None:
    rb, _stub, flight, _got = _window()
    _feed(rb, [_result(1000 + 0, prev=(1000 - 1) % TX_MOD)])  # the previous call's last chunk
    flight.resent(8, rb.now - 0.001, early=True)  # went again a moment ago: its answer is on the way
    _feed(rb, [_result(1000 + 9, prev=(1000 + 8) % TX_MOD)])
    assert rb.signalled == []


def test_a_completion_named_above_the_result_is_found_there() -> None:
    rb, _stub, _flight, _got = _window()
    _feed(rb, [_result(1000 + 3, prev=(1000 + 20) % TX_MOD)])  # a lagging lane completes after a newer chunk
    assert rb.signalled == [20]


def test_without_numbered_frames_the_signals_are_ignored() -> None:
    rb, _stub, flight, _got = _window()
    flight.numbered = False
    _feed(rb, [_gap_report(115, 5), _result(1000 + 5, prev=(1000 + 4) % TX_MOD)])
    assert rb.signalled == [] and not flight.signals


def test_results_in_a_long_batch_are_checked_as_in_a_short_one() -> None:
    out = []
    for vector in (False, True):
        rb, _stub, _flight, got = _window()
        rb.VECTOR_FROM = 0 if vector else 10**9
        data = b"".join(_result(1000 + i, prev=(1000 + i - 1 - (i == 6)) % TX_MOD) for i in (1, 2, 3, 6, 7))
        rb.buf[: len(data)] = data
        rb._apply(5)
        out.append((sorted(rb.signalled), bytes(got)))
    assert out[0] == out[1] and out[0][0] == [0, 4]


def test_a_result_carrying_a_gap_names_the_lost_frames_chunks_in_short_and_long_batches() -> None:
    """The switch delivered this worker's frame 115 (chunk 15) as a completion or an answer and found frames 113
    and 114 (chunks 13, 14) missing: its copy carries GAP, slot = 2 << 7 | 115 % 128. Same in both batch paths."""
    out = []
    for vector in (False, True):
        rb, stub, _flight, got = _window()
        rb.VECTOR_FROM = 0 if vector else 10**9
        h = wire.InaHeader(int(wire.MsgType.RESULT), int(wire.Flags.GAP), JOB, GEN, 2 << 7 | 115 % TX_MOD, 1000 + 15,
                           0, 0)
        data = _result(1000 + 1) + wire.encode_payload(h, np.zeros(wire.LANES, dtype=np.int32)) + _result(1000 + 2)
        rb.buf[: len(data)] = data
        rb._apply(3)
        out.append((rb.signalled, bytes(got), stub.stats.gap_reports))
    assert out[0] == out[1]
    signalled, got, reports = out[0]
    assert signalled == [14, 13] and reports == 1 and [i for i, g in enumerate(got) if g] == [1, 2, 15]


def test_rack_waits_for_a_peers_recovery_before_it_resends_a_hole_once_the_switch_signals() -> None:
    """A hole no signal named is a peer's loss (its recovery takes a resend's round trip) or a lost signal."""
    timers = []
    for signals in (False, True):
        est = RttEstimator(0.05, 0.010, 1.0)
        est.sample(0.010)
        fl = Flight(32, 0, est, CongestionWindow(initial=32), 32, StreamStats())
        fl.signals = signals
        got, queued = np.zeros(32, dtype=np.uint8), bytearray(32)
        fl.sent(0, 8, 1.000)
        for i in (0, 1, 3, 4):
            got[i] = 1
            fl.delivered(i, 1.010)
        assert fl.lost(got, 2, 8, 1.010, queued) == []
        timers.append(fl.rack_timer)
        assert fl.lost(got, 2, 8, fl.rack_timer, queued) == [2]
    assert timers[1] - timers[0] == pytest.approx(fl.peer_wait()) and fl.peer_wait() >= fl.resend_timeout()
