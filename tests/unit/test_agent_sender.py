"""The INA sender's timing on a fake clock: RTO (RFC 6298, Karn, backoff), RACK loss detection, spurious
resends, the congestion window."""
from __future__ import annotations

import json

import numpy as np
import pytest

from host_agent.congestion import CongestionWindow
from host_agent.flight import REORDER_FLOOR, REORDER_SHARE, Flight
from host_agent.rtt import MAX_BACKOFF, RttEstimator
from host_agent.stats import StreamStats


def test_rto_follows_rfc6298_from_the_first_sample() -> None:
    est = RttEstimator(0.05, 0.001, 1.0, granularity=0.0001)
    assert est.rto == 0.05
    est.sample(0.010)
    assert est.srtt == 0.010 and est.rttvar == 0.005 and est.rto == pytest.approx(0.030)
    floor = RttEstimator(0.05, 0.010, 1.0)
    floor.sample(0.020)
    for _ in range(50):
        floor.sample(0.020)
    assert floor.rto == pytest.approx(0.030)  # rto_min is the least margin above SRTT
    est.sample(0.018)  # rttvar = 3/4 * 5 + 1/4 * 8 = 5.75 ms; srtt = 7/8 * 10 + 1/8 * 18 = 11 ms
    assert est.rttvar == pytest.approx(0.00575) and est.srtt == pytest.approx(0.011)
    assert est.rto == pytest.approx(0.011 + 4 * 0.00575)
    assert est.min_rtt == 0.010 and est.path_rtt == 0.010


def test_rto_follows_queueing_and_stays_within_bounds() -> None:
    est = RttEstimator(0.05, 0.01, 0.2)
    est.sample(0.001)
    assert est.rto == pytest.approx(0.011)  # SRTT + rto_min
    for k in range(200):  # a queue builds up: round trips grow to 100 ms
        est.sample(0.001 + k * 0.0005)
    assert est.srtt > 0.08 and est.rto > est.srtt
    for _ in range(100):
        est.sample(5.0)
    assert est.rto == 0.2  # rto_max


def test_backoff_doubles_until_a_sample_and_is_capped() -> None:
    est = RttEstimator(0.05, 0.001, 100.0)
    est.sample(0.010)
    base = est.rto
    est.expired()
    est.expired()
    assert est.rto == pytest.approx(4 * base)
    for _ in range(20):
        est.expired()
    assert est.rto == pytest.approx(MAX_BACKOFF * base)
    est.sample(0.010)
    assert est.backoff == 1


def test_many_samples_per_round_move_the_estimate_less_each() -> None:
    one, many = RttEstimator(0.05, 0.001, 1.0), RttEstimator(0.05, 0.001, 1.0)
    one.sample(0.010)
    many.sample(0.010)
    one.sample(0.020)
    many.sample(0.020, per_round=8)
    assert 0.010 < many.srtt < one.srtt


def _flight(K: int = 32, granted: int = 32, path: float = 0.010, trace: bool = False
            ) -> tuple[Flight, StreamStats, RttEstimator]:
    est = RttEstimator(0.05, 0.010, 1.0)  # StreamOptions' defaults
    est.sample(path)
    stats = StreamStats()
    return Flight(K, 0, est, CongestionWindow(initial=granted), granted, stats, trace=trace), stats, est


def test_rack_finds_a_hole_after_the_reorder_window_and_not_before() -> None:
    fl, _, _est = _flight()
    got = np.zeros(32, dtype=np.uint8)
    queued = bytearray(32)
    fl.sent(0, 8, 1.000)
    for i in (0, 1, 3, 4):  # chunk 2 missing
        got[i] = 1
        fl.delivered(i, 1.010)
    assert fl.rack_i == 4 and fl.rack_rtt == pytest.approx(0.010)
    reo = fl.reorder_window()
    assert reo == pytest.approx(max(0.010 * REORDER_SHARE, REORDER_FLOOR))
    assert fl.lost(got, 2, 8, 1.010, queued) == []  # not overdue yet
    assert fl.rack_timer == pytest.approx(1.000 + 0.010 + reo)
    assert fl.lost(got, 2, 8, fl.rack_timer, queued) == [2]  # 5..7 were sent after 4: not evidence


