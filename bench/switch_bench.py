"""Throughput of ``ina-switch`` over veth, as a ratio to a bare per-packet Python loop on the same path.

    python bench/switch_bench.py [--workers 2 4] [--seconds 3] [--window 128] [--baseline DIR] [--json results.json]

Needs root. For each worker count N it builds, inside network namespaces it creates (and always removes):
one switch namespace with ports 1..N and N worker namespaces, each joined to the switch by a veth pair.
Every worker is a process in its own namespace that keeps ``--window`` chunks in flight (SwitchML's
scheme: chunk c in slot c mod W, shadow copy (c div W) mod 2, next chunk sent when a result comes back,
everything in flight resent after a 20 ms silence) and checks each result is the exact sum. By default
(``--sender rings``) a worker does its own I/O on PACKET_MMAP rings (bench/packet_ring.py): every result ready
is read as one array, checked with one comparison, and the next chunks are written as rows of a prebuilt frame
and handed to the kernel with one send(); when fewer than 16 results are ready it waits 0.2 ms once for more.
So the workers can offer and absorb more than the switch's rate without eating the CPU the switch needs (one
recv()/send() per frame, ``--sender socket``, cost them 7-11 us of CPU per frame, more than the bare loop
they measure). The table gives the workers' CPU per frame beside the ratios.

Per N and round, alternated, on the same machine, in the same process:

- ceiling: the switch namespace runs a bare Python echo (epoll, recv, send the frame back on its port),
  the least work a Python program can do per frame on this path. Each worker counts its own frames
  coming back, so per frame in there is exactly one frame out, as in the switch run on average.
- ina-switch: the real process (``ina-switch -i 1@sw-eth1 ... -- --grpc-server-addr 127.0.0.1:PORT``),
  configured over P4Runtime with one job of N workers.
- with ``--baseline DIR``, also the ``ina-switch`` of the checkout DIR (its ``.venv``, else this interpreter
  with DIR first on the path): a change's figure before and after, side by side in one run.

It prints aggregated packets per second (gradient packets the switch consumed), results per second
(completed slots, each multicast to N workers) and the ratio of aggregated packets per second to the
echo's frames per second: medians over the rounds with their spread (min-max), the switch process's CPU
and the machine's load. The workers share the machine's CPUs with the switch, so where the switch needs
less CPU per frame than the workers can generate, the rate is bounded by the workers: the table also gives
frames per CPU-second of the middle process, the cost per frame independent of that bound. Everything stops by itself (each run is ``--seconds`` long plus about one second
of set-up), and the namespaces are removed even when something fails.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np

from inaproto import wire
from inaproto.job_entries import JobEntries, WorkerAddress, job_entries

JOB_ID, GROUP = 1, 1
MODES = ("echo", "switch")  # the bare per-packet loop, then ina-switch (and "baseline": another checkout's)
MODE_LABELS = {"echo": "bare per-packet loop", "switch": "ina-switch", "baseline": "ina-switch (baseline)"}
SWITCH_MAC = bytes.fromhex("0200000000fe")
SWITCH_IP = bytes([10, 0, 0, 254])
RTO = 0.02
O_INA = wire.INA_OFFSET
O_DATA = wire.INA_OFFSET + wire.INA_HEADER_LEN


def worker_mac(i: int) -> bytes:
    return bytes.fromhex(f"0200000001{i + 1:02x}")


def worker_ip(i: int) -> bytes:
    return bytes([10, 0, 1, i + 1])


def worker_lanes(i: int) -> list[int]:
    return [(lane * 1000 + i * 7 - 500) for lane in range(wire.LANES)]


# --- roles run inside the namespaces -------------------------------------------------------------------
SENDERS = ("rings", "socket")  # the workers' own I/O: PACKET_MMAP rings with prebuilt frames, or one send() per frame
# A whole INA frame as a numpy record (the fields the workers write or read), so a run of chunks is built in one pass.
FRAME_DTYPE = np.dtype({"names": list(wire.PAYLOAD_DTYPE.names),
                        "formats": [wire.PAYLOAD_DTYPE.fields[f][0] for f in wire.PAYLOAD_DTYPE.names],
                        "offsets": [O_INA + wire.PAYLOAD_DTYPE.fields[f][1] for f in wire.PAYLOAD_DTYPE.names],
                        "itemsize": wire.INA_FRAME_LEN})


def _worker_socket(iface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.setsockopt(263, 23, 1)  # PACKET_IGNORE_OUTGOING
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((iface, 0x0003))
    return sock


def _worker_template(wid: int, workers: int, generation: int, echo: bool) -> tuple[bytearray, bytes]:
    """A worker's gradient frame (seq 0) and the lanes every result must carry."""
    lanes = np.array(worker_lanes(wid), dtype=np.int32)
    header = wire.InaHeader(wire.MsgType.GRADIENT, 0, JOB_ID, generation, 0, 0, wid, 0)
    template = bytearray(
        wire.udp_frame(worker_mac(wid), SWITCH_MAC, worker_ip(wid), SWITCH_IP, 40000 + wid, wire.INA_UDP_PORT,
                       wire.encode_payload(header, lanes))
    )
    if echo:
        return template, bytes(template[O_DATA:])
    total = sum(np.array(worker_lanes(i), dtype=np.int64) for i in range(workers))
    return template, total.astype(">i4").tobytes()


