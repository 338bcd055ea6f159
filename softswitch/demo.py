"""A scripted all-reduce through the embedded switch's pipeline: K workers' float32 gradients in, their sum out.

    python -m softswitch.demo [--workers 4] [--elements 100000] [--slots 64]

Each worker quantises its gradient to int32 fixed point, cuts it into LANES-wide chunks and sends them as
INA packets (SwitchML's scheme: chunk c in slot c mod S, shadow copy (c div S) mod 2); the switch sums
them and multicasts each result to every worker. The demo checks every worker got the exact integer sum
and that it matches numpy's float sum within the quantisation error.
"""
from __future__ import annotations

import argparse
import ipaddress
import sys
import time

import numpy as np

from inaproto import wire
from inaproto.job_entries import WorkerAddress, job_entries
from p4src.ina_model import InaPipeline

SWITCH_MAC = bytes.fromhex("0200000000fe")
SWITCH_IP = ipaddress.IPv4Address("10.0.0.254").packed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m softswitch.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="number of workers (1-32)")
    parser.add_argument("--elements", type=int, default=100_000, help="float32 gradient elements per worker")
    parser.add_argument("--slots", type=int, default=64, help="aggregator slots granted to the job")
    parser.add_argument("--scale", type=float, default=2.0**16, help="fixed-point scale")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= wire.MAX_WORKERS or args.elements < 1 or not 1 <= args.slots <= wire.NUM_SLOTS:
        parser.error("need 1-32 workers, at least one element and 1-1024 slots")

    k, job_id, group = args.workers, 1, 1
    switch = InaPipeline()
    macs = [bytes.fromhex(f"0200000001{i + 1:02x}") for i in range(k)]
    ips = [ipaddress.IPv4Address(f"10.0.1.{i + 1}").packed for i in range(k)]
    entries = job_entries(job_id, [WorkerAddress(i, i + 1, macs[i], ips[i], 40000 + i) for i in range(k)],
                          base_slot=0, num_slots=args.slots, generation=0, mcast_grp=group)
    entries.insert_into(switch)

    rng = np.random.default_rng(0)
    grads = rng.normal(0, 1, size=(k, args.elements)).astype(np.float32)
    fixed = np.rint(grads * args.scale).astype(np.int32)
    chunks = -(-args.elements // wire.LANES)
    padded = np.zeros((k, chunks * wire.LANES), dtype=np.int32)
    padded[:, : args.elements] = fixed
    results = np.zeros((k, chunks * wire.LANES), dtype=np.int64)

    print(f"{k} workers x {args.elements} float32 -> {chunks} chunks of {wire.LANES} lanes, {args.slots} slots")
    t0 = time.perf_counter()
    sent = received = 0
    for c in range(chunks):
        header = wire.InaHeader(wire.MsgType.GRADIENT, 0, job_id, 0, c % args.slots, c, 0, (c // args.slots) % 2)
        for i in range(k):
            payload = wire.encode_payload(header._replace(worker_id=i), padded[i, c * wire.LANES : (c + 1) * wire.LANES])
            frame = wire.udp_frame(macs[i], SWITCH_MAC, ips[i], SWITCH_IP, 40000 + i, wire.INA_UDP_PORT, payload)
            sent += 1
            for port, out in switch.process(i + 1, frame):
                h, lanes = wire.decode_payload(out, wire.INA_OFFSET)
                assert h.msg_type == wire.MsgType.RESULT and h.worker_id == port - 1
                results[port - 1, h.seq * wire.LANES : (h.seq + 1) * wire.LANES] = lanes
                received += 1
    elapsed = time.perf_counter() - t0

    exact = fixed.astype(np.int64).sum(axis=0)
    ok = all(np.array_equal(results[i, : args.elements], exact) for i in range(k))
    error = np.abs(results[0, : args.elements] / args.scale - grads.astype(np.float64).sum(axis=0)).max()
    print(f"sent {sent} gradient packets, received {received} results in {elapsed:.2f} s ({sent / elapsed:,.0f} packets/s)")
    print(f"every worker got the exact int32 sum: {ok}; max error vs float sum: {error:.2e} (bound {k * 0.5 / args.scale:.2e})")
    agg = switch.counter("MyIngress.ina_aggregated")[job_id]
    res = switch.counter("MyEgress.ina_results")[job_id]
    print(f"switch counters: ina_aggregated={agg} ina_results={res}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
