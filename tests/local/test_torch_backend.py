"""The torch.distributed backend "ina" (host_agent/torch_backend.py) against gloo, rank by rank, in threads.

Every rank is a thread holding two process groups over one in-process store: the backend's (its agent on
127.0.0.1, the ranks' ring among themselves: no controller) and gloo's. Each collective runs on both and the
results are compared: bit for bit for integers and bytes, within block floating point's bound for floats.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from host_agent.block_scale import BLOCK_ELEMENTS
from host_agent.errors import AgentError
from host_agent.torch_backend import BACKEND, InaProcessGroup, JoinError

TIMEOUT = 30.0


def _ranks(n: int, fn: Callable, *, timeout: float = TIMEOUT, gloo: bool = True, join: float = 120.0) -> list:
    """``fn(rank, ina_group, gloo_group)`` on n threads; their results in rank order (the first error raised)."""
    store = dist.HashStore()
    out: list = [None] * n

    def one(r: int) -> None:
        ina = None
        try:
            ina = InaProcessGroup.join(dist.PrefixStore("ina", store), r, n, timeout, ip="127.0.0.1")
            g = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), r, n, timedelta(seconds=timeout)) if gloo else None
            out[r] = fn(r, ina, g)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            out[r] = exc
        finally:
            if ina is not None:
                ina.shutdown()

    threads = [threading.Thread(target=one, args=(r,), name=f"rank-{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join)
        assert not t.is_alive(), f"{t.name} did not finish"
    for res in out:
        if isinstance(res, BaseException):
            raise res
    return out


def _seeded(r: int, shape, dtype, scale: float = 1.0):
    g = torch.Generator().manual_seed(1000 + r)
    if dtype.is_floating_point:
        # magnitudes over several decades, so that blocks differ in exponent
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 4, shape, generator=g)
                * scale).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)


def _bfp_bound(inputs: list, n: int) -> np.ndarray:
    """Block floating point's bound on |result - exact sum| per element: n half steps of the block's scale
    2**-(30 - L - E) (max|x| over every rank's block < 2**E), and the final rounding to float32."""
    X = np.stack([x.to(torch.float64).reshape(-1).numpy() for x in inputs])
    size = X.shape[1]
    blocks = -(-size // BLOCK_ELEMENTS)
    padded = np.zeros(blocks * BLOCK_ELEMENTS)
    padded[:size] = np.abs(X).max(axis=0)
    _, E = np.frexp(padded.reshape(blocks, BLOCK_ELEMENTS).max(axis=1))
    L = math.ceil(math.log2(n)) if n > 1 else 0
    quant = np.repeat(n * np.ldexp(1.0, E - 31 + L), BLOCK_ELEMENTS)[:size]
    return quant + np.spacing(np.abs(X.sum(axis=0)).astype(np.float32)).astype(np.float64)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_reduce_against_gloo(n: int) -> None:
    """SUM and AVG of float32, float16 and bfloat16 within block floating point's bound; integer sums, MIN, MAX and
    float64 bit for bit or to float64's rounding; every rank the same bits."""
    size = 3 * BLOCK_ELEMENTS + 17

    def run(r, ina, gloo):
        res = {}
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int8,
                      torch.uint8, torch.int64):
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
                x = _seeded(r, (size,), dtype, 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1.0)
                a, b = x.clone(), x.clone()
                ina.allreduce([a], dist.AllreduceOptions() if op == dist.ReduceOp.SUM else _opts(op)).wait()
                gloo.allreduce([b], _opts(op)).wait()
                res[(dtype, op)] = (a, b)
        x = _seeded(r, (size,), torch.float32)
        a = x.clone()
        ina.allreduce([a], _opts(dist.ReduceOp.AVG)).wait()
        res["avg"] = a
        return res

    results = _ranks(n, run)
    for key in [k for k in results[0] if k != "avg"]:
        (a0, b0), (dtype, op) = results[0][key], key
        for res in results[1:]:
            assert torch.equal(res[key][0], a0), f"{key}: every rank gets the same bits"
        inputs = [_seeded(r, a0.shape, dtype, 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1.0) for r in range(n)]
        if op != dist.ReduceOp.SUM or not dtype.is_floating_point:
            assert torch.equal(a0, b0), f"{key}: bit for bit as gloo"
        elif dtype == torch.float64:  # both rounded n - 1 times, in different orders
            magnitude = np.abs(np.stack([x.numpy() for x in inputs])).sum(axis=0)
            assert (np.abs(a0.numpy() - b0.numpy()) <= 2 * n * np.finfo(np.float64).eps * magnitude).all()
        else:
            exact = np.stack([x.to(torch.float64).numpy() for x in inputs]).sum(axis=0)
            ours = np.abs(a0.to(torch.float64).numpy() - exact)
            ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64) if dtype == torch.float32 else \
                np.abs(exact) * 2.0 ** (-11 if dtype == torch.float16 else -8)
            bound = _bfp_bound(inputs, n) + ulp
            assert (ours <= bound).all(), f"{dtype}: beyond block floating point's bound"
            theirs = np.abs(b0.to(torch.float64).numpy() - exact)
            assert (np.abs(a0.to(torch.float64).numpy() - b0.to(torch.float64).numpy()) <= bound + theirs).all()
    ours_sum = results[0][(torch.float32, dist.ReduceOp.SUM)][0]  # checked against gloo's above
    assert torch.equal(results[0]["avg"], ours_sum / n), "AVG is the SUM divided by n, in float32"