def test_queued_results_arriving_in_order_are_never_lost_and_restart_the_timer() -> None:
    """A window of 64 chunks through a link of 5 ms per frame (a 2 ms path): no RACK, no timeout."""
    fl, stats, est = _flight(K=64, granted=64, path=0.002)
    got = np.zeros(64, dtype=np.uint8)
    queued = bytearray(64)
    fl.sent(0, 64, 0.0)
    for i in range(64):
        now = 0.002 + 0.005 * (i + 1)
        assert now < fl.rto_deadline(i)  # the oldest outstanding chunk is i, its result arrives in time
        got[i] = 1
        fl.delivered(i, now)
        assert fl.lost(got, i + 1, 64, now, queued) == []
    assert stats.spurious_resends == 0
    assert est.srtt > 0.05  # the estimate followed the queueing


def test_timer_restarts_on_every_new_result() -> None:
    fl, _, est = _flight(path=0.010)
    fl.sent(0, 4, 1.0)
    assert fl.rto_deadline(0) == pytest.approx(1.0 + est.rto)
    fl.delivered(1, 1.5)  # a late result (its sample raises the RTO too)
    assert fl.rto_deadline(0) == pytest.approx(1.5 + est.rto)


def test_spurious_resends_counted_at_the_first_result_or_a_second_one() -> None:
    fl, stats, _ = _flight(path=0.010)
    fl.sent(0, 4, 1.0)
    fl.resent(0, 1.030, early=False)
    fl.delivered(0, 1.032)  # 2 ms after the resend: the original's result
    assert stats.spurious_resends == 1
    fl.resent(1, 1.030, early=False)
    fl.delivered(1, 1.045)  # could be the resend's answer: not counted ...
    assert stats.spurious_resends == 1
    fl.duplicate(1)  # ... until the switch answers the resend too
    fl.duplicate(1)
    assert stats.spurious_resends == 2
    fl.resent(2, 1.030, early=True)
    fl.delivered(2, 1.031)
    assert stats.spurious_resends == 3 and fl.reorder_mult == 1  # the reorder window stays (Flight.reorder_window)


def test_delivered_many_equals_one_at_a_time() -> None:
    a, sa, _ = _flight()
    b, sb, _ = _flight()
    for f in (a, b):
        f.sent(0, 16, 1.0)
        f.resent(5, 1.020, early=True)
        f.resent(6, 1.005, early=False)
    sel = np.array([3, 1, 5, 6, 9, 2])
    for i in sel:
        a.delivered(int(i), 1.022)
    b.delivered_many(sel, 1.022)
    # RACK from chunks sent once only (5 and 6 were resent)
    assert (a.rack_i, a.rack_xmit, a.rack_rtt) == (b.rack_i, b.rack_xmit, b.rack_rtt) == (9, 1.0, pytest.approx(0.022))
    assert sa.spurious_resends == sb.spurious_resends == 1
    # chunk 6 was a timeout's probe, but a first send's result (9) came with it: a late peer, not an answer
    assert not a.probe_answered and not b.probe_answered
    for f in (a, b):
        f.resent(7, 1.030, early=False)
    a.delivered(7, 1.045)
    b.delivered_many(np.array([7]), 1.045)
    assert a.probe_answered and b.probe_answered  # nothing else came: answered


def test_after_an_answered_probe_the_next_timeout_resends_every_overdue_chunk() -> None:
    fl, _, est = _flight(K=8, granted=8, path=0.010)
    got = np.zeros(8, dtype=np.uint8)
    queued = bytearray(8)
    fl.sent(0, 8, 1.0)
    assert not fl.probe_answered
    fl.resent(0, 1.1, early=False)  # the timer's probe
    got[0] = 1
    fl.delivered(0, 1.12)
    assert fl.probe_answered
    now = fl.rto_deadline(1)
    assert now == pytest.approx(1.12 + est.rto)  # restarted by the probe's answer
    assert fl.on_timeout(got, 1, 8, now, queued) == list(range(1, 8))
    assert not fl.probe_answered


