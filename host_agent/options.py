"""The agent's configuration: one frozen dataclass tree, ``AgentOptions`` holding ``StreamOptions``.

Every field is declared with :func:`inaproto.config.setting` (its default and its one-line documentation), so
``ina-agent --config FILE`` reads it from TOML, ``ina-agent --print-config`` prints it, results files record it
whole (``inaproto.config.as_dict``) and docs/agent.md lists it (``inaproto.config.reference``). A library user
builds it directly and changes a copy with ``dataclasses.replace``::

    opts = AgentOptions(stream=StreamOptions(op_timeout=20.0))
    agent = Agent(spec, worker_id=0, controller="127.0.0.1:50051", options=opts)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inaproto.config import setting

__all__ = ["AgentOptions", "StreamOptions"]


def _positive(obj: object, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) > 0:
            raise ValueError(f"{name} must be > 0, got {getattr(obj, name)!r}")


@dataclass(frozen=True)
class StreamOptions:
    """How the job's chunk stream runs on this worker: its timeouts, the INA sender's timers and window, the ring."""

    op_timeout: float = setting(60.0, "seconds an all-reduce may make no progress before it fails (AgentTimeout)")
    connect_timeout: float = setting(30.0, "seconds to connect a ring to its neighbours")
    rto_initial: float = setting(0.05, "retransmission timeout before the first round trip is measured, seconds")
    rto_min: float = setting(0.01, "least margin of the retransmission timeout above the smoothed round trip, seconds")
    rto_max: float = setting(1.0, "largest retransmission timeout, backed off or not, seconds")
    initial_window: int = setting(8, "chunks in flight at first; the congestion window then adapts, up to the slots")
    ring_grace: float = setting(10.0, "after a ring failure, seconds to wait for the generation change that explains it")
    reorder_guard: float = setting(
        0.0, "seconds between a chunk's last send and its slot's reuse, for switches without the per-copy seq check "
             "on networks that hold packets back (0: off)")
    link_bps: float = setting(
        0.0, "emulated link of this worker, bits/s (0: none): INA packets paced at their framed size, ring ops last "
             "their framed bytes; equal links for comparing backends on loopback")
    path_rtt_floor: float | None = setting(
        None, "the shortest round trip of this worker's aggregation path, seconds (0: none); unset: the grant's")
    flight_trace: Path | None = setting(
        None, "a folder: every INA window appends its chunks' sends, resends and results there (w<worker>-<pid>.jsonl)")

    def __post_init__(self) -> None:
        _positive(self, "op_timeout", "connect_timeout", "rto_initial", "rto_min", "rto_max", "ring_grace")
        for name in ("reorder_guard", "link_bps"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be >= 0 and finite, got {value!r}")
        if self.path_rtt_floor is not None and not self.path_rtt_floor >= 0:
            raise ValueError(f"path_rtt_floor must be >= 0, got {self.path_rtt_floor!r}")
        if not self.rto_min <= self.rto_initial <= self.rto_max:
            raise ValueError("need rto_min <= rto_initial <= rto_max")
        if self.initial_window < 1:
            raise ValueError(f"initial_window must be >= 1, got {self.initial_window}")
        if self.flight_trace is not None and not isinstance(self.flight_trace, Path):
            object.__setattr__(self, "flight_trace", Path(self.flight_trace))


@dataclass(frozen=True)
class AgentOptions:
    """How an agent joins and follows its job, and how its stream runs (``stream``)."""

    stream: StreamOptions = setting(factory=StreamOptions, doc="the chunk stream")
    heartbeat_interval: float = setting(1.0, "seconds between heartbeats to the controller")
    rpc_timeout: float = setting(10.0, "deadline of each ordinary controller call, seconds")
    rendezvous_timeout: float = setting(60.0, "seconds a worker waits for its job to appear (or its first grant)")
    close_timeout: float = setting(10.0, "at the end, seconds a worker waits for the job's release")
    controller_retry: float = setting(
        30.0, "seconds a controller call is retried while the controller is unavailable (restarting)")
    scale: float = setting(float(2**16), "fixed-point scale when there is no controller (otherwise the grant's)")
    switch_addresses: dict[str, tuple[str, int]] = setting(
        factory=dict, doc="switch name -> [ip, port] its INA packets go to instead of the grant's (a relay, tests)")

    def __post_init__(self) -> None:
        _positive(self, "heartbeat_interval", "rpc_timeout", "rendezvous_timeout", "close_timeout", "scale",
                  "controller_retry")
