"""Benchmarks of the worker agent, printed as ratios measured side by side in one run (stops by itself in < 2 min).

    python bench/agent_bench.py [--quick] [--json results.json]

1. Packet rate: the agent's INA sender (a one-worker job, window of 256 chunks; one system call per packet)
   against a plain Python UDP sender keeping the same window of pre-built packets in flight (one sendto per
   packet, one recv_into per result), both through the same UDP echo process that answers every packet as a
   one-worker switch would (batched itself, so that it is not the limit); 3 alternating runs each, medians
   with min/max, per wall-clock second and per CPU-second of the sending thread, and the machine's load.
2. INA vs ring all-reduce for n = 2, 4, 8 workers on equal emulated links (``link_bps``: INA packets
   paced at their size on the wire, ring steps last their bytes over the same rate) on loopback, with
   the switch model in its own process. Printed beside the ideal ratio n / (2(n-1)) (INA moves each
   byte up and down once, the ring 2(n-1)/n times), and that ideal corrected for header overhead
   (184-byte INA frames carry 128 bytes of data; TCP segments 1448 of 1514).
3. Where torch is installed: the agent's ring against torch.distributed's gloo all_reduce, n processes.
(The INA sender and the reallocation pause: bench/sender_bench.py.)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import socket
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np

from host_agent.acceptor import Acceptor
from host_agent.agent import bind_worker_sockets
from host_agent.grant import Grant, SwitchGrant, Worker
from host_agent.options import StreamOptions
from host_agent.ring import HELLO_MAGIC as RING_HELLO
from host_agent.stream import ChunkStream
from host_agent.udp_io import gso_supported
from inaproto import wire

DEADLINE = time.monotonic() + 110.0


def _left() -> float:
    return DEADLINE - time.monotonic()


# --------------------------------------------------------------------------- 1. packet rate


def _echo(conn) -> None:
    """A one-worker switch: every GRADIENT comes back as its RESULT (msg_type 2), to its sender.

    Batched itself (drains until the socket would block, answers each sender's run in GSO batches), so
    that the echo is not what limits either sender: both see the same echo."""
    from host_agent.udp_io import DatagramIo

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    io = DatagramIo(sock, batched=True, name="echo")
    conn.send(sock.getsockname()[1])
    size = wire.INA_PAYLOAD_LEN
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    peer: list = [None]
    poll = select.poll()
    poll.register(sock, select.POLLIN)

    def on_run(off: int, length: int, count: int) -> int:
        return length * count if length == size else 0

    stop = False
    while not stop:
        if not poll.poll(500):
            if conn.poll():
                return
            continue
        while True:  # recvmsg for the sender's address once per wake-up, then the batched drain
            try:
                n, _anc, _fl, addr = sock.recvmsg_into([view[: io.read_room]], socket.CMSG_SPACE(4))
            except BlockingIOError:
                break
            if n == 4 and buf[:4] == b"STOP":
                stop = True
                break
            peer[0] = addr
            k = n // size * size
            k += io.drain(view[k:], on_run)
            if k:
                buf[0:k:size] = b"\x02" * (k // size)
                io.send_run(view[:k], size, k // size, addr)


def plain_sender(addr: tuple[str, int], count: int, window: int) -> tuple[float, float]:
    """(packets per wall second, per CPU second of the sending thread) of a bare per-packet loop keeping
    ``window`` pre-built INA packets in flight through ``addr``: one sendto per packet, one recv_into per
    result."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.5)
    payload = wire.encode_payload(wire.InaHeader(1, 0, 1, 0, 0, 0, 0, 0), np.arange(wire.LANES, dtype=np.int32))
    buf = bytearray(2048)
    sent = received = 0
    start, cpu = time.perf_counter(), time.thread_time()
    while received < count:
        while sent - received < window and sent < count:
            sock.sendto(payload, addr)
            sent += 1
        try:
            sock.recv_into(buf)
        except TimeoutError:
            sent = received  # lost: refill the window
            continue
        received += 1
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    sock.close()
    return count / elapsed, count / cpu


def agent_sender(addr: tuple[str, int], count: int, window: int) -> tuple[float, float]:
    """(chunks per wall second, per CPU second) of the agent's INA path (a one-worker job with
    ``window`` slots) through ``addr``; the stream runs in this thread."""
    udp, tcp = bind_worker_sockets("127.0.0.1")
    me = Worker(0, "127.0.0.1", udp.getsockname()[1])
    grant = Grant(1, 0, "ina", (SwitchGrant("echo", addr[0], num_slots=window, worker_ids=(0,)),), ina_port=addr[1])
    acceptor = Acceptor(tcp, (RING_HELLO,))
    stream = ChunkStream(worker_id=0, workers=(me,), sock=udp, ring_inbox=acceptor.inbox(RING_HELLO), grant=grant,
                         backend="ina", options=StreamOptions())
    chunks = np.random.default_rng(0).integers(-1000, 1000, size=(count, wire.LANES), dtype=np.int32)
    stream.reduce(chunks[:window])  # warm-up: the first call syncs
    start, cpu = time.perf_counter(), time.thread_time()
    total = stream.reduce(chunks)
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    assert np.array_equal(total, chunks), "the echo returns each chunk unchanged"
    stream.close()
    acceptor.close()
    udp.close()
    return count / elapsed, count / cpu


def _spread(runs: list[float]) -> str:
    med = statistics.median(runs)
    return f"{med:10,.0f} ({min(runs) / med * 100 - 100:+.0f}%/{max(runs) / med * 100 - 100:+.0f}%)"


def bench_packet_rate(count: int, window: int, rounds: int) -> dict:
    """The agent against the plain per-packet sender, alternating."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(child,), daemon=True)
    proc.start()
    load_before = os.getloadavg()
    kinds = {"plain": lambda a: plain_sender(a, count, window),
             "agent": lambda a: agent_sender(a, count, window)}
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    try:
        port = parent.recv()
        addr = ("127.0.0.1", port)
        for _ in range(rounds):  # alternate, so drifts hit all
            for name, fn in kinds.items():
                runs[name].append(fn(addr))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"STOP", addr)
        s.close()
    finally:
        parent.send("stop")
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    out: dict = {"packets": count, "window": window, "rounds": rounds, "load_before": load_before,
                 "load_after": os.getloadavg(), "gso": gso_supported(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))}
    for name, r in runs.items():
        out[f"{name}_pps"] = statistics.median(x[0] for x in r)
        out[f"{name}_pps_per_cpu"] = statistics.median(x[1] for x in r)
        out[f"{name}_runs"] = r
    out["ratio"] = out["agent_pps"] / out["plain_pps"]
    out["cpu_ratio"] = out["agent_pps_per_cpu"] / out["plain_pps_per_cpu"]
    return out


def print_packet_rate(pr: dict) -> None:
    n = pr["rounds"]
    for name, label in (("plain", "plain per-packet Python sender"), ("agent", "agent INA sender")):
        wall = [x[0] for x in pr[f"{name}_runs"]]
        cpu = [x[1] for x in pr[f"{name}_runs"]]
        print(f"  {label:34s} {_spread(wall)} packets/s   {_spread(cpu)} per CPU-second")
    print(f"  (medians of {n} runs, min/max in brackets; GSO {'on' if pr['gso'] else 'unavailable'}; load "
          f"{pr['load_before'][0]:.2f} before, {pr['load_after'][0]:.2f} after, {os.cpu_count()} CPUs)")
    print(f"  agent / plain: {pr['ratio']:.2f}x the packet rate, {pr['cpu_ratio']:.2f}x per CPU-second", flush=True)


# --------------------------------------------------------------------------- 2. INA vs ring


class _DelayRelay:
    """Propagation delay on loopback: agents send to ``address``; every datagram is held ``rtt / 2`` each way.

    The switch knows worker ``i`` by the relay's socket ``i`` (its results come back through it), so both
    directions are delayed, in order, by one thread with a queue of deadlines (no netem on this kernel).
    """

    def __init__(self, workers: list[tuple[int, str, int]], switch: tuple[str, int], rtt: float) -> None:
        self.half, self.switch = rtt / 2, switch
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.address = self.front.getsockname()
        self.back = {}
        self.agent_of: dict[int, tuple[str, int]] = {}
        self.by_agent: dict[tuple[str, int], socket.socket] = {}
        for i, ip, port in workers:
            b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            b.bind(("127.0.0.1", 0))
            self.back[i] = b
            self.agent_of[b.fileno()] = (ip, port)
            self.by_agent[(ip, port)] = b
        for sk in [self.front, *self.back.values()]:
            sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sk.setblocking(False)
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def worker_address(self, i: int) -> tuple[str, int]:
        return self.back[i].getsockname()

    def _run(self) -> None:
        import collections

        poll = select.poll()
        socks = {sk.fileno(): sk for sk in [self.front, *self.back.values()]}
        for fd in socks:
            poll.register(fd, select.POLLIN)
        held: collections.deque = collections.deque()  # (deadline, socket, data, destination): one delay, so FIFO
        while not self.stop:
            now = time.monotonic()
            while held and held[0][0] <= now:
                _, sk, data, dest = held.popleft()
                try:
                    sk.sendto(data, dest)
                except OSError:
                    pass
            wait = (held[0][0] - now) if held else 0.05
            for fd, _ in poll.poll(max(wait, 0) * 1000.0):
                sk = socks[fd]
                while True:
                    try:
                        data, src = sk.recvfrom(2048)
                    except BlockingIOError:
                        break
                    due = time.monotonic() + self.half
                    if sk is self.front:
                        out = self.by_agent.get(src)
                        if out is not None:
                            held.append((due, out, data, self.switch))
                    else:
                        held.append((due, self.front, data, self.agent_of[fd]))


def _switch(conn, workers: list[tuple[int, str, int]], slots: int, drop: float = 0.0, rtt: float = 0.0) -> None:
    from softswitch.udp import Faults, UdpSwitch

    sw = UdpSwitch("s1", faults=Faults(drop=drop), seed=7)
    relay = _DelayRelay(workers, sw.address, rtt) if rtt else None
    ws = [Worker(i, *(relay.worker_address(i) if relay else (ip, port))) for i, ip, port in workers]
    sw.install_job(1, ws, 0, slots, 0)
    if relay:
        relay.thread.start()
    conn.send(relay.address if relay else sw.address)
    conn.recv()
    conn.send({"received": sw.received, "forwarded": sw.forwarded})
    if relay:
        relay.stop = True
    sw.close()


def _time_backend(n: int, backend: str, elements: int, iterations: int, link_bps: float, slots: int,
                  drop: float = 0.0, rtt: float = 0.0) -> tuple[float, dict]:
    """Median time of ``iterations`` all-reduces; the switch's counters and the workers' summed stream stats."""
    sockets = [bind_worker_sockets("127.0.0.1") for _ in range(n)]
    workers = tuple(Worker(i, "127.0.0.1", s[0].getsockname()[1]) for i, s in enumerate(sockets))
    proc = None
    if backend == "ina":
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_switch, args=(child, [(w.worker_id, w.ip, w.udp_port) for w in workers], slots, drop, rtt),
                           daemon=True)
        proc.start()
        ip, port = parent.recv()
        grant = Grant(1, 0, "ina", (SwitchGrant("s1", ip, num_slots=slots, worker_ids=tuple(range(n))),), ina_port=port)
    else:
        grant = Grant.ring_only(1)
    opts = StreamOptions(op_timeout=30.0, link_bps=link_bps)
    stats: list = [None] * n
    rng = np.random.default_rng(n)
    data = [rng.integers(-2**20, 2**20, size=(-(-elements // wire.LANES), wire.LANES), dtype=np.int32) for _ in range(n)]
    want = np.sum(np.stack(data).astype(np.int64), axis=0)
    times: list[list[float]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            acceptor = Acceptor(sockets[i][1], (RING_HELLO,))
            stream = ChunkStream(worker_id=i, workers=workers, sock=sockets[i][0], ring_inbox=acceptor.inbox(RING_HELLO),
                                 grant=grant, backend=backend, options=opts)
            stream.reduce(data[i][:4])  # warm-up: sync, ring connections
            for _ in range(iterations):
                barrier.wait(30)
                t0 = time.perf_counter()
                out = stream.reduce(data[i])
                times[i].append(time.perf_counter() - t0)
                if not np.array_equal(out, want):
                    raise AssertionError(f"worker {i}: wrong {backend} sum")
            stats[i] = stream.stats
            stream.close()
            acceptor.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            barrier.abort()
        finally:
            sockets[i][0].close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(_left(), 1.0))
    extra = {}
    if proc is not None:
        parent.send("stop")
        extra = parent.recv() if parent.poll(5) else {}
        proc.join(5)
    if errors:
        raise errors[0]
    per_iter = [max(times[i][k] for i in range(n)) for k in range(iterations)]  # the slowest worker finishes it
    keys = ("chunks", "retransmits", "spurious_resends", "early_resends", "timeouts")
    extra["stats"] = {k: sum(getattr(st, k, 0) for st in stats) for k in keys}
    return statistics.median(per_iter), extra


def bench_ina_vs_ring(sizes: tuple[int, ...], elements: int, iterations: int, link_bps: float, slots: int) -> list[dict]:
    rows = []
    framing = (wire.INA_FRAME_LEN / wire.INA_DATA_LEN) / (1514 / 1448)
    for n in sizes:
        if _left() < 15:
            print(f"  n={n}: skipped (time budget)")
            continue
        ina, counters = _time_backend(n, "ina", elements, iterations, link_bps, slots)
        ring, _ = _time_backend(n, "ring", elements, iterations, link_bps, slots)
        ideal = n / (2 * (n - 1))
        rows.append({"n": n, "elements": elements, "link_bps": link_bps, "ina_s": ina, "ring_s": ring,
                     "ina_over_ring": ina / ring, "ideal": ideal, "ideal_with_headers": ideal * framing,
                     "switch": counters})
        print(f"  n={n}: INA {ina * 1e3:8.1f} ms   ring {ring * 1e3:8.1f} ms   INA/ring {ina / ring:5.2f}   "
              f"ideal n/(2(n-1)) {ideal:5.2f}   ideal with headers {ideal * framing:5.2f}", flush=True)
    return rows


# --------------------------------------------------------------------------- 3. ring vs gloo


def _gloo_child(rank: int, n: int, store: str, workers: str, elements: int, iterations: int, out) -> None:
    try:
        import torch
        import torch.distributed as dist

        from host_agent.agent import Agent
        from host_agent.grant import JobSpec, parse_workers

        dist.init_process_group("gloo", store=dist.FileStore(store, n), rank=rank, world_size=n)
        x = np.random.default_rng(rank).standard_normal(elements).astype(np.float32)
        t = torch.from_numpy(x.copy())
        gloo, ours = [], []
        for _ in range(iterations + 1):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            gloo.append(time.perf_counter() - t0)
        agent = Agent(JobSpec("gloo-bench", parse_workers(workers), backend="ring"), rank)
        for _ in range(iterations + 1):
            dist.barrier()
            t0 = time.perf_counter()
            agent.allreduce(x)
            ours.append(time.perf_counter() - t0)
        agent.close()
        dist.destroy_process_group()
        out.put((rank, statistics.median(gloo[1:]), statistics.median(ours[1:])))
    except BaseException as exc:  # noqa: BLE001
        out.put((rank, None, repr(exc)))


def bench_gloo(sizes: tuple[int, ...], elements: int, iterations: int, tmpdir: str) -> list[dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  torch is not installed: skipped (pip install torch==2.13.0)")
        return []
    rows = []
    ctx = mp.get_context("spawn")
    for n in sizes:
        if _left() < 25:
            print(f"  n={n}: skipped (time budget)")
            continue
        socks = [bind_worker_sockets("127.0.0.1") for _ in range(n)]
        workers = ",".join(f"127.0.0.1:{u.getsockname()[1]}" for u, _ in socks)
        for u, t in socks:
            u.close()
            t.close()
        out = ctx.Queue()
        store = os.path.join(tmpdir, f"gloo-store-{n}-{os.getpid()}")
        procs = [ctx.Process(target=_gloo_child, args=(r, n, store, workers, elements, iterations, out), daemon=True)
                 for r in range(n)]
        for p in procs:
            p.start()
        res = [out.get(timeout=max(_left(), 5)) for _ in range(n)]
        for p in procs:
            p.join(10)
        if any(r[1] is None for r in res):
            print(f"  n={n}: failed: {next(r[2] for r in res if r[1] is None)}")
            continue
        gloo = max(r[1] for r in res)
        ours = max(r[2] for r in res)
        rows.append({"n": n, "elements": elements, "gloo_s": gloo, "agent_ring_s": ours, "agent_over_gloo": ours / gloo})
        print(f"  n={n}: gloo {gloo * 1e3:8.2f} ms   agent ring {ours * 1e3:8.2f} ms   agent/gloo {ours / gloo:5.2f}",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about 30 s)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    quick = args.quick
    results: dict = {"cpu_count": os.cpu_count()}
    window = 256
    print(f"1. packet rate through a UDP echo (one-worker switch, batched itself), window {window}", flush=True)
    pr = bench_packet_rate(count=40_000 if quick else 100_000, window=window, rounds=3)
    results["packet_rate"] = pr
    print_packet_rate(pr)

    bps = 2e6
    elements = 8192 if quick else 16384
    print(f"2. INA vs ring all-reduce of {elements} float32, links emulated at {bps / 1e6:g} Mbit/s per worker, "
          "switch model in its own process", flush=True)
    results["ina_vs_ring"] = bench_ina_vs_ring((2, 4, 8), elements, 2 if quick else 3, bps, slots=64)

    print("3. agent ring vs torch.distributed gloo all_reduce (processes, loopback, no shaping)", flush=True)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results["ring_vs_gloo"] = bench_gloo((2, 4) if not quick else (2,), 1_000_000, 5, tmp)

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
