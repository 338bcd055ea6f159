"""Benchmarks of the INA sender and of the reallocation pause, on loopback (no namespaces, no lock needed).

    python bench/sender_bench.py --sender [--json PATH]          # RTT 0: spurious resends per window, loss
    python bench/sender_bench.py --sender-rtt 5,10,20 [--json PATH]
    python bench/sender_bench.py --realloc [--json PATH]

1. ``--sender``: 4 workers, the switch model in its own process, links emulated at 2 Mbit/s (the agents
   pace INA packets at their framed size), 16384 float32 (512 chunks), 3 all-reduces per run, 3 runs per
   point: for windows 1, 4, 16, 64, 256, the time and the resends per chunk (the
   path is lossless, so every resend is spurious; also what the agents counted as ``spurious_resends``);
   then goodput at 1 % and 5 % loss (each direction at the switch) vs lossless, window 16.
2. ``--sender-rtt MS,...``: the same with a propagation delay (``agent_bench._DelayRelay``: every datagram
   held RTT/2 each way; 0: none), windows on 4096 float32, per packet; loss at a window of twice the BDP
   (rounded up to a power of two, at least 16), 16384 float32.
3. ``--realloc``: 4 workers (the controller core over an in-process switch, ``topologies.loopback``), links emulated
   at 2 Mbit/s, 12 calls of 4096 float32, the job moved every 2 calls at a random point (a higher-priority
   job takes the switch's pool: INA -> ring; it leaves: ring -> INA); per kind of move the medians of the stream's ``pauses`` (stop, barrier,
   back where it stopped, chunks replayed, ring work lost), and the per-move cost from runs with and
   without moves (alternating). ``--realloc-elements 65536`` makes each ring phase 1.7 s of wire time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import agent_bench
from agent_bench import _time_backend

from inaproto import wire


def bench_sender(windows: tuple[int, ...], losses: tuple[float, ...], loss_window: int, elements: int,
                 iterations: int, link_bps: float, rounds: int, rtt: float = 0.0, loss_elements: int | None = None) -> dict:
    """The INA sender on loopback, 4 workers, links emulated at ``link_bps``, ``rtt`` of propagation delay
    (``_DelayRelay``): spurious resends per chunk for each window (lossless: every resend is spurious); goodput at
    each loss rate vs lossless (window ``loss_window``, ``loss_elements``)."""
    n = 4
    wire_s = -(-elements // wire.LANES) * wire.INA_FRAME_LEN * 8 / link_bps
    out: dict = {"workers": n, "elements": elements, "link_bps": link_bps, "rtt_s": rtt, "framed_wire_s": wire_s,
                 "windows": [], "loss": []}
    for w in windows:
        secs, spur, counted, kinds = [], [], [], []
        for _ in range(rounds):
            t, extra = _time_backend(n, "ina", elements, iterations, link_bps, w, rtt=rtt)
            st = extra["stats"]
            kinds.append([st["early_resends"], st["timeouts"]])
            secs.append(t)
            spur.append(st["retransmits"] / st["chunks"])
            counted.append(st["spurious_resends"])
        row = {"slots": w, "seconds": secs, "seconds_median": statistics.median(secs),
               "spurious_per_chunk": spur, "spurious_per_chunk_median": statistics.median(spur),
               "spurious_counted_by_agents": counted, "early_resends_and_timeouts": kinds}
        out["windows"].append(row)
        print(f"   rtt {rtt * 1e3:2.0f} ms window {w:3d}: {row['seconds_median'] * 1e3:7.1f} ms "
              f"({min(secs) * 1e3:.0f}-{max(secs) * 1e3:.0f}; framed wire time {wire_s * 1e3:.0f}), spurious resends "
              f"per chunk {row['spurious_per_chunk_median'] * 100:.2f} % ({min(spur) * 100:.2f}-{max(spur) * 100:.2f}), "
              f"counted by the agents {counted}, [early, timeouts] {kinds}", flush=True)
    base = None
    for p in losses:
        secs, retx = [], []
        for r in range(rounds):
            t, extra = _time_backend(n, "ina", loss_elements or elements, iterations, link_bps, loss_window, drop=p,
                                     rtt=rtt)
            secs.append(t)
            retx.append(extra["stats"]["retransmits"] / extra["stats"]["chunks"])
        med = statistics.median(secs)
        base = med if p == 0 else base
        row = {"loss": p, "slots": loss_window, "seconds": secs, "seconds_median": med,
               "goodput_vs_lossless": (base / med) if base else None, "retransmits_per_chunk": statistics.median(retx)}
        out["loss"].append(row)
        print(f"   rtt {rtt * 1e3:2.0f} ms loss {p * 100:4.1f} % (each direction), window {loss_window}: {med * 1e3:7.1f} ms "
              f"({min(secs) * 1e3:.0f}-{max(secs) * 1e3:.0f}), goodput {row['goodput_vs_lossless'] * 100:.0f} % of "
              f"lossless, {row['retransmits_per_chunk']:.3f} resends per chunk", flush=True)
    out["load"] = os.getloadavg()[0]
    return out


def _realloc_run(moves: bool, calls: int, elements: int, bps: float, seed: int) -> dict:
    """One job of 4 workers on loopback (links emulated at ``bps``), ``calls`` all-reduces; with ``moves``
    a controller thread moves the job every 2 calls, at a random point of a call (4-80 ms in, scaled by
    elements / 4096 for longer calls), between INA and the ring: a higher-priority job admitted takes the pool
    of 16 slots, and released gives it back (the controller's priority policy)."""
    from host_agent.agent import AgentOptions
    from host_agent.options import StreamOptions
    from topologies.loopback import LoopbackCluster

    n = 4
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(elements).astype(np.float32) for _ in range(n)]
    steps = [lambda cl: cl.admit("b", "s1", 16, priority=1), lambda cl: cl.release(cl.job("b").job_id)] * 12
    opts = AgentOptions(stream=StreamOptions(op_timeout=30.0, link_bps=bps))
    with LoopbackCluster(["s1"] * n, slots=16, pool=16, policy="priority", options=opts) as cl:
        first: dict = {}
        done = threading.Event()

        def work(agent):
            if agent.rank == 0:
                first["agent"] = agent
            t0 = time.monotonic()
            for _ in range(calls):
                agent.allreduce(inputs[agent.rank])
            if agent.rank == 0:
                done.set()
            return time.monotonic() - t0, agent.stats

        def controller():
            per_call = -(-elements // 32)
            target = per_call // 4
            for step in steps:
                while (first.get("agent") is None or first["agent"].stats.chunks < target) and not done.is_set():
                    time.sleep(0.0005)
                time.sleep(float(rng.uniform(0.004, 0.08)) * max(1.0, elements / 4096))  # across a longer call too
                if done.is_set():
                    return
                step(cl)
                target += 2 * per_call

        t = threading.Thread(target=controller)
        if moves:
            t.start()
        try:
            out = cl.run(work, timeout=300)
        finally:
            done.set()
            if moves:
                t.join(10)
    seconds = max(o[0] for o in out)
    history = out[0][1].generation_history
    kinds = [str(k) for _, k, _ in history]
    by_move: dict[str, list] = {}
    per_worker = [getattr(o[1], "pauses", []) for o in out]
    for j in range(min(len(p) for p in per_worker)):
        move = f"{kinds[j]}->{kinds[j + 1]}" if j + 1 < len(kinds) else "?"
        by_move.setdefault(move, []).append([max(p[j][k] if k < len(p[j]) else 0 for p in per_worker) for k in range(5)])
    return {"seconds": seconds, "moves": max(0, len(history) - 1), "by_move": by_move,
            "replayed": sum(o[1].replayed_chunks for o in out)}


def bench_realloc(rounds: int, calls: int, elements: int, bps: float) -> dict:
    """Reallocation pause: runs with and without moves, alternating; the pause per move from the time
    difference, and (where the stream records it) split into stop, barrier and replay by kind of move."""
    plain, moved, by_move = [], [], {}
    moves = []
    for r in range(rounds):
        plain.append(_realloc_run(False, calls, elements, bps, r)["seconds"])
        res = _realloc_run(True, calls, elements, bps, r)
        moved.append(res["seconds"])
        moves.append(res["moves"])
        for k, v in res["by_move"].items():
            by_move.setdefault(k, []).extend(v)
        print(f"   round {r + 1}: {plain[-1]:.2f} s without moves, {moved[-1]:.2f} s with {res['moves']} moves "
              f"({res['replayed']} chunks replayed over all workers)", flush=True)
    per_move = [(m - p) / k for m, p, k in zip(moved, plain, moves) if k]
    out = {"elements": elements,
           "seconds_plain": plain, "seconds_moved": moved, "moves": moves, "per_move_s": per_move,
           "per_move_median_s": statistics.median(per_move) if per_move else None, "load": os.getloadavg()[0]}
    parts = {}
    for k, v in sorted(by_move.items()):
        cols = list(zip(*v))
        parts[k] = {"count": len(v), "stop_s": statistics.median(cols[0]), "barrier_s": statistics.median(cols[1]),
                    "caught_up_s": statistics.median(cols[2]), "caught_up_max_s": max(cols[2]),
                    "replayed_chunks": statistics.median(cols[3]), "ring_work_lost_s": statistics.median(cols[4]),
                    "ring_work_lost_max_s": max(cols[4])}
        print(f"   {k}: {len(v)} moves, median stop {parts[k]['stop_s'] * 1e3:.1f} ms, barrier "
              f"{parts[k]['barrier_s'] * 1e3:.1f} ms, back where it stopped {parts[k]['caught_up_s'] * 1e3:.1f} ms "
              f"(max {parts[k]['caught_up_max_s'] * 1e3:.1f}), {parts[k]['replayed_chunks']:g} chunks replayed, "
              f"ring work lost {parts[k]['ring_work_lost_s'] * 1e3:.1f} ms (max {parts[k]['ring_work_lost_max_s'] * 1e3:.1f})",
              flush=True)
    out["by_move"] = parts
    if per_move:
        print(f"   per move (time with moves - without, / moves): median {out['per_move_median_s'] * 1e3:.0f} ms "
              f"(range {min(per_move) * 1e3:.0f}-{max(per_move) * 1e3:.0f} ms); load {out['load']:.1f}", flush=True)
    return out



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--sender", action="store_true", help="the INA sender at RTT 0 (minutes)")
    parser.add_argument("--sender-rtt", metavar="MS", help="the INA sender at these round trips, e.g. 5,10,20")
    parser.add_argument("--realloc", action="store_true", help="the reallocation pause (about a minute)")
    parser.add_argument("--realloc-elements", type=int, default=4096, metavar="N",
                        help="--realloc: float32 per call (65536: a ring phase of 1.7 s)")
    args = parser.parse_args(argv)
    agent_bench.DEADLINE = time.monotonic() + 3000.0
    results: dict = {"cpu_count": os.cpu_count()}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(results, fh, indent=2)

    if args.sender:
        print("INA sender, 4 workers on loopback, links emulated at 2 Mbit/s, 16384 float32 (512 chunks), "
              "3 all-reduces per run, 3 runs per point", flush=True)
        results["sender"] = bench_sender((1, 4, 16, 64, 256), (0.0, 0.01, 0.05), 16, 16384, 3, 2e6, 3)
        save()
    if args.sender_rtt:
        results["sender_rtt"] = []
        for ms in (float(x) for x in args.sender_rtt.split(",")):
            bdp = ms / 1e3 / (wire.INA_FRAME_LEN * 8 / 2e6)
            loss_window = 1 << max(4, int(np.ceil(np.log2(max(2 * bdp, 1.0)))))  # twice the BDP, at least 16
            print(f"INA sender at {ms:g} ms round trip (BDP {bdp:.1f} slots), 4 workers on loopback, 2 Mbit/s, "
                  f"3 runs per point; loss at a window of {loss_window}", flush=True)
            results["sender_rtt"].append(bench_sender((1, 4, 16, 64, 256), (0.0, 0.01, 0.05), loss_window, 4096, 3, 2e6,
                                                      3, rtt=ms / 1e3, loss_elements=16384))
            save()
    if args.realloc:
        print(f"reallocation pause: 4 workers, links emulated at 2 Mbit/s, 12 calls of {args.realloc_elements} float32, "
              "moved every 2 calls at a random point (INA range -> ring -> INA), 3 alternating rounds", flush=True)
        results["realloc"] = bench_realloc(3, 12, args.realloc_elements, 2e6)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