def test_a_timeout_probes_when_nothing_came_back_and_resends_a_lost_tail_at_once() -> None:
    fl, _, _est = _flight(K=10, granted=10, path=0.010)
    got = np.zeros(10, dtype=np.uint8)
    queued = bytearray(10)
    fl.sent(0, 4, 1.0)
    now = fl.rto_deadline(0)
    assert fl.on_timeout(got, 0, 4, now, queued) == [0]  # nothing came back since: a late peer? probe
    fl.sent(4, 8, 2.0)
    got[:4] = 1
    fl.delivered(3, 2.005)  # results flowed after chunks 4..7 were sent, then stopped: 4..7 are behind 3
    now = fl.rto_deadline(4)
    assert fl.on_timeout(got, 4, 8, now, queued) == [4]  # a probe: they may be queued or wait for a late peer
    fl.sent(8, 10, 2.001)
    got[8] = 1
    fl.delivered(8, 2.012)  # chunk 8, sent after 4..7, overtook them: they are lost
    now = fl.rto_deadline(4)
    assert fl.on_timeout(got, 4, 10, now, queued) == [4, 5, 6, 7]


def test_a_stalled_window_probes_its_tail_once_per_stall() -> None:
    fl, _, est = _flight(K=8, granted=8, path=0.010)
    fl.sent(0, 8, 1.0)
    fl.delivered(3, 1.010)
    d = fl.tail_deadline(4)
    assert d == pytest.approx(1.010 + max(2 * est.recent_min + fl.reorder_window(), est.rto_min)) and d < fl.rto_deadline(4)
    fl.tail_probed = True
    assert fl.tail_deadline(4) == float("inf")
    fl.delivered(4, 1.05)  # a new result re-arms it
    assert fl.tail_deadline(5) < float("inf")


def test_backoff_ends_with_any_new_result() -> None:
    fl, _, est = _flight()
    fl.sent(0, 2, 1.0)
    fl.resent(0, 1.05, early=False)
    est.expired()
    assert est.backoff == 2
    fl.delivered(0, 1.2)  # a resent chunk: no sample (Karn), but the path works
    assert est.backoff == 1 and est.samples == 1


def test_window_grows_while_round_trips_stay_flat() -> None:
    cw = CongestionWindow(initial=4)
    now = 0.0
    for _ in range(50):
        now += 0.010
        cw.on_results(0.010, int(cw.cwnd), now, 0.010, 0.010, 256)
    assert cw.limit(256) == 256 and cw.cuts == 0
    assert cw.limit(16) == 16


def test_path_rtt_never_below_the_floor_and_the_floor_survives_a_reset() -> None:
    est = RttEstimator(0.05, 0.010, 1.0, path_floor=0.003)
    assert est.path_rtt == 0.05 / 4  # no sample yet
    est.sample(0.001)  # a chunk that crossed every link on burst tokens
    assert est.min_rtt == 0.001 and est.path_rtt == 0.003
    est.sample(0.005)
    assert est.path_rtt == 0.003
    est.reset()
    est.sample(0.0005)
    assert est.path_rtt == 0.003
    plain = RttEstimator(0.05, 0.010, 1.0)
    plain.sample(0.001)
    assert plain.path_rtt == 0.001


def test_a_path_floor_keeps_a_longer_paths_normal_round_trip_from_reading_as_a_queue() -> None:
    """A tree path: 3.5 ms at the link rate, while burst samples put the minimum at 1 ms. Built on the minimum
    the target (1 + 2 ms) is below every round's shortest round trip and the window is cut; on the floor it is not."""
    for floor, cut in ((0.0, True), (0.003, False)):
        est = RttEstimator(0.05, 0.010, 1.0, path_floor=floor)
        est.sample(0.001)
        cw = CongestionWindow(initial=8)
        now = 0.0
        for _ in range(40):
            now += 0.0035
            cw.on_results(0.0035, int(cw.cwnd), now, est.path_rtt, 0.0035, 16)
        assert (cw.cuts > 0) is cut


def test_window_shrinks_when_round_trips_grow_and_settles() -> None:
    """A 10 ms path behind a queue of 1 ms per chunk in flight beyond 10: the window settles near the BDP."""
    cw = CongestionWindow(initial=4, queue_allowance=0.004)
    now = 0.0
    sizes = []
    for _ in range(300):
        w = cw.limit(256)
        rtt = 0.010 + max(0, w - 10) * 0.001
        now += rtt
        cw.on_results(rtt, w, now, 0.010, rtt, 256)
        sizes.append(cw.limit(256))
    tail = sizes[-100:]
    assert cw.cuts > 0 and max(tail) <= 24 and min(tail) >= 8


