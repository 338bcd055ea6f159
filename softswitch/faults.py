"""Seeded loss, duplication and reordering of INA packets inside ``ina-switch`` (this kernel has no netem).

Faults hit only INA packets (IPv4/UDP from or to ``wire.INA_UDP_PORT``) on the links they are configured
for; everything else passes untouched. Every link (switch port and direction) draws from its own random
stream, seeded from ``(seed, direction, port)``, so the fate of the n-th INA packet on a link depends only
on the seed and n, not on how traffic of other links interleaves with it.

For each INA packet a link draws three numbers, in this order, whatever the outcome:

- drop (probability ``drop``): the packet is lost;
- duplicate (``dup``): the packet is delivered twice, back to back;
- reorder (``reorder``): the packet is held back and delivered right after the next INA packet of the
  same link, or when ``reorder_delay`` seconds have passed, whichever comes first (one packet at a time is
  held per link).

Example::

    injector = FaultInjector(FaultConfig(default=FaultSpec(drop=0.1), seed=7))
    frames = injector.ingress(port, frame, time.monotonic())  # 0, 1 or 2 frames (or 3 with a released one)
"""
from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from inaproto import wire

DIRECTIONS = ("in", "out")


class FaultDirection(enum.StrEnum):
    """Which frames get faults: those the switch receives, those it sends, or both."""

    IN = "in"
    OUT = "out"
    BOTH = "both"


@dataclass(frozen=True)
class FaultSpec:
    """Probabilities for one link: each in [0, 1]."""

    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0

    def __post_init__(self) -> None:
        for name in ("drop", "dup", "reorder"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"fault probability {name}={p} is not within [0, 1]")

    @property
    def active(self) -> bool:
        return bool(self.drop or self.dup or self.reorder)


@dataclass(frozen=True)
class FaultConfig:
    """Where faults apply and how likely they are.

    Args:
        default: probabilities for every port without an entry in ``per_port``.
        per_port: ``((port, FaultSpec), ...)``: probabilities for single ports.
        ports: if not empty, only these switch ports get faults (ingress on them, egress to them).
        direction: ``"in"`` (frames the switch receives), ``"out"`` (frames it sends) or ``"both"``.
        seed: seed of every link's random stream.
        reorder_delay: longest time, in seconds, a held-back packet waits for a successor.
    """

    default: FaultSpec = field(default_factory=FaultSpec)
    per_port: tuple[tuple[int, FaultSpec], ...] = ()
    ports: frozenset[int] = frozenset()
    direction: FaultDirection = FaultDirection.BOTH
    seed: int = 0
    reorder_delay: float = 0.005

    def __post_init__(self) -> None:
        if self.direction not in tuple(FaultDirection):
            raise ValueError(f"fault direction must be in, out or both, not {self.direction!r}")
        if self.reorder_delay < 0:
            raise ValueError("reorder_delay must not be negative")

    def spec_for(self, port: int) -> FaultSpec | None:
        """The probabilities of a port's link, or None when it gets no faults."""
        if self.ports and port not in self.ports:
            return None
        spec = dict(self.per_port).get(port, self.default)
        return spec if spec.active else None

    @property
    def active(self) -> bool:
        return self.default.active or any(s.active for _, s in self.per_port)

    def describe(self) -> str:
        """One line for logs: probabilities per link, where, which way, the seed."""
        def spec(s: FaultSpec) -> str:
            return f"drop {s.drop:g}, dup {s.dup:g}, reorder {s.reorder:g}"

        parts = [f"{spec(self.default)} on {'ports ' + ','.join(map(str, sorted(self.ports))) if self.ports else 'every port'}"]
        parts += [f"port {port}: {spec(s)}" for port, s in self.per_port]
        where = {"in": "frames received", "out": "frames sent", "both": "frames received and sent"}[self.direction]
        return f"{'; '.join(parts)}; on INA {where}; seed {self.seed}; reorder delay {self.reorder_delay:g} s"


def parse_probability(text: str) -> tuple[int | None, float]:
    """``"P"`` or ``"PORT:P"`` (command-line syntax) -> (port or None, probability); ValueError if malformed."""
    port_text, sep, p_text = text.rpartition(":")
    try:
        p = float(p_text)
        port = int(port_text) if sep else None
    except ValueError:
        raise ValueError(f"expected P or PORT:P with P in [0, 1], got {text!r}") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"probability {p_text} is not within [0, 1]")
    if port is not None and not 0 <= port < 512:
        raise ValueError(f"port {port} is not a 9-bit port number")
    return port, p


