"""Propagation delay on the switch's links (``ina-switch --link-delay``): this kernel has no netem.

A port with a delay of d holds every frame d seconds in *each* direction: a frame received on it enters the
pipeline d after it was read from the socket, and a frame the pipeline sends to it leaves d after it was
emitted. A worker whose only link has delay d therefore sees a round trip of 2 d through the switch (plus
the switch's own time), and a frame that crosses the switch from port A to port B is held d(A) + d(B).

No thread and no sleep per packet: each direction keeps one heap of ``(deadline, sequence, port, frame)``;
the I/O loop releases what is due whenever it wakes up and arms a timer (a timerfd in its epoll set, with
nanosecond resolution; epoll's own millisecond timeout where timerfd is missing) for the earliest deadline.
A port's delay is constant, so its frames' deadlines never decrease and, with the sequence number breaking
ties, every port keeps its order.

The switch's own time is spent inside the delay, not on top of it (``emission_time``): the outputs of frames
released from the ingress line count as emitted at the latest deadline among those frames, not when the Python
loop got round to them. A hardware switch forwards in microseconds; this one wakes up late, runs the pipeline
over a round's frames and competes for two cores with the agents, and without this its time (0.2-1.3 ms a round
trip, more the more frames a round carries: experiment 1's pool-size curve) lengthened every round trip beyond
the link delay plus serialization the experiments model. Frames are never sent early: an output still waits
the egress delay after the deadline of the frame that released it, and each egress port keeps the order its
outputs were emitted in (a deadline is never earlier than the port's previous one).

Example::

    delays = parse_link_delays(["10", "3:0"])      # 10 ms on every port, none on port 3
    line = DelayLine(delays)
    line.hold_in(1, frame, time.monotonic())
    for port, frames in line.due_in(time.monotonic()).items(): ...
"""
from __future__ import annotations

import ctypes
import ctypes.util
import heapq
import logging
import math
import os
from dataclasses import dataclass

log = logging.getLogger("ina-switch")

MAX_DELAY_MS = 10_000.0  # a typo guard: ten seconds of propagation is no datacenter


@dataclass(frozen=True)
class LinkDelay:
    """One-way delay, in seconds, of each port's link (applied on ingress and again on egress).

    Args:
        default: seconds for every port without an entry in ``per_port``.
        per_port: ``((port, seconds), ...)``.
    """

    default: float = 0.0
    per_port: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        for s in (self.default, *(s for _, s in self.per_port)):
            if not (0.0 <= s <= MAX_DELAY_MS / 1000) or math.isnan(s):
                raise ValueError(f"link delay {s * 1000:g} ms is not within 0..{MAX_DELAY_MS:g} ms")

    def seconds(self, port: int) -> float:
        return dict(self.per_port).get(port, self.default)

    @property
    def active(self) -> bool:
        return self.default > 0 or any(s > 0 for _, s in self.per_port)

    def describe(self) -> str:
        """One line for logs."""
        parts = [f"{self.default * 1000:g} ms on every port"] if self.default else []
        parts += [f"{s * 1000:g} ms on port {p}" for p, s in self.per_port]
        return "; ".join(parts) + " (each direction)"


def parse_link_delays(texts: list[str] | tuple[str, ...]) -> LinkDelay:
    """``["MS", "PORT:MS", ...]`` (command-line syntax; the last global value wins) -> LinkDelay; ValueError."""
    default = 0.0
    per_port: dict[int, float] = {}
    for text in texts:
        port_text, sep, ms_text = text.rpartition(":")
        try:
            ms = float(ms_text)
            port = int(port_text) if sep else None
        except ValueError:
            raise ValueError(f"expected MS or PORT:MS (milliseconds), got {text!r}") from None
        if not 0.0 <= ms <= MAX_DELAY_MS:
            raise ValueError(f"delay {ms_text} ms is not within 0..{MAX_DELAY_MS:g}")
        if port is not None and not 0 <= port < 512:
            raise ValueError(f"port {port} is not a 9-bit port number")
        if port is None:
            default = ms / 1000
        else:
            per_port[port] = ms / 1000
    return LinkDelay(default, tuple(sorted(per_port.items())))