def _opts(op):
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


@pytest.mark.parametrize("n", [2, 4])
def test_bytes_collectives_against_gloo(n: int) -> None:
    """broadcast (small and above the scatter/all-gather size, any root), all_gather, all_gather_into_tensor,
    gather, scatter: bit for bit as gloo, any dtype; reduce_scatter_tensor: each rank's part of the all-reduce."""

    def run(r, ina, gloo):
        res = {}
        for root, numel in ((0, 7), (n - 1, 40_000)):
            for g, name in ((ina, "ina"), (gloo, "gloo")):
                t = _seeded(r, (numel,), torch.float32)
                o = dist.BroadcastOptions()
                o.rootRank = root
                g.broadcast([t], o).wait()
                res[("bcast", root, name)] = t
        for dtype in (torch.float16, torch.int64, torch.bfloat16):
            x = _seeded(r, (5, 3), dtype)
            for g, name in ((ina, "ina"), (gloo, "gloo")):
                outs = [torch.zeros(5, 3, dtype=dtype) for _ in range(n)]
                g.allgather([outs], [x]).wait()
                res[("ag", dtype, name)] = outs
        x = _seeded(r, (6,), torch.float32)
        single = torch.zeros(6 * n)
        ina.all_gather_single(single, x).wait()
        res["ags"] = single
        o = dist.GatherOptions()
        o.rootRank = 1
        gathered = [torch.zeros(6) for _ in range(n)] if r == 1 else []
        ina.gather([gathered] if r == 1 else [], [x], o).wait()
        res["gather"] = gathered
        s = dist.ScatterOptions()
        s.rootRank = 0
        part = torch.zeros(4, dtype=torch.int32)
        ina.scatter([part], [[torch.full((4,), 10 + p, dtype=torch.int32) for p in range(n)]] if r == 0 else [], s).wait()
        res["scatter"] = part
        whole = torch.arange(8 * n, dtype=torch.int32) * (r + 1)
        mine = torch.zeros(8, dtype=torch.int32)
        ina.reduce_scatter_single(mine, whole).wait()
        res["rs"] = mine
        ina.barrier().wait()
        return res

    results = _ranks(n, run)
    for r, res in enumerate(results):
        for root, numel in ((0, 7), (n - 1, 40_000)):
            assert torch.equal(res[("bcast", root, "ina")], res[("bcast", root, "gloo")])
            assert torch.equal(res[("bcast", root, "ina")], _seeded(root, (numel,), torch.float32))
        for dtype in (torch.float16, torch.int64, torch.bfloat16):
            ours, theirs = res[("ag", dtype, "ina")], res[("ag", dtype, "gloo")] if dtype != torch.bfloat16 else None
            for p in range(n):
                assert torch.equal(ours[p], _seeded(p, (5, 3), dtype))
                if theirs is not None:
                    assert torch.equal(ours[p], theirs[p])
        assert torch.equal(res["ags"], torch.cat([_seeded(p, (6,), torch.float32) for p in range(n)]))
        if r == 1:
            assert all(torch.equal(res["gather"][p], _seeded(p, (6,), torch.float32)) for p in range(n))
        assert res["scatter"].tolist() == [10 + r] * 4
        total = sum(torch.arange(8 * n, dtype=torch.int32) * (p + 1) for p in range(n))
        assert torch.equal(res["rs"], total[8 * r:8 * (r + 1)])