def build_config(
    drop: Sequence[str] = (), dup: Sequence[str] = (), reorder: Sequence[str] = (), *, ports: Sequence[int] = (),
    direction: FaultDirection = FaultDirection.BOTH, seed: int = 0, reorder_delay: float = 0.005,
) -> FaultConfig:
    """A FaultConfig from command-line values (each ``P`` or ``PORT:P``; the last global value wins)."""
    default = {"drop": 0.0, "dup": 0.0, "reorder": 0.0}
    per_port: dict[int, dict[str, float]] = {}
    for kind, values in (("drop", drop), ("dup", dup), ("reorder", reorder)):
        for text in values:
            port, p = parse_probability(text)
            if port is None:
                default[kind] = p
            else:
                per_port.setdefault(port, {})[kind] = p
    base = FaultSpec(**default)
    specs = tuple(sorted((port, FaultSpec(**{**default, **kinds})) for port, kinds in per_port.items()))
    return FaultConfig(base, specs, frozenset(ports), FaultDirection(direction), seed, reorder_delay)


def is_ina(frame: bytes | bytearray | memoryview) -> bool:
    """True for an Ethernet/IPv4/UDP frame from or to the INA UDP port (the packets faults apply to)."""
    if len(frame) < 42 or frame[12] != 0x08 or frame[13] != 0x00 or frame[23] != 17:
        return False
    udp = 14 + (frame[14] & 0x0F) * 4
    if len(frame) < udp + 4:
        return False
    port_hi, port_lo = wire.INA_UDP_PORT >> 8, wire.INA_UDP_PORT & 0xFF
    return (frame[udp] == port_hi and frame[udp + 1] == port_lo) or (frame[udp + 2] == port_hi and frame[udp + 3] == port_lo)


@dataclass
class FaultStats:
    seen: int = 0  # INA packets on faulty links
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0


class _Link:
    __slots__ = ("deadline", "held", "rng", "spec")

    def __init__(self, spec: FaultSpec, seed: int, direction: str, port: int) -> None:
        self.spec = spec
        # An integer seed per link: deterministic across runs (no str hashing involved).
        self.rng = random.Random((seed * 2 + DIRECTIONS.index(direction)) * 1024 + port)
        self.held: bytes | None = None
        self.deadline = 0.0


class FaultInjector:
    """Applies a FaultConfig to frames entering (``ingress``) and leaving (``egress``) the switch."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self.stats = {d: FaultStats() for d in DIRECTIONS}
        self._links: dict[tuple[str, int], _Link | None] = {}
        self._holding: set[_Link] = set()
        self._in = config.direction in ("in", "both")
        self._out = config.direction in ("out", "both")

    @property
    def holding(self) -> bool:
        """True while some link holds a packet back (call ``due()`` by ``next_deadline()``)."""
        return bool(self._holding)

    def ingress(self, port: int, frame: bytes, now: float) -> list[bytes]:
        """Frames to process for a frame received on ``port``, in order."""
        if not self._in:
            return [frame]
        return self._apply("in", port, frame, now)

    def egress(self, port: int, frame: bytes, now: float) -> list[bytes]:
        """Frames to send for a frame the pipeline emits on ``port``, in order."""
        if not self._out:
            return [frame]
        return self._apply("out", port, frame, now)

    def next_deadline(self) -> float | None:
        return min((link.deadline for link in self._holding), default=None)

    def due(self, now: float) -> list[tuple[str, int, bytes]]:
        """Held frames whose delay has passed: ``[(direction, port, frame)]``, to deliver now."""
        released = []
        for (direction, port), link in self._links.items():
            if link is not None and link.held is not None and link.deadline <= now:
                released.append((direction, port, link.held))
                link.held = None
                self._holding.discard(link)
        return released

    def _link(self, direction: str, port: int) -> _Link | None:
        key = (direction, port)
        try:
            return self._links[key]
        except KeyError:
            spec = self.config.spec_for(port)
            link = _Link(spec, self.config.seed, direction, port) if spec is not None else None
            self._links[key] = link
            return link

    def _apply(self, direction: str, port: int, frame: bytes, now: float) -> list[bytes]:
        link = self._link(direction, port)
        if link is None or not is_ina(frame):
            return [frame]
        stats = self.stats[direction]
        stats.seen += 1
        spec, r = link.spec, link.rng.random
        lose, dup, hold = r() < spec.drop, r() < spec.dup, r() < spec.reorder
        released = link.held
        if released is not None:
            link.held = None
            self._holding.discard(link)
        if lose:
            stats.dropped += 1
            out: list[bytes] = []
        else:
            out = [frame, frame] if dup else [frame]
            if dup:
                stats.duplicated += 1
            if hold:
                stats.reordered += 1
                link.held = out.pop(0)
                link.deadline = now + self.config.reorder_delay
                self._holding.add(link)
        if released is not None:
            out.append(released)
        return out