def test_random_loss_never_shrinks_the_window_and_a_queue_does_once_per_round() -> None:
    """Loss on a path without a queue (random drops) leaves the window alone however often it comes; with a
    queue above the target a loss cuts by the delay rule, at most once per round (ATP: marks, not drops)."""
    cw = CongestionWindow(initial=64)
    now = 0.0
    for _ in range(40):  # a round trip of flat 10 ms rounds, a loss (or a timeout) in every one of them
        now += 0.010
        cw.on_results(0.010, 8, now, 0.010, 0.010, 256)
        cw.on_loss(now + 0.001, 0.010, 0.010)
        cw.on_timeout(now + 0.002, 0.010, 0.010)
    assert cw.cuts == 0 and cw.loss_cuts == 0 and cw.limit(256) >= 64
    q = CongestionWindow(initial=64)
    q.on_results(0.010, 1, 0.010, 0.010, 0.010, 256)  # a flat round ends; the next ends at 20 ms
    q.on_results(0.020, 1, 0.015, 0.010, 0.010, 256)  # 20 ms: 10 ms of queue, above the target (12.5 ms)
    w = q.cwnd
    q.on_loss(0.016, 0.010, 0.010)
    cut = min(0.5, 0.8 * (0.020 - 0.0125) / 0.020)
    assert q.cwnd == pytest.approx(w * (1 - cut)) and q.loss_cuts == 1
    q.on_loss(0.018, 0.010, 0.010)  # the same round: no second cut
    q.on_timeout(0.019, 0.010, 0.010)
    q.on_results(0.020, 1, 0.021, 0.010, 0.010, 256)  # nor at the round's end, by the delay rule
    assert q.cwnd == pytest.approx(w * (1 - cut)) and q.cuts == 1


def test_the_queue_target_is_a_quarter_round_trip_above_the_path() -> None:
    """At 10 ms the window stops growing once the shortest round trip exceeds 12.5 ms (a queue of a quarter
    round trip); at 2 ms the 2 ms floor of the allowance applies."""
    for path, target in ((0.010, 0.0125), (0.002, 0.004)):
        for rtt, shrinks in ((target * 0.99, False), (target * 1.05, True)):
            cw = CongestionWindow(initial=32)
            cw.on_results(path, 1, 0.0, path, path, 64)  # the first round
            before = cw.cwnd
            cw.on_results(rtt, 1, 2 * path + 0.001, path, path, 64)
            assert (cw.cwnd < before) is shrinks, (path, rtt)


def test_the_last_chunks_of_a_window_are_probed_after_one_round_trip_a_stall_before_them_after_two() -> None:
    """All chunks sent and the oldest was in flight when the latest result came: the window's own tail,
    probed after one shortest round trip and two reorder windows; a stall with chunks still to send (every
    chunk a tail at window 1, where a descheduled peer looks like a loss) waits two round trips; a resend
    is resent again after the short wait."""
    fl, _, est = _flight()
    fl.sent(0, 8, 1.000)
    for i in range(6):
        fl.delivered(i, 1.010)
    reo = fl.reorder_window()
    short = max(est.recent_min + 2 * reo, est.rto_min)
    assert fl.tail_deadline(6, all_sent=True) == pytest.approx(1.010 + short)
    assert fl.tail_deadline(6, all_sent=False) == pytest.approx(1.010 + max(2 * est.recent_min + reo, est.rto_min))
    assert fl.tail_deadline(6, all_sent=True) < fl.tail_deadline(6, all_sent=False) < fl.rto_deadline(6)
    assert fl.resend_timeout() == pytest.approx(short)
    one, _, _ = _flight()
    one.sent(0, 1, 1.000)
    one.delivered(0, 1.010)
    one.sent(1, 2, 1.011)  # window 1: sent after the latest result, a tail only by position
    assert one.tail_deadline(1, all_sent=True) == pytest.approx(1.011 + max(2 * est.recent_min + reo, est.rto_min))