def test_tensors_of_fewer_elements_than_ranks() -> None:
    """Scalars and empty tensors over the mesh (some ranks' pieces are empty): int64 and float64 sums, a MAX, an
    empty broadcast and all-gather complete with the right values, and the group shuts down."""
    n = 4

    def run(r, ina, _):
        count = torch.tensor(r + 1, dtype=torch.int64)
        ina.allreduce([count]).wait()
        small = torch.tensor([r, 2.0 * r, -r], dtype=torch.float64)
        ina.allreduce([small]).wait()
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.MAX
        peak = torch.tensor([float(r), -float(r)])
        ina.allreduce([peak], o).wait()
        empty = torch.zeros(0)
        ina.broadcast([empty], dist.BroadcastOptions()).wait()
        outs = [torch.zeros(0) for _ in range(n)]
        ina.allgather([outs], [torch.zeros(0)]).wait()
        return count.item(), small.tolist(), peak.tolist(), [o.numel() for o in outs]

    for res in _ranks(n, run, timeout=10.0, gloo=False, join=60.0):
        assert res == (10, [6.0, 12.0, -6.0], [3.0, 0.0], [0] * n)


def test_the_group_created_again_over_the_same_store_is_a_new_job() -> None:
    """torch reuses a group's store prefix after destroy_process_group: a second group over the same store joins
    afresh (no rank reads the first group's addresses) and sums right."""
    store = dist.HashStore()
    out: list = [None, None]

    def one(r: int) -> None:
        try:
            sums = []
            for k in (1, 2):
                g = InaProcessGroup.join(dist.PrefixStore("ina", store), r, 2, 10.0, ip="127.0.0.1")
                try:
                    t = torch.full((5,), float(k * (r + 1)))
                    g.allreduce([t]).wait()
                    sums.append(t.tolist())
                finally:
                    g.shutdown()
            out[r] = sums
        except BaseException as exc:  # noqa: BLE001 (reported below)
            out[r] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    for res in out:
        if isinstance(res, BaseException):
            raise res
        assert res == [[3.0] * 5, [6.0] * 5]


def test_collectives_are_asynchronous_and_complete_in_call_order() -> None:
    """Queued behind a held communication thread, three collectives stay pending; released, they complete in the
    order they were called, each seeing the one before (the all-gather gathers the all-reduce's sums)."""
    n = 2
    gates = [threading.Event() for _ in range(n)]

    def run(r, ina, _):
        ina.agent.submit(gates[r].wait, 30)  # holds the communication thread
        a = torch.tensor([float(r + 1)] * 4)
        done: list[str] = []
        lock = threading.Lock()
        works = {}
        o = dist.BroadcastOptions()
        o.rootRank = 1
        b = torch.tensor([float(r)])
        outs = [torch.zeros(4) for _ in range(n)]
        works["all_reduce"] = ina.allreduce([a])
        works["broadcast"] = ina.broadcast([b], o)
        works["all_gather"] = ina.allgather([outs], [a])
        for name, w in works.items():
            w.get_future().then(lambda _f, name=name: (lock.acquire(), done.append(name), lock.release()))
        pending = not any(w.is_completed() for w in works.values())
        gates[r].set()
        for w in works.values():
            assert w.wait()
        deadline = time.monotonic() + 10
        while len(done) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        return pending, done, a.tolist(), b.tolist(), [o.tolist() for o in outs]

    for pending, done, a, b, outs in _ranks(n, run, gloo=False):
        assert pending, "a collective's Work returns before the communication thread ran it"
        assert done == ["all_reduce", "broadcast", "all_gather"]
        assert a == [3.0] * 4 and b == [1.0] and outs == [[3.0] * 4] * 2


def test_unsupported_dtypes_and_ops_are_refused_by_name() -> None:
    def run(r, ina, _):
        errors = []
        for dtype, op in ((torch.int64, dist.ReduceOp.AVG), (torch.bool, dist.ReduceOp.SUM),
                          (torch.float32, dist.ReduceOp.BAND)):
            with pytest.raises(ValueError) as info:
                ina.allreduce([torch.zeros(3, dtype=dtype)], _opts(op))
            errors.append(str(info.value))
        with pytest.raises(ValueError, match="complex"):
            ina.allreduce([torch.zeros(3, dtype=torch.complex64)])
        with pytest.raises(NotImplementedError, match="send"):
            ina.send([torch.zeros(1)], 1, 0)
        with pytest.raises(NotImplementedError, match="all_to_all"):
            ina.alltoall_base(torch.zeros(2), torch.zeros(2), [], [], None)
        ina.barrier().wait()  # nothing refused reached the stream: the ranks still agree
        return errors

    for errors in _ranks(2, run, gloo=False):
        assert "AVG" in errors[0] and "torch.int64" in errors[0]
        assert "SUM" in errors[1] and "torch.bool" in errors[1]
        assert "BAND" in errors[2] and "torch.float32" in errors[2]


