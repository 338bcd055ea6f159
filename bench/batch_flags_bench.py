"""CPU per gradient of ``InaPipeline.process_batch`` with and without the loss signals' TX_COUNTED flag.

    python bench/batch_flags_bench.py [--workers 8] [--window 128] [--rounds 40] [--reps 3] [--json out.json]

In-process, no I/O: one job of N workers (slots 0..window-1), SwitchML's rounds (chunk c in slot c mod W,
shadow (c div W) mod 2), every worker's frames counted from 0 and never lost (the common case the batch path
must keep vectorised). Two batch shapes, as ``ina-switch --io rings`` hands them over:

- union: one wake-up's frames of every port joined, 8 slots of each worker, port after port (64 frames with 8
  workers; every slot completes within the batch);
- port: one worker's 64 distinct slots (the last worker's batch completes all 64).

Each repetition runs a fresh pipeline over ``--rounds`` windows per mode, the modes alternated (flag off, on);
the figure is wall time per gradient (the process is alone on its CPU while it runs): median [min-max] over the
repetitions. Checks that the flagged runs took no frame through the per-frame path.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from softswitch import pipeline_batch
from softswitch.pipeline import InaPipeline

JOB = 1
SWITCH_MAC, SWITCH_IP = bytes.fromhex("0200000000fe"), bytes([10, 0, 0, 254])


def _pipeline(workers: int, window: int) -> InaPipeline:
    p = InaPipeline()
    addrs = [WorkerAddress(i, i + 1, bytes.fromhex(f"0200000001{i + 1:02x}"), bytes([10, 0, 1, i + 1]), 40000 + i)
             for i in range(workers)]
    job_entries(JOB, addrs, base_slot=0, num_slots=window, generation=0).insert_into(p)
    return p


def _frames(workers: int, window: int, rounds: int, flags: int) -> np.ndarray:
    """(rounds, workers, window, length) frames: worker w's gradient for chunk r * window + s in slot s."""
    template = np.stack([np.frombuffer(wire.udp_frame(
        bytes.fromhex(f"0200000001{w + 1:02x}"), SWITCH_MAC, bytes([10, 0, 1, w + 1]), SWITCH_IP, 40000 + w,
        wire.INA_UDP_PORT, wire.encode_payload(wire.InaHeader(wire.MsgType.GRADIENT, 0, JOB, 0, 0, 0, w, 0),
                                               np.arange(wire.LANES) + w)), np.uint8) for w in range(workers)])
    out = np.empty((rounds, workers, window, template.shape[1]), np.uint8)
    out[:] = template[None, :, None, :]
    rec = out.reshape(-1, template.shape[1]).view(pipeline_batch.FRAME_DTYPE).reshape(rounds, workers, window)
    r = np.arange(rounds)[:, None, None]
    s = np.arange(window)[None, None, :]
    rec["slot"] = s
    rec["seq"] = r * window + s
    tx = (r * window + s) % wire.TX_COUNTER_MOD  # each worker's frames in order: its transmission counter
    rec["reserved_shadow"] = (tx << 1) | (r & 1)
    rec["flags"] = flags
    return out


def _batches(frames: np.ndarray, shape: str, per: int):
    """(ports, rows) per batch, in the order the switch would see them."""
    rounds, workers, window, _ = frames.shape
    for r in range(rounds):
        if shape == "union":
            for s0 in range(0, window, per // workers):
                rows = frames[r, :, s0 : s0 + per // workers].reshape(-1, frames.shape[3])
                yield np.repeat(np.arange(1, workers + 1), per // workers), rows
        else:
            for w in range(workers):
                for s0 in range(0, window, per):
                    yield w + 1, frames[r, w, s0 : s0 + per]


def run(workers: int, window: int, rounds: int, shape: str, flags: int, per: int = 64) -> float:
    """Seconds per gradient over every batch of the run (fresh pipeline)."""
    p = _pipeline(workers, window)
    batches = list(_batches(_frames(workers, window, rounds, flags), shape, per))
    calls = [0]
    real = p._process

    def counting(port, frame):
        calls[0] += 1
        return real(port, frame)

    p._process = counting
    n = sum(len(rows) for _, rows in batches)
    t0 = time.perf_counter()
    for ports, rows in batches:
        pipeline_batch.process_batch(p, ports, rows, as_block=True)
    elapsed = time.perf_counter() - t0
    if calls[0]:
        raise SystemExit(f"{shape}, flags {flags:#x}: {calls[0]} frames took the per-frame path")
    if p.counters["MyEgress.ina_results"][JOB] != rounds * window * workers:
        raise SystemExit(f"{shape}: wrong number of results")
    return elapsed / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/batch_flags_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.workers > 32 or 64 % args.workers or args.window % 64:
        print("batch_flags_bench: --workers must divide 64 (1..32) and --window be a multiple of 64", file=sys.stderr)
        return 2
    results: dict[str, list[float]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.reps):
        for shape in ("union", "port"):
            for name, flags in (("plain", 0), ("counted", int(wire.Flags.TX_COUNTED))):
                results.setdefault(f"{shape}/{name}", []).append(run(args.workers, args.window, args.rounds, shape, flags) * 1e6)
    load.append(os.getloadavg()[0])
    print(f"process_batch, {args.workers} workers, window {args.window}, {args.rounds} rounds, {args.reps} reps; "
          f"load {load[0]:.2f} -> {load[1]:.2f}")
    print("us per gradient: median [min-max]")
    for key, values in results.items():
        print(f"  {key:16s} {statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]")
    for shape in ("union", "port"):
        a, b = statistics.median(results[f"{shape}/plain"]), statistics.median(results[f"{shape}/counted"])
        print(f"  {shape}: counted / plain = {b / a:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "us_per_gradient": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