def _wait_for_start() -> float:
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    while time.time() < start_at:
        time.sleep(0.001)
    return start_at


def run_worker(iface: str, wid: int, workers: int, window: int, warmup: float, seconds: float, echo: bool, generation: int,
               sender: str = "rings") -> dict:
    """One worker: windowed sender and result checker on a raw socket; returns its counts as a dict.

    ``sender`` rings: the worker's own PACKET_MMAP rings (bench/packet_ring.py): every result ready is read in
    one batch, checked with one comparison, and the next chunks are written as rows of prebuilt frames and
    handed to the kernel with one send(), so a worker costs far less CPU per frame than the switch it drives.
    socket: one recv() and one send() per frame. Prints ``ready`` once set up, then reads the wall-clock
    start time from stdin (all workers start together).
    """
    if sender == "rings":
        try:
            return _run_ring_worker(iface, wid, workers, window, warmup, seconds, echo, generation)
        except OSError as e:  # RingUnavailable: the kernel refuses rings; one frame per syscall instead
            print(f"worker {wid}: rings unavailable ({e}); one send() per frame", file=sys.stderr, flush=True)
    sock = _worker_socket(iface)
    template, expected = _worker_template(wid, workers, generation, echo)
    send, pack_into = sock.send, wire.HEADER.pack_into
    gradient = int(wire.MsgType.GRADIENT)

    def send_chunk(c: int, flags: int = 0) -> None:
        pack_into(template, O_INA, gradient, flags, JOB_ID, generation, c % window, c, wid, (c // window) & 1)
        send(template)

    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    buf = bytearray(2048)
    view = memoryview(buf)
    recv_into, unpack_from = sock.recv_into, wire.HEADER.unpack_from
    in_flight = {}  # slot -> chunk
    start_at = _wait_for_start()
    t_begin, t_end = start_at + warmup, start_at + warmup + seconds
    base = None  # results when the measured window began
    results = bad = resent = 0
    stalls = []
    for c in range(window):
        in_flight[c] = c
        send_chunk(c)
    now = time.time()
    while now < t_end:
        if not poller.poll(RTO * 1000):
            for c in in_flight.values():
                send_chunk(c, wire.Flags.RETRANSMIT)
                resent += 1
            now = time.time()
            stalls.append(round(now - start_at, 3))
            continue
        for _ in range(256):
            try:
                n = recv_into(buf, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if n != wire.INA_FRAME_LEN:
                continue
            seq = unpack_from(buf, O_INA)[5]
            slot = seq % window
            if in_flight.get(slot) != seq:
                continue  # a late duplicate
            results += 1
            if view[O_DATA:n] != expected:
                bad += 1
            nxt = seq + window
            in_flight[slot] = nxt
            send_chunk(nxt)
        now = time.time()
        if base is None and now >= t_begin:
            base = results
    measured = results - base if base is not None else 0
    sock.close()
    return {"worker": wid, "results": results, "measured": measured, "bad": bad, "resent": resent, "stalls": stalls[:10],
            "sender": "socket"}


RX_BATCH = 4096  # results a ring worker reads at once
COALESCE_FRAMES = 16  # fewer results ready than this: the ring worker waits COALESCE_S once for more
COALESCE_S = 0.0002


def _joined(a: np.ndarray | list, b: np.ndarray | list) -> np.ndarray | list:
    """Two receive batches as one (an array if both are arrays of one width, else a list)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape[1:] == b.shape[1:]:
        return np.concatenate([a, b]) if len(a) else b
    return [*(rows_list(a)), *(rows_list(b))]


def rows_list(frames: np.ndarray | list) -> list:
    return [r.tobytes() for r in frames] if isinstance(frames, np.ndarray) else list(frames)


def _run_ring_worker(iface: str, wid: int, workers: int, window: int, warmup: float, seconds: float, echo: bool,
                     generation: int) -> dict:
    """``run_worker`` on PACKET_MMAP rings: batches of results in, batches of prebuilt chunks out."""
    from packet_ring import PacketRing

    sock = _worker_socket(iface)
    ring = PacketRing(sock, rx_frames=max(256, 4 * window), tx_frames=max(256, 2 * window))
    template, expected = _worker_template(wid, workers, generation, echo)
    row = np.frombuffer(bytes(template), np.uint8)
    want = np.frombuffer(expected, np.uint8)
    gradient = int(wire.MsgType.GRADIENT)

    def send_chunks(chunks: np.ndarray, flags: int = 0) -> None:
        rows = np.repeat(row[None, :], len(chunks), axis=0)
        rec = rows.reshape(-1).view(FRAME_DTYPE)
        rec["msg_type"], rec["flags"] = gradient, flags
        rec["slot"] = chunks % window
        rec["seq"] = chunks
        rec["reserved_shadow"] = (chunks // window) & 1
        ring.send_rows(rows)
        ring.flush()

    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    in_flight = np.arange(window, dtype=np.int64)  # slot -> the chunk in it
    mark, positions = np.zeros(window, np.int64), np.arange(RX_BATCH, dtype=np.int64)  # scratch: repeated slots
    start_at = _wait_for_start()
    t_begin, t_end = start_at + warmup, start_at + warmup + seconds
    base = None
    results = bad = resent = batches = 0
    stalls = []
    send_chunks(in_flight.copy())
    now = time.time()
    while now < t_end:
        frames = ring.receive_batch(RX_BATCH)
        if len(frames) < COALESCE_FRAMES:  # let results gather: fewer, larger batches (the switch gets the CPU meanwhile)
            time.sleep(COALESCE_S)
            more = ring.receive_batch(RX_BATCH - len(frames))
            if len(more):
                frames = _joined(frames, more)
        if not len(frames):
            if not poller.poll(RTO * 1000):
                send_chunks(in_flight.copy(), int(wire.Flags.RETRANSMIT))
                resent += window
                now = time.time()
                stalls.append(round(now - start_at, 3))
            continue
        if isinstance(frames, list):
            kept = [bytes(f) for f in frames if len(f) == wire.INA_FRAME_LEN]
            if not kept:
                continue
            frames = np.frombuffer(b"".join(kept), np.uint8).reshape(len(kept), wire.INA_FRAME_LEN)
        elif frames.shape[1] != wire.INA_FRAME_LEN:
            continue
        batches += 1
        seq = frames.reshape(-1).view(FRAME_DTYPE)["seq"].astype(np.int64)
        slot = seq % window
        fresh = in_flight[slot] == seq
        if not fresh.all():  # late duplicates
            frames, seq, slot = frames[fresh], seq[fresh], slot[fresh]
        order = positions[: len(slot)]
        mark[slot] = order
        if (mark[slot] != order).any():  # one result twice in this batch: keep the first
            slot, first = np.unique(slot, return_index=True)
            frames, seq = frames[first], seq[first]
        if not len(seq):
            continue
        results += len(seq)
        bad += int((frames[:, O_DATA:] != want).any(axis=1).sum())
        nxt = seq + window
        in_flight[slot] = nxt
        send_chunks(nxt)
        now = time.time()
        if base is None and now >= t_begin:
            base = results
    measured = results - base if base is not None else 0
    ring.close()
    sock.close()
    return {"worker": wid, "results": results, "measured": measured, "bad": bad, "resent": resent, "stalls": stalls[:10],
            "sender": "rings", "batches": batches}


def run_echo(ifaces: list[str], stop_after: float) -> dict:
    """The ceiling: a bare Python AF_PACKET echo that sends every frame back out of the port it came in on."""
    socks = []
    for iface in ifaces:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        s.setsockopt(263, 23, 1)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            s.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        s.bind((iface, 0x0003))
        socks.append(s)
    ep = select.epoll()
    table = {}
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
        table[s.fileno()] = (s.recv, s.send)
    print("ready", flush=True)
    echoed = 0
    deadline = time.monotonic() + stop_after
    dontwait = socket.MSG_DONTWAIT
    while time.monotonic() < deadline:
        for fd, _ in ep.poll(0.2):
            recv, send = table[fd]
            for _ in range(64):
                try:
                    frame = recv(65536, dontwait)
                except BlockingIOError:
                    break
                send(frame)
                echoed += 1
    return {"echoed": echoed}


# --- the driver -------------------------------------------------------------------------------------------
def _cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far (0, 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_seconds(pid: int) -> float:
    return sum(_cpu_split(pid))


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def _job_entries(n: int, window: int, generation: int) -> JobEntries:
    workers = [WorkerAddress(i, i + 1, worker_mac(i), worker_ip(i), 40000 + i) for i in range(n)]
    return job_entries(JOB_ID, workers, base_slot=0, num_slots=window, generation=generation, mcast_grp=GROUP)


def _install_job(client, n: int, window: int) -> None:
    """The job's entries, through the controller's P4Runtime client, in the controller's order."""
    from controller.p4entity import MulticastGroup, TableEntry

    entries = _job_entries(n, window, 0)
    client.insert(TableEntry(entries.job.table, entries.job.match, entries.job.action, entries.job.params))
    client.insert(MulticastGroup(entries.group.group_id, tuple(entries.group.replicas)))
    client.insert(*(TableEntry(w.table, w.match, w.action, w.params) for w in (*entries.bindings, *entries.workers)))


class Switch:
    """ina-switch in the switch namespace with one job of n workers (started for one run: it must not be
    running while the echo is, since it would read every frame too)."""

    def __init__(self, net, n: int, window: int, log_dir: Path, command: list[str] | None = None) -> None:
        from controller.p4entity import Schema
        from controller.switch import Switch as P4RuntimeSwitch
        from controller.switch import SwitchOptions
        from topologies.switch_process import SwitchProcess

        self.n, self.window, self.generation = n, window, 0
        self.process = SwitchProcess(net, log_dir, core_args=["-L", "info"], command=command)
        try:
            schema = Schema.from_file(ROOT / "p4src" / "ina.p4info.txt")
            self.client = P4RuntimeSwitch(SwitchOptions("s1", self.process.address, self.process.device_id), schema)
            self.client.connect()
            self.client.push_pipeline(schema.p4info, b"")
            _install_job(self.client, n, window)
        except BaseException:
            self.process.stop()
            raise

    def next_generation(self) -> int:
        self.generation += 1
        from controller.p4entity import TableEntry

        job = _job_entries(self.n, self.window, self.generation).job
        self.client.modify(TableEntry(job.table, job.match, job.action, job.params))
        return self.generation

    def close(self) -> None:
        self.client.close()
        self.process.stop()
        for line in self.process.process.log_path.read_text(errors="replace").splitlines():
            if "lost" in line or ("send errors" in line and " 0 send errors" not in line):
                print("   ", line.split("] ")[-1], flush=True)  # the switch's own losses (kernel buffers, sends)


def baseline_command(checkout: Path) -> list[str]:
    """The ina-switch of another checkout: its virtual environment's, else this interpreter with it first on the
    path (``env PYTHONPATH=DIR python -m softswitch.cli``)."""
    script = checkout / ".venv" / "bin" / "ina-switch"
    if script.exists():
        return [str(script)]
    return ["env", f"PYTHONPATH={checkout}", sys.executable, "-m", "softswitch.cli"]


def run_once(net, mode: str, n: int, args, log_dir: Path) -> dict:
    """One measured run: the echo or ina-switch alone in the switch namespace, n workers; returns its figures."""
    from topologies.netns import Process

    budget = args.warmup + args.seconds + 10
    middle = switch = None
    generation = 0
    workers: list[subprocess.Popen] = []
    try:
        if mode == "echo":
            ifaces = [net.switch_ifaces[p] for p in net.ports]
            middle = net.network.track(Process([sys.executable, __file__, "--role-echo", str(budget), *ifaces],
                                               log_dir / f"echo-{n}.log", namespace=net.switch_ns))
            middle.wait_until(lambda: "ready" in middle.log_path.read_text(), 15, "echo ready")
            pid = middle.pid
        else:
            switch = Switch(net, n, args.window, log_dir, baseline_command(args.baseline) if mode == "baseline" else None)
            generation = switch.next_generation()
            aggregated0 = switch.client.read_counter("MyIngress.ina_aggregated", JOB_ID).get(JOB_ID, 0)
            pid = switch.process.process.pid
        for i, p in enumerate(net.ports):
            ns, iface = net.hosts[p]
            argv = [sys.executable, __file__, "--role-worker", iface, str(i), str(n), str(args.window), str(args.warmup),
                    str(args.seconds), mode, str(generation), args.sender]
            workers.append(subprocess.Popen(ns.exec_argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for w in workers:
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {mode} worker did not start (exit code {w.poll()})")
        start_at = time.time() + 0.2
        for w in workers:
            w.stdin.write(f"{start_at}\n")
            w.stdin.close()
            w.stdin = None
        time.sleep(max(0.0, start_at + args.warmup - time.time()))
        middle_before, (busy0, total0) = _cpu_split(pid), _machine_jiffies()
        wsys0 = sum(_cpu_split(w.pid)[1] for w in workers)
        wcpu0 = sum(_cpu_seconds(w.pid) for w in workers)
        time.sleep(max(0.0, start_at + args.warmup + args.seconds - time.time()))
        middle_after, (busy1, total1) = _cpu_split(pid), _machine_jiffies()
        wsys1 = sum(_cpu_split(w.pid)[1] for w in workers)
        wcpu1 = sum(_cpu_seconds(w.pid) for w in workers)
        outs = [json.loads(w.communicate(timeout=budget)[0]) for w in workers]
        aggregated = None
        if switch is not None:
            aggregated = switch.client.read_counter("MyIngress.ina_aggregated", JOB_ID).get(JOB_ID, 0) - aggregated0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        if middle is not None:
            middle.stop()
        if switch is not None:
            switch.close()
    frames = sum(o["measured"] for o in outs) / args.seconds  # per worker, one frame back per frame sent
    return {
        "mode": mode, "workers": n, "frames_per_s": frames,
        "results_per_s": frames / n if mode != "echo" else None,
        "bad_results": sum(o["bad"] for o in outs), "resent": sum(o["resent"] for o in outs),
        "middle_cpu": (sum(middle_after) - sum(middle_before)) / args.seconds,
        "middle_sys_cpu": (middle_after[1] - middle_before[1]) / args.seconds,
        "workers_cpu": (wcpu1 - wcpu0) / args.seconds, "machine_cpu": (busy1 - busy0) / max(1, total1 - total0) * os.cpu_count(),
        "switch_counter_aggregated": aggregated,
        "workers_us_per_frame": (wcpu1 - wcpu0) / max(1.0, frames * args.seconds) * 1e6,
        "workers_sys_us_per_frame": (wsys1 - wsys0) / max(1.0, frames * args.seconds) * 1e6,
        "senders": sorted({o.get("sender", "socket") for o in outs}),
        "worker_batches": sum(o.get("batches", 0) for o in outs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/switch_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="worker counts to run (default 2 4)")
    parser.add_argument("--seconds", type=float, default=2.5, help="measured seconds per run (default 2.5)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring (default 0.5)")
    parser.add_argument("--window", type=int, default=128, help="chunks in flight per worker = slots of the job (default 128)")
    parser.add_argument("--rounds", type=int, default=3, help="echo/switch pairs per worker count, alternated (default 3)")
    parser.add_argument("--sender", choices=SENDERS, default="rings",
                        help="the workers' I/O: their own packet rings, prebuilt frames in batches (default), or one "
                             "send()/recv() per frame")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="also run the ina-switch of this checkout, alternated with this one's (before/after)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    modes = (*MODES, "baseline") if args.baseline else MODES
    if os.geteuid() != 0:
        print("bench/switch_bench.py: needs root (network namespaces, raw sockets)", file=sys.stderr)
        return 1
    if not 1 <= args.window <= wire.NUM_SLOTS or any(not 1 <= n <= 32 for n in args.workers):
        parser.error("need 1-32 workers and a window of 1-1024 slots")
    from topologies.netns import Network, sweep_stale
    from topologies.switch_process import SwitchNetwork

    def on_alarm(*_):
        raise TimeoutError("benchmark budget exceeded")

    signal.signal(signal.SIGALRM, on_alarm)
    expected = len(args.workers) * args.rounds * len(modes) * (args.warmup + args.seconds + 3) + 10
    signal.alarm(int(expected * 2))  # a hung run must not outlive its budget: everything is cleaned up below
    sweep_stale()
    print(f"ina-switch vs a bare Python AF_PACKET echo over veth: {wire.INA_FRAME_LEN}-byte INA frames, window "
          f"{args.window} chunks per worker, {args.seconds:g} s per run, {args.rounds} rounds; {os.cpu_count()} CPUs",
          flush=True)
    runs = []
    summary = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="switch-bench-") as tmp:
        for n in args.workers:
            with Network("bench") as network:
                net = SwitchNetwork(network, range(1, n + 1), separate_hosts=True)
                for r in range(args.rounds):
                    for mode in modes:
                        res = run_once(net, mode, n, args, Path(tmp))
                        res["round"] = r
                        runs.append(res)
                        print(f"  N={n} round {r + 1} {mode:6s}: {res['frames_per_s']:9,.0f} frames/s  (process CPU "
                              f"{res['middle_cpu']:.0%} of it kernel {res['middle_sys_cpu']:.0%}, workers {res['workers_cpu']:.0%}, machine {res['machine_cpu']:.0%} of {os.cpu_count()} CPUs, "
                              f"{res['frames_per_s'] * args.seconds / max(1, res['worker_batches']):.0f} per worker batch, "
                              f"workers {res['workers_us_per_frame']:.1f} us CPU per frame, kernel {res['workers_sys_us_per_frame']:.1f} ({'/'.join(res['senders'])}), "
                              f"resent {res['resent']}, bad {res['bad_results']})", flush=True)
            row = {"workers": n}
            for mode in modes:
                rates = [x["frames_per_s"] for x in runs if x["workers"] == n and x["mode"] == mode]
                per_cpu = [x["frames_per_s"] / x["middle_cpu"] for x in runs
                           if x["workers"] == n and x["mode"] == mode and x["middle_cpu"] > 0]
                row[mode] = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                             "per_cpu_second": statistics.median(per_cpu) if per_cpu else 0.0,
                             "cpu": statistics.median(x["middle_cpu"] for x in runs if x["workers"] == n and x["mode"] == mode),
                             "workers_cpu": statistics.median(x["workers_cpu"] for x in runs if x["workers"] == n and x["mode"] == mode),
                             "workers_us_per_frame": statistics.median(x["workers_us_per_frame"] for x in runs
                                                                       if x["workers"] == n and x["mode"] == mode)}
            echo = row["echo"]
            for mode in modes[1:]:
                row[mode]["ratio"] = row[mode]["median"] / echo["median"] if echo["median"] else 0.0
                row[mode]["cpu_ratio"] = row[mode]["per_cpu_second"] / echo["per_cpu_second"] if echo["per_cpu_second"] else 0.0
            summary.append(row)
    signal.alarm(0)
    load_after = os.getloadavg()
    print()
    print(f"{'workers':>7}  {'path':<22}  {'frames/s median (min-max)':>27}  {'ratio':>5}  {'CPU':>5}  "
          f"{'frames/CPU-s':>12}  {'ratio':>5}  {'workers CPU':>11}  {'us/frame':>8}")
    for x in summary:
        for mode in modes:
            m = x[mode]
            ratio = f"{m['ratio']:5.2f}" if mode != "echo" else "    1"
            cpu_ratio = f"{m['cpu_ratio']:5.2f}" if mode != "echo" else "    1"
            spread = f"{m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f})"
            print(f"{x['workers']:>7}  {MODE_LABELS[mode]:<22}  {spread:>27}  {ratio}  {m['cpu']:5.0%}  "
                  f"{m['per_cpu_second']:>12,.0f}  {cpu_ratio}  {m['workers_cpu']:>11.0%}  {m['workers_us_per_frame']:>8.1f}")
    print(f"(medians over {args.rounds} rounds, alternated; switch rows count aggregated gradient packets per second, the\n"
          f" echo row frames echoed per second; ratio = rate / echo rate; CPU = the middle process's CPU share; frames/CPU-s\n"
          f" = rate per CPU-second of the middle process; workers CPU = all workers' CPU share, us/frame = their CPU per\n"
          f" frame returned; workers' I/O: {args.sender}. Load average before {load_before[0]:.2f}, after "
          f"{load_after[0]:.2f}, on {os.cpu_count()} CPUs)")
    bad = sum(x["bad_results"] for x in runs)
    if bad:
        print(f"ERROR: {bad} frames came back wrong (not the exact sum, or not the echoed frame)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary, "args": {k: (str(v) if isinstance(v, Path) else v)
                                         for k, v in vars(args).items()}}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in ("--role-worker", "--role-echo"):
    if sys.argv[1] == "--role-worker":
        a = sys.argv[2:]
        out = run_worker(a[0], int(a[1]), int(a[2]), int(a[3]), float(a[4]), float(a[5]), a[6] == "echo", int(a[7]), a[8])
    else:
        out = run_echo(sys.argv[3:], float(sys.argv[2]))
    print(json.dumps(out), flush=True)
    sys.exit(0)

if __name__ == "__main__":
    sys.exit(main())