def test_a_collective_a_rank_never_joins_fails_within_the_timeout() -> None:
    """Rank 1 skips an all-reduce: rank 0's Work fails within the group's timeout (its wait raises, its future
    fails), the collectives queued after it fail at once, and the group shuts down without waiting."""
    timeout = 1.5

    def run(r, ina, _):
        if r == 1:
            time.sleep(3 * timeout)  # the rank that does not come
            return None
        start = time.monotonic()
        first = ina.allreduce([torch.ones(1000)])
        later = ina.broadcast([torch.ones(3)], dist.BroadcastOptions())
        with pytest.raises(AgentError) as info:
            first.wait()
        elapsed = time.monotonic() - start
        with pytest.raises(AgentError):
            later.wait()
        with pytest.raises(RuntimeError):
            first.get_future().wait()
        return elapsed, str(info.value)

    elapsed, message = _ranks(2, run, timeout=timeout, gloo=False)[0]
    assert elapsed < 3 * timeout, elapsed
    assert "all_reduce" in message or "ring" in message, message


def test_a_rank_that_cannot_join_fails_every_rank() -> None:
    """An unreachable controller: every rank raises JoinError naming the failure, within the timeout."""
    store = dist.HashStore()
    errors: list = [None] * 3
    start = time.monotonic()

    def one(r: int) -> None:
        try:
            InaProcessGroup.join(store, r, 3, 2.0, controller="127.0.0.1:1", ip="127.0.0.1")
        except BaseException as exc:  # noqa: BLE001
            errors[r] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - start
    assert all(isinstance(e, JoinError) for e in errors), errors
    assert all("rank 0" in str(e) for e in errors), errors
    assert elapsed < 10, elapsed


def test_the_torch_api_the_backend_relies_on(monkeypatch) -> None:
    """Fails loudly if PyTorch moves what the backend builds on (it is pinned to 2.13.0): a creator registered under
    a name, called by ``init_process_group`` with (store, rank, size, timeout); a Python ``ProcessGroup`` subclass
    returned as is; ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` reaching ``all_gather_single`` and
    ``reduce_scatter_single``; ``torch.distributed.Work`` subclassed in Python, whose ``wait`` torch calls (a failed
    collective raises from a synchronous call) and whose future's error DDP's C++ reducer sees (backward raises);
    DDP's start-up and buckets going through the group; ``destroy_process_group`` calling ``shutdown``."""
    assert torch.__version__.split("+")[0] == "2.13.0", "the backend is written against PyTorch 2.13.0 (the pin)"
    assert BACKEND in dist.Backend.backend_list
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20))
    try:
        pg = dist.group.WORLD
        assert isinstance(pg, InaProcessGroup) and dist.get_backend() == BACKEND
        assert pg.timeout == 20.0 and pg.agent.options.stream.op_timeout == 20.0
        out = torch.zeros(3)
        dist.all_gather_into_tensor(out, torch.tensor([1.0, 2.0, 3.0]))
        part = torch.zeros(2)
        dist.reduce_scatter_tensor(part, torch.tensor([4.0, 5.0]))
        assert out.tolist() == [1.0, 2.0, 3.0] and part.tolist() == [4.0, 5.0]
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.ones(2, 4)).sum().backward()
        assert all(p.grad is not None for p in model.parameters())

        def broken(*_args):
            raise AgentError("the stream is broken")

        monkeypatch.setattr(pg.agent, "allreduce_fixed", broken)
        with pytest.raises(AgentError, match="stream is broken"):
            dist.all_reduce(torch.ones(2, dtype=torch.int32))
        with pytest.raises(RuntimeError, match="stream is broken"):
            ddp(torch.ones(2, 4)).sum().backward()
        agent = pg.agent
    finally:
        dist.destroy_process_group()
    with pytest.raises(RuntimeError, match="closed"):
        agent.submit(lambda: None)


# --------------------------------------------------------------------------- ranks as processes (env:// as torchrun)

RANK_SCRIPT = """
import os, sys, time, traceback
from datetime import timedelta
import torch, torch.distributed as dist
import host_agent.torch_backend  # registers "ina"
rank = int(os.environ["RANK"])
start = time.monotonic()
try:
    dist.init_process_group("ina", timeout=timedelta(seconds=float(os.environ["T"])))
    exec(os.environ["BODY"])
    dist.destroy_process_group()
except Exception as exc:
    print(f"rank {rank} error after {time.monotonic() - start:.1f}s: {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
"""


