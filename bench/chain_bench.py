"""CPU per frame of the pipeline model on Rina's chain traffic: host members' copies and an INA rack's switch.

    python bench/chain_bench.py record [--out FILE] [--elements 65536] [--calls 3] [--slots 64]
    python bench/chain_bench.py replay [--in FILE] [--repeat 5] [--json FILE]

``record`` runs Rina on a loopback cluster (topologies/loopback.py: 2 racks x 4 workers, the first rack INA-capable: the 50 % mix; copies
in the agents' threads) and keeps, per pipeline (each host member's copy, the INA rack's UDP switch), its
configuration (table entries, defaults, multicast groups) and every call into it in order: the copies'
``process_batch(port, rows)`` batches as they came, the UDP switch's single frames. ``replay`` rebuilds each
pipeline from its configuration and feeds it the recorded calls again (the switch's frames in batches of 64,
as the packet rings hand them over), with the installed ``softswitch`` (run it with a checkout's venv to
measure that checkout): the process CPU per frame of ``process_batch`` against ``process`` frame by frame,
medians of ``--repeat`` replays with their spread; each replay's outputs and final registers and counters
must equal the frame-by-frame replay's (it stops with an error otherwise). Where the installed model keeps
count of the chain frames its batch path leaves to the per-frame path (``pipeline_chains.STATS``), it prints
that share too.
"""
from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time

import numpy as np

SWITCH_BATCH = 64


def _config(pipe) -> dict:
    return {
        "tables": {name: ([(e.match, e.action, e.params) for e in t.entries.values()], t.default)
                   for name, t in pipe.tables.items()},
        "groups": dict(pipe.multicast_groups),
    }


def _build(config: dict):
    from softswitch.pipeline import InaPipeline

    pipe = InaPipeline()
    for name, (entries, default) in config["tables"].items():
        for match, action, params in entries:
            pipe.insert_entry(name, match, action, params)
        if default != pipe.tables[name].default and not pipe.tables[name].spec.const_default:
            pipe.set_default_action(name, *default)
    for group, replicas in config["groups"].items():
        pipe.set_multicast_group(group, list(replicas))
    return pipe


def record(args: argparse.Namespace) -> None:
    sys.path.insert(0, ".")
    from host_agent.agent import AgentOptions
    from host_agent.host_member import CopyMode
    from host_agent.stream import StreamOptions
    from softswitch.pipeline import InaPipeline
    from topologies.loopback import LoopbackCluster, exact_sum

    pipes: dict[int, dict] = {}
    process, process_batch = InaPipeline.process, InaPipeline.process_batch

    def seen(pipe, kind):
        entry = pipes.get(id(pipe))
        if entry is None:
            entry = pipes[id(pipe)] = {"kind": kind, "config": _config(pipe), "calls": []}
        if kind == "copy":
            entry["kind"] = kind  # a copy hands single frames to process, batches to process_batch
        return entry

    def rec_process(self, port, frame):
        seen(self, "switch")["calls"].append((port, bytes(frame)))
        return process(self, port, frame)

    def rec_batch(self, port, frames, **kw):
        seen(self, "copy")["calls"].append((port, np.array(frames, copy=True)))
        return process_batch(self, port, frames, **kw)

    InaPipeline.process, InaPipeline.process_batch = rec_process, rec_batch
    racks = ["r1"] * 4 + ["r2"] * 4
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal(args.elements) * 3).astype(np.float32) for _ in racks]
    options = AgentOptions(stream=StreamOptions(op_timeout=20.0, rina_chains=True), rina_copy=CopyMode.THREAD)
    with LoopbackCluster(racks, ina_racks={"r1"}, slots=args.slots, pool=args.slots, backend="rina", seed=5,
                         options=options) as cl:  # the controller core writes the chains
        out = cl.run(lambda agent: [agent.allreduce(inputs[agent.rank]) for _ in range(args.calls)], timeout=300)
    expected = exact_sum(inputs)
    for results in out:
        for r in results:
            np.testing.assert_array_equal(r, expected)
    InaPipeline.process, InaPipeline.process_batch = process, process_batch
    with open(args.out, "wb") as f:
        pickle.dump(list(pipes.values()), f)
    for p in pipes.values():
        frames = sum(1 if isinstance(c[1], bytes) else len(c[1]) for c in p["calls"])
        print(f"{p['kind']}: {len(p['calls'])} calls, {frames} frames")