def _stalled_rounds(cw: CongestionWindow, rounds: int, stall_every: int) -> list[int]:
    """A 10 ms path at 1 chunk/ms (BDP 10 chunks) behind a queue the window makes (1 ms per chunk in flight
    beyond 10), and every ``stall_every``-th round a peer stalls for 20 ms (an INA round trip waits for the
    slowest worker): the window's sizes after each round."""
    now, sizes = 0.0, []
    for r in range(rounds):
        w = cw.limit(64)
        rtt = 0.010 + max(0, w - 10) * 0.001 + (0.020 if r % stall_every == stall_every - 1 else 0.0)
        now += rtt
        cw.on_results(rtt, w, now, 0.010, rtt, 64)
        sizes.append(cw.limit(64))
    return sizes


def test_a_stalled_peer_never_cuts_the_window_below_the_bdp() -> None:
    """Round trips long because a peer stalled (no queue of this window's making) leave the window at or
    above the delivery rate x the path's round trip (the BDP, 10 chunks here): cutting below it would only
    idle the link. Its own queue is still cut back (the window stays near the BDP plus the allowance)."""
    cw = CongestionWindow(initial=8)
    sizes = _stalled_rounds(cw, 200, stall_every=5)  # (the window before the floor: 4 chunks)
    assert min(sizes[20:]) >= 10  # never below the BDP once the link was full
    assert max(sizes[-50:]) <= 16 and cw.cuts > 0  # its own queue still cut to about the target (12.5 + 1)


def test_the_window_is_never_cut_below_its_floor_by_a_loss() -> None:
    """A loss in a round with a queue cuts by the delay rule, but not below the delivery rate x the path's
    round trip."""
    cw = CongestionWindow(initial=16)
    cw.on_results(0.010, 16, 0.010, 0.010, 0.010, 64)  # first round ends: the next starts here
    cw.on_results(0.010, 16, 0.026, 0.010, 0.010, 64)  # 16 chunks in 16 ms: 1000 chunks/s
    assert cw.floor(0.010) == 10  # 1000/s x 10 ms
    cw.on_results(0.030, 1, 0.027, 0.010, 0.010, 64)  # 30 ms: far above the target
    cw.on_loss(0.028, 0.010, 0.010)
    assert cw.limit(64) >= 10


def test_a_timeout_during_a_stall_behind_a_queue_probes_one_chunk_not_the_queue() -> None:
    """A window of 64 chunks queued behind a 0.7 ms/frame link; the results stop for longer than the timeout
    after chunk 19 (a peer descheduled): the timer probes chunk 20, never the 44 chunks merely behind it,
    and the probe's answer followed by the rest of the window is no reason to resend the rest."""
    fl, _stats, _est = _flight(K=64, granted=64, path=0.010)
    got = np.zeros(64, dtype=np.uint8)
    queued = bytearray(64)
    fl.sent(0, 64, 1.0)
    now = 1.0
    for i in range(20):
        now = 1.010 + 0.0007 * (i + 1)
        got[i] = 1
        fl.delivered(i, now)
    now = fl.rto_deadline(20)
    assert fl.tail_deadline(20, all_sent=True) <= now  # the tail probe came first ...
    assert fl.on_timeout(got, 20, 64, now, queued) == [20]  # ... and the timer too probes one chunk
    fl.resent(20, now, early=False)
    got[20] = 1
    fl.delivered(20, now + 0.012)  # the peer is back: its original completes chunk 20 ...
    assert fl.probe_answered
    got[21] = 1
    fl.delivered(21, now + 0.0127)  # ... and the rest of the window follows
    assert not fl.probe_answered
    later = fl.rto_deadline(22)
    assert fl.on_timeout(got, 22, 64, later, queued) == [22]


def test_a_flight_trace_records_first_sends_resends_and_results(tmp_path) -> None:
    fl, _, _ = _flight(K=4, granted=4, trace=True)
    fl.sent(0, 4, 1.000)
    fl.resent(2, 1.020, early=True)
    for i in (0, 1, 3):
        fl.delivered(i, 1.010)
    fl.delivered(2, 1.031)
    fl.dump_trace(tmp_path, 256, 3, 0.5)
    [f] = list(tmp_path.iterdir())
    rec = json.loads(f.read_text())
    assert rec["worker"] == 3 and rec["first_chunk"] == 256
    assert rec["first_at"] == [0.5] * 4 and rec["result_at"] == [0.51, 0.51, 0.531, 0.51]
    assert rec["resends"] == [[2, 0.52, 1]]