def _processes(n: int, body: str, *, timeout: float = 20.0, env: dict | None = None,
               rank_env: dict | None = None) -> list[tuple[int, str]]:
    """``n`` ranks, each a process running ``body`` between ``init_process_group("ina")`` and
    ``destroy_process_group`` (env:// rendezvous, as under torchrun); each one's (exit code, output)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from inaproto.credentials import CONTROLLER_ENV

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if k != CONTROLLER_ENV}
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n), "T": str(timeout),
                 "BODY": body, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, **(env or {}))
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**base, "RANK": str(r), **(rank_env or {}).get(r, {})})
             for r in range(n)]
    try:
        return [(p.wait(timeout=timeout + 60), p.stdout.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_new_group_is_a_job_of_its_own_ranks() -> None:
    """``dist.new_group([0, 2], backend="ina")``: the subgroup's ranks sum among themselves (rank 1, outside it,
    is not waited for), the world group goes on beside it; every process exits by itself."""
    body = (
        "sub = dist.new_group([0, 2], backend='ina')\n"
        "t = torch.tensor([float(rank + 1)] * 5)\n"
        "if rank != 1:\n"
        "    dist.all_reduce(t, group=sub)\n"
        "    assert dist.get_world_size(sub) == 2\n"
        "w = torch.tensor([float(rank + 1)])\n"
        "dist.all_reduce(w)\n"
        "print('result', t.tolist()[0], w.item(), flush=True)\n"
    )
    results = _processes(3, body)
    for r, (rc, out) in enumerate(results):
        assert rc == 0, out
        assert f"result {4.0 if r != 1 else 2.0} 6.0" in out, out


def test_a_rank_that_dies_fails_the_others_within_the_timeout() -> None:
    """Rank 1 dies after joining: rank 0's next collective raises (no hang) within the group's timeout, and rank 0
    exits with its own code although it never calls ``destroy_process_group`` (no abort at teardown)."""
    body = (
        "dist.barrier()\n"
        "if rank == 1:\n"
        "    os._exit(9)\n"
        "dist.all_reduce(torch.ones(1 << 16))\n"
    )
    (rc0, out0), (rc1, _) = _processes(2, body, timeout=8.0)
    assert rc1 == 9 and rc0 == 3, out0
    assert "rank 0 error after" in out0, out0
    seconds = float(out0.split("error after ")[1].split("s:")[0])
    assert seconds < 8.0 + 20.0, out0  # the timeout and the start-up; not a hang


def test_a_wrong_secret_fails_every_rank_by_name() -> None:
    """Rank 1 holds another secret than the job's: the controller refuses it, and both ranks raise JoinError."""
    from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV, new_secret
    from topologies.loopback import LoopbackCluster

    with LoopbackCluster(["s1", "s1"], slots=16) as cl:
        results = _processes(2, "", env={CONTROLLER_ENV: cl.address, "MASTER_ADDR": cl.host_ip("h0")},
                             rank_env={0: {JOB_SECRET_ENV: new_secret()}, 1: {JOB_SECRET_ENV: new_secret()}})
    for rc, out in results:
        assert rc == 3 and "JoinError" in out and "rank 1 could not join" in out, out


def test_through_the_switch_int32_sums_are_exact() -> None:
    """With ``$INA_CONTROLLER`` the group is granted INA (the pipeline model behind UDP): int32 sums come back
    exact, wrapping as gloo's, and float32 within block floating point on every rank alike."""
    from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV, new_secret
    from topologies.loopback import LoopbackCluster

    body = (
        "g = torch.Generator().manual_seed(rank)\n"
        "x = torch.randint(-2**31, 2**31 - 1, (3000,), generator=g, dtype=torch.int32)\n"
        "t = x.clone()\n"
        "dist.all_reduce(t)\n"
        "ys = [torch.randint(-2**31, 2**31 - 1, (3000,), generator=torch.Generator().manual_seed(r),\n"
        "                    dtype=torch.int32).to(torch.int64) for r in range(dist.get_world_size())]\n"
        "exact = (sum(ys) + 2**31) % 2**32 - 2**31\n"
        "f = torch.full((1000,), 0.5 * (rank + 1))\n"
        "dist.all_reduce(f)\n"
        "print('granted', dist.group.WORLD.agent.backend.value, 'exact', bool((t.to(torch.int64) == exact).all()),\n"
        "      'float', f[0].item(), flush=True)\n"
    )
    with LoopbackCluster(["s1", "s1", "s1"], slots=16) as cl:
        results = _processes(3, body, env={CONTROLLER_ENV: cl.address, JOB_SECRET_ENV: new_secret(),
                                           "MASTER_ADDR": cl.host_ip("h0")})
    for rc, out in results:
        assert rc == 0, out
        assert "granted ina exact True float 3.0" in out, out
