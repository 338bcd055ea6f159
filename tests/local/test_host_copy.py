"""A Rina host member's copy in a child process of its own: it binds there (a taken address fails at once, with
the reason), answers requests, stops cleanly, and when it dies the agent hears of it (``HostCopyFailed``)."""
from __future__ import annotations

import os
import signal
import socket

import pytest

from host_agent.grant import Worker
from host_agent.host_member import HostCopy, HostCopyFailed
from inaproto.rina_ring import host_copy_port


def _worker() -> Worker:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a free port whose copy port is free too
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1] % 20000 + 20000
    return Worker(1, "127.0.0.1", port)


def test_a_copy_in_its_own_process_reports_and_stops_cleanly():
    me = _worker()
    copy = HostCopy(me, (me,))
    try:
        assert copy.report()["frames"] == 0 and copy.cpu_report()["host_copy_frames"] == 0
    finally:
        copy.close()
    assert copy._proc.exitcode == 0
    assert copy.report()["frames"] == 0  # the last report, kept after close


def test_a_taken_address_fails_in_the_parent_with_the_reason():
    me = _worker()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", host_copy_port(me.udp_port)))
        with pytest.raises(OSError, match="cannot bind its host-member copy"):
            HostCopy(me, (me,))


def test_a_dead_copy_process_fails_the_agents_next_request():
    me = _worker()
    copy = HostCopy(me, (me,))
    try:
        os.kill(copy._proc.pid, signal.SIGKILL)
        copy._proc.join(timeout=10)
        with pytest.raises(HostCopyFailed, match="host-member copy"):
            copy.report()
    finally:
        copy.close()


def test_drain_sources_gives_each_read_with_its_sender_and_segment_size():
    """The copy's drain: several senders' datagrams (one sending a GSO run, coalesced by the kernel where it has
    GRO), each read with its source; the segments rebuild every datagram, in order per sender."""
    import select

    from host_agent.udp_io import DatagramIo

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        io = DatagramIo(rx, batched=True, name="test copy")
        for s in senders:
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
        run = bytes(range(142)) * 5
        DatagramIo(senders[0], batched=True, name="test sender").send_run(memoryview(run), 142, 5, rx.getsockname())
        senders[1].sendto(b"x" * 30, rx.getsockname())
        got: dict[tuple[str, int], list[bytes]] = {}
        buf = bytearray(1 << 18)
        poll = select.poll()
        poll.register(rx, select.POLLIN)
        while sum(map(len, got.values())) < 6 and poll.poll(2000):
            def on_read(off: int, n: int, seg: int, src) -> None:
                data = bytes(buf[off : off + n])
                got.setdefault(src, []).extend(data[i : i + seg] for i in range(0, n, seg))

            io.drain_sources(memoryview(buf), on_read)
        assert got[senders[0].getsockname()] == [bytes(range(142))] * 5
        assert got[senders[1].getsockname()] == [b"x" * 30]
    finally:
        rx.close()
        for s in senders:
            s.close()


def test_a_child_that_died_still_gives_a_report_after_close():
    me = _worker()
    copy = HostCopy(me, (me,))
    os.kill(copy._proc.pid, signal.SIGKILL)
    copy._proc.join(timeout=10)
    copy.close()
    report = copy.cpu_report()
    assert report["host_copy_frames"] == 0 and report["host_copy_cpu_seconds"] == 0.0
    assert "host-member copy" in copy.report()["error"]
