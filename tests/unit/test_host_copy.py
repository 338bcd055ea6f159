"""A Rina host member's copy in a child process of its own: it binds there (a taken address fails at once, with
the reason), answers requests, stops cleanly, and when it dies the agent hears of it (``HostCopyFailed``)."""
from __future__ import annotations

import os
import signal
import socket

import pytest

from host_agent.grant import Worker
from host_agent.host_member import CopyMode, HostCopy, HostCopyFailed
from inaproto.rina_ring import host_copy_port


def _worker() -> Worker:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a free port whose copy port is free too
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1] % 20000 + 20000
    return Worker(1, "127.0.0.1", port)


def test_a_copy_in_its_own_process_reports_and_stops_cleanly():
    me = _worker()
    copy = HostCopy(me, (me,), mode=CopyMode.PROCESS)
    try:
        assert copy.report()["frames"] == 0
        assert copy.cpu_report()["host_copy_mode"] == "process"
    finally:
        copy.close()
    assert copy._proc.exitcode == 0
    assert copy.report()["frames"] == 0  # the last report, kept after close


def test_a_taken_address_fails_in_the_parent_with_the_reason():
    me = _worker()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", host_copy_port(me.udp_port)))
        with pytest.raises(OSError, match="cannot bind its host-member copy"):
            HostCopy(me, (me,), mode=CopyMode.PROCESS)


def test_a_dead_copy_process_fails_the_agents_next_request():
    me = _worker()
    copy = HostCopy(me, (me,), mode=CopyMode.PROCESS)
    try:
        os.kill(copy._proc.pid, signal.SIGKILL)
        copy._proc.join(timeout=10)
        with pytest.raises(HostCopyFailed, match="exited"):
            copy.report()
    finally:
        copy.close()
