"""The unit tier's rule, enforced: a unit test opens no socket, starts no thread or process and never sleeps.

While a unit test (its fixtures included) runs, ``confined()`` makes each of those raise ``TierViolation``
naming what was attempted, so a test that needs one fails at once and belongs in ``tests/local`` (or a tier
further out) instead of slowing or shaking the unit tier.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

__all__ = ["TierViolation", "confined"]


class TierViolation(RuntimeError):
    """A unit test tried to use the operating system's sockets, threads, processes or clock."""


def _refuse(what: str, original):
    """``original`` for threads other than the main one (a thread an earlier tier left behind); a
    ``TierViolation`` for the test itself."""

    def refused(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return original(*args, **kwargs)
        raise TierViolation(f"a unit test {what}: it belongs in tests/local (loopback sockets, threads, "
                            "processes) or a tier further out (see tests/conftest.py)")

    return refused


# (object, attribute, what the test attempted)
_GUARDED = (
    (socket.socket, "__init__", "opened a socket"),
    (socket, "socketpair", "opened a socket pair"),
    (socket, "create_connection", "opened a connection"),
    (threading.Thread, "start", "started a thread"),
    (subprocess.Popen, "__init__", "started a process"),
    (os, "fork", "forked"),
    (os, "posix_spawn", "started a process"),
    (time, "sleep", "slept"),
)


@contextlib.contextmanager
def confined() -> Iterator[None]:
    """Sockets, threads, processes and sleeps raise ``TierViolation`` inside the block."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in _GUARDED]
    try:
        for (obj, name, what), (_, _, original) in zip(_GUARDED, saved):
            setattr(obj, name, _refuse(what, original))
        yield
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)