def _calls(entry: dict, batched: bool):
    """The recorded calls as (port, frames) batches; the switch's frames grouped by SWITCH_BATCH when batched."""
    if entry["kind"] == "copy":  # as the copy calls: one frame to process, more to process_batch
        calls = [(port, [rows] if isinstance(rows, bytes) else rows) for port, rows in entry["calls"]]
        if batched:
            return calls
        return [(port, [r if isinstance(r, bytes) else r.tobytes()]) for port, rows in calls for r in rows]
    calls = entry["calls"]
    if not batched:
        return [(port, [frame]) for port, frame in calls]
    out = []
    for i in range(0, len(calls), SWITCH_BATCH):
        chunk = calls[i : i + SWITCH_BATCH]
        out.append((np.array([p for p, _ in chunk], np.int64), [f for _, f in chunk]))
    return out


def _state(pipe):
    regs = pipe.register_snapshot()
    return [np.asarray(r).tolist() for r in regs], {k: list(v) for k, v in pipe.counters.items()}


def _run(entry: dict, batched: bool):
    pipe = _build(entry["config"])
    calls = _calls(entry, batched)
    out = []
    t0 = time.process_time()
    for port, frames in calls:
        if batched and len(frames) > 1:
            out += pipe.process_batch(port, frames)
        else:
            out += pipe.process(port, frames[0] if isinstance(frames[0], bytes) else frames[0].tobytes())
    cpu = time.process_time() - t0
    return cpu, out, _state(pipe)


def replay(args: argparse.Namespace) -> None:
    import softswitch.pipeline as model

    try:
        from softswitch import pipeline_chains
    except ImportError:
        pipeline_chains = None
    with open(args.input, "rb") as f:
        entries = pickle.load(f)
    report = {"model": model.__file__}
    for kind in ("copy", "switch"):
        mine = [e for e in entries if e["kind"] == kind]
        frames = sum(sum(1 if isinstance(c[1], bytes) else len(c[1]) for c in e["calls"]) for e in mine)
        if not frames:
            continue
        per_frame, batch = [], []
        for _ in range(args.repeat):
            if pipeline_chains is not None:
                pipeline_chains.STATS.clear()
            one_cpu = batch_cpu = 0.0
            for e in mine:
                c1, out1, st1 = _run(e, False)
                c2, out2, st2 = _run(e, True)
                if out1 != out2 or st1 != st2:
                    sys.exit(f"{kind}: the batch path's outputs or state differ from the per-frame path's")
                one_cpu, batch_cpu = one_cpu + c1, batch_cpu + c2
            per_frame.append(1e6 * one_cpu / frames)
            batch.append(1e6 * batch_cpu / frames)
        row = {"frames": frames, "per_frame_us": statistics.median(per_frame), "per_frame_spread": [min(per_frame), max(per_frame)],
               "batch_us": statistics.median(batch), "batch_spread": [min(batch), max(batch)]}
        if pipeline_chains is not None:
            row["chain_stats"] = dict(pipeline_chains.STATS)
        report[kind] = row
        print(f"{kind}: {frames} frames; per frame {row['per_frame_us']:.2f} us [{min(per_frame):.2f}-{max(per_frame):.2f}], "
              f"batch {row['batch_us']:.2f} us [{min(batch):.2f}-{max(batch):.2f}] per frame"
              + (f"; {row['chain_stats']}" if pipeline_chains is not None else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", default="chain_traffic.pkl")
    r.add_argument("--elements", type=int, default=65536)
    r.add_argument("--calls", type=int, default=3)
    r.add_argument("--slots", type=int, default=64)
    q = sub.add_parser("replay")
    q.add_argument("--in", dest="input", default="chain_traffic.pkl")
    q.add_argument("--repeat", type=int, default=5)
    q.add_argument("--json")
    args = p.parse_args()
    record(args) if args.cmd == "record" else replay(args)


if __name__ == "__main__":
    main()
