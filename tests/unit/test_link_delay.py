"""Link delay (softswitch/link_delay.py): parsing, per-port order, release at the deadline, the timerfd."""
from __future__ import annotations

import select
import time

import pytest

from softswitch.link_delay import DeadlineTimer, DelayLine, LinkDelay, parse_link_delays


def test_parse_global_and_per_port_milliseconds():
    d = parse_link_delays(["10", "3:0", "2:2.5"])
    assert d.default == 0.010 and dict(d.per_port) == {2: 0.0025, 3: 0.0}
    assert d.seconds(1) == 0.010 and d.seconds(3) == 0.0 and d.active
    assert not parse_link_delays([]).active and not parse_link_delays(["0"]).active
    assert "10 ms on every port" in d.describe()


@pytest.mark.parametrize("text, needle", [("x", "MS or PORT:MS"), ("-1", "not within"), ("600:1", "9-bit"),
                                          ("1e9", "not within"), ("a:1", "MS or PORT:MS")])
def test_parse_refuses_mistakes(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_link_delays([text])


def test_frames_wait_their_port_delay_in_both_directions_and_keep_their_order():
    line = DelayLine(LinkDelay(0.010, ((2, 0.030), (3, 0.0))))
    assert not line.hold_in(3, b"now", 0.0) and not line.hold_out(3, b"now", 0.0)
    for i in range(5):
        assert line.hold_in(1, b"a%d" % i, 1.0 + i * 0.001)
        assert line.hold_in(2, b"b%d" % i, 1.0 + i * 0.001)
    assert line.next_deadline() == pytest.approx(1.010)
    assert line.due_in(1.0099) == {}
    assert line.due_in(1.012) == {1: [b"a0", b"a1", b"a2"]}
    assert line.due_in(1.0305) == {1: [b"a3", b"a4"], 2: [b"b0"]}
    assert line.due_in(2.0) == {2: [b"b1", b"b2", b"b3", b"b4"]}
    assert line.held == 0 and line.next_deadline() is None
    for i in range(3):
        line.hold_out(1, b"o%d" % i, 5.0)  # same instant: order by arrival
    assert line.due_out(5.009) == [] and line.due_out(5.010) == [(1, b"o0"), (1, b"o1"), (1, b"o2")]
    assert line.held_most == 10


def test_the_switchs_own_time_is_spent_inside_the_delay_and_each_port_keeps_its_order():
    """Outputs of frames released late count as emitted at the releasing frame's deadline, never later than now."""
    line = DelayLine(LinkDelay(0.005))
    assert line.emission_time(7.0) == 7.0  # nothing released: now
    line.hold_in(1, b"g0", 1.000)
    line.hold_in(2, b"g1", 1.001)
    assert line.due_in(1.0072) == {1: [b"g0"], 2: [b"g1"]}  # the loop woke 1.2 ms after the last deadline
    emitted = line.emission_time(1.0075)
    assert emitted == pytest.approx(1.006)
    assert line.emission_time(1.0075) == 1.0075  # consumed
    line.hold_out(3, b"r0", emitted)
    assert line.due_out(1.0109) == [] and line.due_out(1.011) == [(3, b"r0")]  # 5 ms after 1.006, not after 1.0075
    # an output emitted "earlier" than the port's last one waits behind it (no reordering on a port)
    line.hold_out(4, b"late", 2.000)
    line.hold_out(4, b"early", 1.999)
    line.hold_out(5, b"other port", 1.999)
    assert line.due_out(2.0045) == [(5, b"other port")]
    assert line.due_out(2.005) == [(4, b"late"), (4, b"early")]


@pytest.mark.local
def test_the_timer_fires_at_the_deadline_not_before():
    import time

    timer = DeadlineTimer()
    if timer.fd < 0:
        pytest.skip("no timerfd here")
    try:
        ep = select.epoll()
        ep.register(timer.fd, select.EPOLLIN)
        start = time.monotonic()
        deadline = start + 0.02
        timer.arm(deadline, start)
        timer.arm(deadline + 1.0, start)  # a later deadline does not postpone the armed one
        events = []
        while not events:
            events = ep.poll(5.0)
        assert time.monotonic() >= deadline
        timer.clear()
        assert timer.timeout(deadline, start) == -1.0
        ep.close()
    finally:
        timer.close()


class _FailingPipeline:
    """A pipeline whose processing raises (a bug, or a frame it cannot handle)."""

    def process(self, port, frame):
        raise RuntimeError("pipeline failed")

    def process_frames(self, port, frames):
        raise RuntimeError("pipeline failed")


@pytest.mark.parametrize("fast", [True, False])
def test_a_release_whose_processing_raises_leaves_no_emission_time_behind(fast):
    """Outputs of frames released from the delay count as emitted at the release's emission time; when processing
    raises, that time is cleared, so nothing processed later is timed from the failed release."""
    from softswitch.dataplane import DataPlane

    dp = DataPlane(_FailingPipeline(), {}, link_delay=LinkDelay(0.005))
    assert dp.delay.hold_in(1, b"frame", time.monotonic() - 1.0)  # due long ago
    with pytest.raises(RuntimeError, match="pipeline failed"):
        dp.loop.release_held([], not fast)
    assert dp.loop.emitted_at is None and dp.delay.held == 0


class _PacketSocket:
    """A port's packet socket whose kernel dropped ``drops`` frames at its full receive buffer."""

    def __init__(self, drops: int) -> None:
        self.drops, self.closed = drops, False

    def getsockopt(self, level, name, size):
        import struct

        from softswitch.port_socket import PACKET_STATISTICS, SOL_PACKET

        assert (level, name, size) == (SOL_PACKET, PACKET_STATISTICS, 8)
        return struct.pack("=II", 100, self.drops)

    def close(self) -> None:
        self.closed = True


def test_closing_logs_the_frames_a_port_lost_to_a_full_receive_buffer(caplog):
    """Frames the kernel dropped before the switch read them are named when the switch stops: a lossless run's gap
    reports can only name those (tests/integration/test_experiments.py)."""
    import logging

    from softswitch.dataplane import DataPlane

    dp = DataPlane(_FailingPipeline(), {1: "a", 2: "b"})
    dp.sockets.update({1: _PacketSocket(3), 2: _PacketSocket(0)})
    socks = list(dp.sockets.values())
    with caplog.at_level(logging.WARNING, logger="ina-switch"):
        dp.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["port 1: 3 frames lost to a full receive buffer (kernel)"] and all(s.closed for s in socks)