class DelayLine:
    """Frames held on the links, both directions; the I/O loop's only interface to delay."""

    def __init__(self, delays: LinkDelay) -> None:
        self.delays = delays
        self._seconds: dict[int, float] = {}
        # entries (deadline, sequence, port, frame)
        self._in: list[tuple[float, int, int, bytes]] = []
        self._out: list[tuple[float, int, int, bytes]] = []
        self._seq = 0
        self._released: float | None = None  # the latest deadline among ingress frames released since emission_time
        self._last_out: dict[int, float] = {}  # per egress port, the latest deadline held (keeps the port's order)
        self._held = 0  # frames held now (both directions)
        self.held_most = 0  # the most frames held at once (both directions)

    def seconds(self, port: int) -> float:
        s = self._seconds.get(port)
        if s is None:
            s = self._seconds[port] = self.delays.seconds(port)
        return s

    def hold_in(self, port: int, frame: bytes, now: float) -> bool:
        """Hold a received frame; False if the port has no delay (process it now)."""
        return self._hold(self._in, port, frame, now)

    def hold_out(self, port: int, frame: bytes, now: float) -> bool:
        """Hold a frame emitted to ``port``; False if the port has no delay (send it now)."""
        return self._hold(self._out, port, frame, now)

    def emission_time(self, now: float) -> float:
        """When the outputs of the ingress frames released since the last call count as emitted: the latest of
        their deadlines (the moment a switch without software delay would have emitted them), never later than
        ``now``; ``now`` when none was released. Pass it as ``now`` to ``hold_out``."""
        released, self._released = self._released, None
        return now if released is None or released > now else released

    def _hold(self, heap: list, port: int, frame: bytes, now: float) -> bool:
        d = self._seconds.get(port)
        if d is None:
            d = self.seconds(port)
        if d <= 0.0:
            return False
        self._seq += 1
        deadline = now + d
        if heap is self._out:  # emission times may step back (emission_time): never overtake the port's last frame
            last = self._last_out.get(port, 0.0)
            deadline = max(deadline, last)
            self._last_out[port] = deadline
        heapq.heappush(heap, (deadline, self._seq, port, frame))
        self._held += 1
        self.held_most = max(self.held_most, self._held)
        return True

    def due_in(self, now: float) -> dict[int, list[bytes]]:
        """Received frames whose delay has passed, per port in arrival order (ports in deadline order)."""
        heap, out = self._in, {}
        while heap and heap[0][0] <= now:
            deadline, _, port, frame = heapq.heappop(heap)
            self._released = deadline  # popped in deadline order: the last is the latest
            self._held -= 1
            frames = out.get(port)
            if frames is None:
                out[port] = [frame]
            else:
                frames.append(frame)
        return out

    def due_out(self, now: float) -> list[tuple[int, bytes]]:
        """Emitted frames whose delay has passed, in emission order per port: ``[(port, frame)]``."""
        heap, out = self._out, []
        while heap and heap[0][0] <= now:
            _, _, port, frame = heapq.heappop(heap)
            self._held -= 1
            out.append((port, frame))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of a held frame, on the time.monotonic() clock."""
        a = self._in[0][0] if self._in else None
        b = self._out[0][0] if self._out else None
        if a is None:
            return b
        return a if b is None or a <= b else b

    @property
    def held(self) -> int:
        """Frames held now, both directions."""
        return self._held


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


CLOCK_MONOTONIC = 1  # the clock of time.monotonic() on Linux
TFD_TIMER_ABSTIME = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC


class DeadlineTimer:
    """A timerfd armed at absolute time.monotonic() deadlines; its fd goes into the I/O loop's epoll set.

    ``fd`` is -1 where timerfd cannot be had (ctypes or libc missing it): the loop then bounds its epoll
    timeout by ``timeout(now)``, rounded up to whole milliseconds (never early, up to 1 ms late).
    """

    def __init__(self) -> None:
        self.fd = -1
        self._armed: float | None = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            self._create, self._settime = libc.timerfd_create, libc.timerfd_settime
            self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
            fd = self._create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            self.fd = fd
        except (OSError, AttributeError) as e:
            log.warning("link delay: no timerfd (%s): deadlines are kept to the millisecond", e)

    def arm(self, deadline: float | None, now: float) -> None:
        """Wake the loop at ``deadline`` (None: no frame held). Re-arms only when an earlier wake-up is needed
        or the armed one has passed."""
        if self.fd < 0:
            return
        if deadline is None:
            return  # a stale expiry only costs one empty wake-up
        if self._armed is not None and now < self._armed <= deadline:
            return
        spec = _Itimerspec()
        sec = int(deadline)
        spec.it_value.tv_sec, spec.it_value.tv_nsec = sec, max(1, int((deadline - sec) * 1e9))
        if self._settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) == 0:
            self._armed = deadline

    def clear(self) -> None:
        """Consume an expiry (the fd was readable)."""
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, OSError):
            pass
        self._armed = None

    def timeout(self, deadline: float | None, now: float) -> float:
        """An epoll timeout (seconds; -1 for none) that ends at ``deadline`` when there is no timerfd."""
        if self.fd >= 0 or deadline is None:
            return -1.0
        return max(0.0, deadline - now)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
