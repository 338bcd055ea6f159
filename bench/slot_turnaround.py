"""Where an INA slot's turnaround goes, from a capture on the switch's side of its links (docs/experiments.md,
"Experiment 1": the pool-size curve's round trip).

    tcpdump -i any -y LINUX_SLL2 --time-stamp-precision=nano -s 80 -w cap.pcap udp &   # root, beside a run
    ina-exp run allreduce --small --workers 2 --backends ina --no-calibrate --slot-sweep 1,2,4,8,16
    python bench/slot_turnaround.py cap.pcap --slots 1,2,4,8,16

On the switch's ports a gradient is seen as it arrives (after the worker's htb) and a result as it leaves (after
the port's htb). Per chunk ``g`` of a job granted ``S`` slots (``g + S`` is sent after the result of ``g``):

- residence: last of the workers' gradients in -> the result out (the link delay, the switch's time, the
  downlink's queue);
- reaction: the result of ``g - S`` out to a worker -> that worker's gradient of ``g`` in (the agent's wake-up and
  work, its uplink's queue); ``slowest`` is the largest over the workers;
- skew: first -> last of the workers' gradients of ``g`` in;
- cycle: the result of ``g - S`` out -> the result of ``g`` out, to the same worker (the slot's turnaround).

Jobs are told apart by their job id and by a pause of more than a second (a new testbed restarts the ids); the
last ``--slots`` jobs with ``--workers`` workers are the curve's points, in order. Only first copies count.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

PCAP_MICRO, PCAP_NANO = 0xA1B2C3D4, 0xA1B23C4D
LINKTYPE_SLL2 = 276
PACKET_OUTGOING = 4
GRADIENT, RESULT = 1, 2
_SLL2 = struct.Struct(">HHIHBB8s")  # protocol, reserved, ifindex, hatype, pkttype, halen, address
_INA = struct.Struct(">BBHHHIB")  # msg_type, flags, job_id, generation, slot, seq, worker_id
NEW_JOB_GAP_S = 1.0


@dataclass(frozen=True)
class Frame:
    """One INA frame seen on a switch port: ``outgoing`` is a result leaving the switch."""

    t: float
    outgoing: bool
    src: str
    dst: str
    msg_type: int
    job_id: int
    seq: int


@dataclass
class Job:
    """First arrival of each worker's gradient and first departure of each worker's result, per chunk."""

    key: tuple[int, int]
    gradients: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    results: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))

    @property
    def workers(self) -> int:
        return len({h for per in self.gradients.values() for h in per})


def read_frames(path: str) -> Iterator[Frame]:
    """The INA frames of a ``tcpdump -y LINUX_SLL2`` capture; ValueError for another format."""
    with open(path, "rb") as fh:
        header = fh.read(24)
        if len(header) < 24:
            raise ValueError(f"{path}: not a pcap file")
        magic, _, _, _, _, _, linktype = struct.unpack("<IHHiIII", header)
        if magic not in (PCAP_MICRO, PCAP_NANO) or linktype != LINKTYPE_SLL2:
            raise ValueError(f"{path}: expected a little-endian pcap of link type LINUX_SLL2 (tcpdump -y LINUX_SLL2)")
        scale = 1e-9 if magic == PCAP_NANO else 1e-6
        while len(rec := fh.read(16)) == 16:
            sec, frac, incl, _ = struct.unpack("<IIII", rec)
            data = fh.read(incl)
            proto, _, _, _, pkttype, _, _ = _SLL2.unpack_from(data)
            ip = data[_SLL2.size:]
            if proto != 0x0800 or len(ip) < 28 + _INA.size or ip[9] != 17:
                continue
            msg, _, job, _, _, seq, _ = _INA.unpack_from(ip, 28)
            if msg in (GRADIENT, RESULT):
                yield Frame(sec + frac * scale, pkttype == PACKET_OUTGOING, socket.inet_ntoa(ip[12:16]),
                            socket.inet_ntoa(ip[16:20]), msg, job, seq)


def split_jobs(frames: Iterator[Frame]) -> list[Job]:
    """Jobs in order of appearance: gradients arriving at the switch, results leaving it."""
    jobs: list[Job] = []
    last_t, last_job = -1e18, None
    for f in frames:
        if f.job_id != last_job or f.t - last_t > NEW_JOB_GAP_S:
            jobs.append(Job((len(jobs), f.job_id)))
        last_t, last_job = f.t, f.job_id
        job = jobs[-1]
        if f.msg_type == GRADIENT and not f.outgoing:
            job.gradients[f.seq].setdefault(f.src, f.t)
        elif f.msg_type == RESULT and f.outgoing:
            job.results[f.seq].setdefault(f.dst, f.t)
    return jobs


def turnaround(job: Job, slots: int) -> dict[str, list[float]]:
    """Per-chunk samples (seconds): residence, reaction (every worker), slowest reaction, skew, cycle."""
    out: dict[str, list[float]] = {k: [] for k in ("residence", "reaction", "slowest", "skew", "cycle")}
    n = job.workers
    for seq, arrivals in job.gradients.items():
        result, previous = job.results.get(seq, {}), job.results.get(seq - slots, {})
        if len(arrivals) == n and result:
            out["residence"].append(statistics.median(result.values()) - max(arrivals.values()))
            out["skew"].append(max(arrivals.values()) - min(arrivals.values()))
        reactions = [t - previous[h] for h, t in arrivals.items() if h in previous and 0 < t - previous[h] < 1]
        out["reaction"] += reactions
        if len(reactions) == n:
            out["slowest"].append(max(reactions))
        out["cycle"] += [t - previous[h] for h, t in result.items() if h in previous and 0 < t - previous[h] < 1]
    return out


def describe(samples: list[float]) -> str:
    if not samples:
        return "-"
    xs = sorted(samples)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return f"median {statistics.median(xs) * 1e3:6.2f}  mean {statistics.fmean(xs) * 1e3:6.2f}  p90 {p90 * 1e3:6.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pcap", help="capture of `tcpdump -i any -y LINUX_SLL2 udp` on the switch's side")
    parser.add_argument("--slots", required=True, help="granted slots of the curve's points, in order, e.g. 1,2,4,8,16")
    parser.add_argument("--workers", type=int, default=4, help="workers of the curve's job (default 4)")
    args = parser.parse_args(argv)
    try:
        slots = [int(x) for x in args.slots.split(",")]
        if any(s < 1 for s in slots):
            raise ValueError
    except ValueError:
        print(f"slot_turnaround: --slots must be positive integers, e.g. 1,4,16, got {args.slots!r}", file=sys.stderr)
        return 2
    try:
        jobs = [j for j in split_jobs(read_frames(args.pcap)) if j.workers == args.workers and len(j.gradients) > 16]
    except (OSError, ValueError) as e:
        print(f"slot_turnaround: {e}", file=sys.stderr)
        return 2
    if len(jobs) < len(slots):
        print(f"slot_turnaround: {len(jobs)} jobs of {args.workers} workers in the capture, {len(slots)} expected",
              file=sys.stderr)
        return 1
    for s, job in zip(slots, jobs[-len(slots):]):
        print(f"{s} slots ({len(job.gradients)} chunks):")
        for name, samples in turnaround(job, s).items():
            print(f"   {name:9s} {describe(samples)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