@pytest.mark.parametrize("batch", ["delivered_few", "delivered_many"])
def test_a_flight_trace_records_results_applied_in_batches(tmp_path, batch) -> None:
    """The window applies its results in batches (``delivered_few`` / ``delivered_many``): the trace records them too."""
    fl, _, _ = _flight(K=4, granted=4, trace=True)
    fl.sent(0, 4, 1.000)
    sel = [0, 1, 3]
    getattr(fl, batch)(sel if batch == "delivered_few" else np.array(sel), 1.010)
    fl.dump_trace(tmp_path, 0, 1, 1.0)
    [f] = list(tmp_path.iterdir())
    rec = json.loads(f.read_text())
    assert rec["result_at"] == [0.01, 0.01, -1.0, 0.01]
    assert len(rec["cwnd"]) == 1


def test_a_needless_probe_or_timeout_raises_the_timeout_to_the_originals_round_trip() -> None:
    """RFC 4015's response: the original's result came after the timer's resend, so its round trip (30 ms on a 10 ms
    path: a peer descheduled) is what the timer must allow for next; a needless RACK resend changes nothing."""
    fl, stats, est = _flight(K=8, granted=8, path=0.010)
    fl.sent(0, 8, 1.0)
    rto0 = est.rto
    fl.resent(1, 1.027, early=True)
    fl.delivered(1, 1.028)
    assert stats.spurious_resends == 1 and est.rto == rto0
    fl.resent(0, 1.025, early=False)  # the timer's probe
    fl.delivered(0, 1.030)  # 5 ms later: the original's answer
    assert stats.spurious_resends == 2
    assert est.srtt == pytest.approx(0.030) and est.rttvar == pytest.approx(0.015)
    assert est.rto == pytest.approx(0.030 + 4 * 0.015) and est.rto > rto0


def test_one_chunk_in_flight_in_the_middle_of_a_window_is_left_to_the_timeout() -> None:
    """At a window of 1 a tail probe is the timeout's resend, only sooner and without learning: the timer acts
    (and a needless one raises it); the window's own tail is still probed after one round trip."""
    fl, _, _est = _flight(K=8, granted=1, path=0.010)
    fl.sent(0, 1, 1.000)
    fl.delivered(0, 1.010)
    fl.sent(1, 2, 1.011)
    assert fl.tail_deadline(1, all_sent=False, alone=True) == float("inf")
    assert fl.tail_deadline(1, all_sent=False, alone=False) < fl.rto_deadline(1)
    tail, _, _ = _flight(K=8, granted=8, path=0.010)
    tail.sent(0, 8, 1.000)
    tail.delivered(6, 1.010)
    assert tail.tail_deadline(7, all_sent=True, alone=True) == pytest.approx(1.010 + tail.short_wait())


def test_a_resend_waits_one_smoothed_round_trip_and_a_stall_probe_one_smoothed_round_trip_and_its_variation() -> None:
    """A resend's answer waits for the queue and the skew between workers like any result (SRTT covers them, the
    shortest recent round trip does not); a stall in the middle of a window waits at least SRTT + RTTVAR, so a
    needless probe's lesson (RFC 4015's response raises both) holds for the tail probe too."""
    fl, _, est = _flight(K=64, granted=64, path=0.010)
    fl.sent(0, 40, 1.0)
    for i in range(1, 40):
        fl.delivered(i, 1.0 + 0.010 + (0.012 if i % 2 else 0.0))  # half the results wait 12 ms for a late peer
    assert est.srtt > est.recent_min == pytest.approx(0.010)
    reo = fl.reorder_window()
    assert fl.resend_timeout() == pytest.approx(max(est.srtt + 2 * reo, est.rto_min))
    assert fl.short_wait() == pytest.approx(max(est.recent_min + 2 * reo, est.rto_min))
    assert fl.short_wait() < fl.resend_timeout()
    est.spurious_timeout(0.060)
    assert fl.tail_wait() == pytest.approx(0.060 + 0.030)
