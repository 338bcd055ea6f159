"""Constants of the iteration-time model, loadable from a JSON calibration file.

The defaults are order-of-magnitude values for a 100 Gbit/s datacenter rack with an ASIC switch and a
SwitchML-style packet format (32 int32 lanes = 128 B of payload per packet). They are assumptions, not
measurements: once the Mininet testbed runs, measure each field as its comment says, write the values
to a JSON file (start from ``ina-sim show-calibration``) and pass it with ``--calibration FILE``.
Link bandwidths are not here: they describe the cluster and live in :class:`simulator.cluster.ClusterSpec`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import SimulatorError

__all__ = ["Calibration", "CalibrationError", "load_calibration"]


class CalibrationError(SimulatorError, ValueError):
    """A calibration file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Calibration:
    """Time-model constants; see docs/simulation.md for the formulas that use each one."""

    # Round trip of one INA packet, worker -> switch -> worker, including the switch pipeline and both
    # host stacks. Bounds INA throughput to slots * payload / rtt (the SwitchML window bound).
    # Measure: one job, one slot, throughput T_1 -> rtt = payload_bytes / T_1 (or ping the switch's
    # aggregation path with a single in-flight packet).
    ina_rtt_us: float = 5.0
    # Gradient payload per INA packet: 32 int32 lanes (the p4src header layout).
    payload_bytes: int = 128
    # Bytes on the wire per INA packet: payload + INA header + UDP(8) + IPv4(20) + Ethernet(14).
    # Measure: the frame length tcpdump shows for an aggregation packet.
    frame_bytes: int = 184
    # Packets per second the switch can aggregate for one job; None = line rate (an ASIC). The
    # softswitch or BMv2 is packet-rate bound: measure with one job, many slots, and set this.
    switch_pps: float | None = None
    # Gradient packets per second one switch sustains in total, over every job aggregating there (None = no
    # shared bound). A software switch is one server for all its jobs; on the testbed it also shares two
    # cores with every agent, so this is the machine's ceiling with the experiment's number of agents.
    # INA jobs at a switch share it in proportion to the packet rates they would offer alone (a FIFO
    # server). Measure: the experiment's jobs at once, unshaped links, many slots each; the sum over jobs
    # of workers x chunks / call time (ina-exp multijob's calibration probe ina-shared-pps).
    switch_shared_pps: float | None = None
    # The senders' congestion window (host_agent/congestion.py): a delay target. A round whose shortest round trip
    # exceeds the path's (software + propagation + serialization, unloaded) by more than
    # max(cwnd_queue_allowance_us, cwnd_allowance_share x path) shrinks the window, so on a loaded shared switch
    # the jobs back off at that queueing delay instead of filling the server (simulator.shared_switch.shared_state).
    # None: no congestion window (every job keeps its whole grant in flight). Measure: the agent's constants
    # (QUEUE_ALLOWANCE, ALLOWANCE_SHARE).
    cwnd_queue_allowance_us: float | None = 2000.0
    cwnd_allowance_share: float = 0.25
    # The least window the sender keeps (chunks; MIN_WINDOW: early loss detection needs later chunks in flight).
    cwnd_min_window: int = 4
    # Whether the sender's window also stops at the path's bandwidth-delay product (host_agent/congestion.py since
    # commit bf8a787: no cut goes below its highest recent delivery rate x the path's round trip), so a job whose
    # grant is at most its BDP never backs off (False: only cwnd_min_window; session 6's model).
    cwnd_floor_bdp: bool = True
    # Whether a job's delay target follows the shortest round trip it saw when it started (a latecomer on a loaded
    # switch tolerating more queueing: delay-based congestion control's latecomer advantage) or, False, the path's
    # unloaded round trip for every job. Measure: jobs started staggered against started together on the shared
    # switch (their shares); on the testbed they share equally (docs/experiments.md, "Testbed vs simulator").
    cwnd_latecomer: bool = False
    # Agents starting on the cores the switch runs on (the testbed: one machine). A job in its start-up (trace
    # column startup_s) takes workers x agent_startup_cpu_s CPU-seconds over that time from the shared switch's
    # capacity: a share workers x agent_startup_cpu_s / (startup_s x shared_cores) of switch_shared_pps
    # (simulator.shared_switch.startup_load). None/0: the switch has its own hardware (a cluster) or start-up is free.
    # Measure: shared_cores = the machine's cores; agent_startup_cpu_s = user + system CPU of an agent's
    # start-up (ina-exp multijob's probe agent-startup-cpu: the agent's imports, a lower bound).
    shared_cores: float | None = None
    agent_startup_cpu_s: float = 0.0
    # How starting agents and running jobs share those cores: True, max-min fairly among processes (the kernel's fair
    # scheduler: a running job's agents, which sleep between packets, get what they ask while it is less than an equal
    # share, and the start-up takes the rest; simulator.shared_switch.startup_share); False, in proportion to demand
    # (the start-up's whole load comes off the running jobs' capacity; session 8's model).
    # Measure: running jobs' calls while other jobs' agents start, against alone (docs/experiments.md, session 9).
    startup_fair_share: bool = True
    # Fraction of the link rate ring all-reduce reaches with large messages (TCP/RDMA framing, stack).
    # Measure: iperf3 goodput / link rate between two workers.
    ring_goodput_fraction: float = 0.94
    # Latency of one ring step (one worker's chunk to its neighbour, through the stack and the switch).
    # Measure: half the ping round trip between two workers of one rack; 2(n-1) of them per all-reduce.
    ring_step_latency_us: float = 10.0
    # What one ring step costs beyond its chunk's transfer at ring_goodput_fraction of the link, as measured at the
    # calibration's link rate and propagation delay; a step then takes max(ring_step_latency + propagation,
    # ring_step_overhead + chunk / rate) (simulator.model.ring_step_time). None: the whole latency adds to every step.
    # Measure: ring all-reduces of two or more sizes on the experiment's links and delay, per-step time against chunk
    # bytes (least squares, overhead >= 0; ina-exp multijob's probe ring-steps, topologies/experiments/calibrate.py).
    ring_step_overhead_us: float | None = None
    # Propagation round trip added between a worker and its switch (the testbed's ina-switch --link-delay,
    # a cluster's cable and queueing-free fabric delay). Lengthens every INA window round trip
    # (slots * payload per ina_rtt + propagation + serialization) and every ring step (a worker-to-worker hop
    # crosses the switch: one propagation round trip). Measure: the experiment's --rtt-ms.
    propagation_rtt_us: float = 0.0
    # Pause of a job whose slots move (a new range, or ring <-> INA): the SyncGeneration barrier and the
    # resend of what the workers lack. Added once per change of a running job's grant.
    # Measure: the agents' reported reallocation pause (ina-agent stats), median.
    realloc_pause_us: float = 0.0
    # Whether a job moved off the ring loses the ring all-reduce in flight (the testbed's agents abort it and redo
    # its chunks on the new backend: host_agent/ring_phases.py): its progress returns to where that op began (the
    # all-reduce's start, or the move onto the ring if later). False: a move keeps every byte already reduced.
    # Measure: the agents' pauses (ina-agent stats: the lost seconds of a move off the ring).
    ring_move_restarts_op: bool = False
    # Fraction of communication hidden behind computation (DDP bucketing overlaps backward with
    # all-reduce): iteration = compute + (1 - overlap) * communication. 0 = no overlap (conservative).
    comm_overlap: float = 0.0
    # Where these numbers come from: keep it with the file so results stay traceable.
    source: str = "defaults: assumed 100G datacenter rack with ASIC ToR; not yet measured on the testbed"

    def __post_init__(self) -> None:
        positive = ("ina_rtt_us", "payload_bytes", "frame_bytes", "ring_goodput_fraction")
        for name in positive:
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise CalibrationError(f"calibration field {name!r} must be a number > 0, got {value!r}")
        for name in ("propagation_rtt_us", "realloc_pause_us"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise CalibrationError(f"calibration field {name!r} must be a number >= 0, got {value!r}")
        if not _is_number(self.ring_step_latency_us) or self.ring_step_latency_us < 0:
            raise CalibrationError(
                f"calibration field 'ring_step_latency_us' must be a number >= 0, got {self.ring_step_latency_us!r}"
            )
        if self.frame_bytes < self.payload_bytes:
            raise CalibrationError(
                f"calibration: frame_bytes ({self.frame_bytes}) cannot be smaller than payload_bytes ({self.payload_bytes})"
            )
        if self.ring_goodput_fraction > 1:
            raise CalibrationError("calibration field 'ring_goodput_fraction' must be in (0, 1]")
        if not _is_number(self.comm_overlap) or not 0 <= self.comm_overlap < 1:
            raise CalibrationError(f"calibration field 'comm_overlap' must be in [0, 1), got {self.comm_overlap!r}")
        if self.cwnd_queue_allowance_us is not None and (not _is_number(self.cwnd_queue_allowance_us)
                                                         or self.cwnd_queue_allowance_us < 0):
            raise CalibrationError("calibration field 'cwnd_queue_allowance_us' must be null or a number >= 0, "
                                   f"got {self.cwnd_queue_allowance_us!r}")
        if not _is_number(self.cwnd_allowance_share) or self.cwnd_allowance_share < 0:
            raise CalibrationError(f"calibration field 'cwnd_allowance_share' must be a number >= 0, got {self.cwnd_allowance_share!r}")
        if not isinstance(self.cwnd_min_window, int) or isinstance(self.cwnd_min_window, bool) or self.cwnd_min_window < 1:
            raise CalibrationError(f"calibration field 'cwnd_min_window' must be an integer >= 1, got {self.cwnd_min_window!r}")
        if not isinstance(self.cwnd_floor_bdp, bool):
            raise CalibrationError(f"calibration field 'cwnd_floor_bdp' must be true or false, got {self.cwnd_floor_bdp!r}")
        if not isinstance(self.ring_move_restarts_op, bool):
            raise CalibrationError(f"calibration field 'ring_move_restarts_op' must be true or false, got {self.ring_move_restarts_op!r}")
        if not isinstance(self.startup_fair_share, bool):
            raise CalibrationError(f"calibration field 'startup_fair_share' must be true or false, got {self.startup_fair_share!r}")
        if not isinstance(self.cwnd_latecomer, bool):
            raise CalibrationError(f"calibration field 'cwnd_latecomer' must be true or false, got {self.cwnd_latecomer!r}")
        if not _is_number(self.agent_startup_cpu_s) or self.agent_startup_cpu_s < 0:
            raise CalibrationError(f"calibration field 'agent_startup_cpu_s' must be a number >= 0, got {self.agent_startup_cpu_s!r}")
        if self.ring_step_overhead_us is not None and (not _is_number(self.ring_step_overhead_us)
                                                       or self.ring_step_overhead_us < 0):
            raise CalibrationError("calibration field 'ring_step_overhead_us' must be null or a number >= 0, "
                                   f"got {self.ring_step_overhead_us!r}")
        for name in ("switch_pps", "switch_shared_pps", "shared_cores"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value <= 0):
                raise CalibrationError(f"calibration field {name!r} must be null or a number > 0, got {value!r}")

    # Derived values in SI units (seconds, bytes/s), used by simulator.model; computed once (the model reads them
    # on every rate it computes).
    @functools.cached_property
    def ina_rtt_s(self) -> float:
        return self.ina_rtt_us * 1e-6

    @functools.cached_property
    def propagation_rtt_s(self) -> float:
        return self.propagation_rtt_us * 1e-6

    @functools.cached_property
    def realloc_pause_s(self) -> float:
        return self.realloc_pause_us * 1e-6

    @functools.cached_property
    def cwnd_queue_allowance_s(self) -> float | None:
        return None if self.cwnd_queue_allowance_us is None else self.cwnd_queue_allowance_us * 1e-6

    @functools.cached_property
    def ring_step_latency_s(self) -> float:
        return self.ring_step_latency_us * 1e-6

    @functools.cached_property
    def ina_efficiency(self) -> float:
        """Payload share of each INA frame: line rate * this = INA goodput."""
        return self.payload_bytes / self.frame_bytes

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_calibration(path: str | Path | None) -> Calibration:
    """Read a calibration JSON object; missing fields keep their defaults, unknown fields are an error."""
    if path is None:
        return Calibration()
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration file {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"{path}: expected a JSON object of calibration fields")
    fields = {f.name for f in dataclasses.fields(Calibration)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise CalibrationError(f"{path}: unknown calibration field(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
    try:
        return Calibration(**data)
    except CalibrationError as exc:
        raise CalibrationError(f"{path}: {exc}") from None
    except TypeError as exc:
        raise CalibrationError(f"{path}: {exc}") from None
