"""PyTorch integration: the agent against torch.distributed (gloo), the DDP hook, the weighted sampler.

Skipped where torch is not installed (it is the optional extra ``torch``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from host_agent.allocation import static_allocation
from host_agent.comm import CommThread
from host_agent.torch_hook import (
    AgentHookState,
    Numerics,
    WeightedBatchSampler,
    get_hook,
    mean_hook,
    register_hook,
    weighted_hook,
)
from topologies.loopback import LoopbackCluster


class _Submitting:
    """An agent's communication thread (``Agent.submit``), for the fakes."""

    def submit(self, fn, /, *args):
        if not hasattr(self, "comm"):
            self.comm = CommThread("fake-comm")
        return self.comm.submit(fn, *args)


class _FakeAgent(_Submitting):
    rank, size = 1, 4

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        return array * 4


def test_state_checks_its_fields_and_registry() -> None:
    alloc = static_allocation([1.0, 3.0, 2.0, 2.0], 16)
    state = AgentHookState.for_allocation(_FakeAgent(), alloc, numerics=Numerics.FIXED)
    assert state.weight == alloc.batch_sizes[1] / 16
    with pytest.raises(ValueError, match="weight"):
        AgentHookState(_FakeAgent(), weight=0.0, numerics="fixed")
    with pytest.raises(TypeError, match="allreduce"):
        AgentHookState(object())
    with pytest.raises(TypeError, match="allgather"):  # block floating point needs the exact collectives
        AgentHookState(_FakeAgent())
    assert get_hook("weighted") is weighted_hook and get_hook("mean") is mean_hook
    with pytest.raises(KeyError, match="registered"):
        get_hook("nope")
    with pytest.raises(ValueError):
        register_hook("mean", mean_hook)


def test_hook_scales_and_returns_the_bucket() -> None:
    class Bucket:
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    for asynchronous in (False, True):
        state = AgentHookState(_FakeAgent(), weight=0.25, numerics=Numerics.FIXED, asynchronous=asynchronous)
        t = torch.arange(6, dtype=torch.float32)
        out = weighted_hook(state, Bucket(t)).wait()
        assert out is t and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # 0.25 * 4 = 1
        assert mean_hook(state, Bucket(torch.ones(2))).wait().tolist() == [1.0, 1.0]
        step = state.take_step()
        assert step.buckets == 2
        if not asynchronous:  # the all-reduce ran inside the hook: nothing hidden, all of it exposed
            assert step.hidden == 0 and step.overlap == 0 and step.exposed >= step.comm
        state.close()


class _Bucket:
    def __init__(self, t):
        self.t = t

    def buffer(self):
        return self.t


class _GatedGroup(_Submitting):
    """n identical workers (sum = n x own values) through block floating point; each all-reduce waits for a gate."""

    rank, size = 0, 4

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls = 0

    def allgather(self, a: np.ndarray) -> np.ndarray:
        self.started.set()
        assert self.gate.wait(30), "gate never opened"
        return np.stack([a] * self.size)

    def allreduce_fixed(self, q: np.ndarray) -> np.ndarray:
        self.calls += 1
        return q.astype(np.int64) * self.size

    def allreduce(self, a: np.ndarray) -> np.ndarray:  # pragma: no cover - block numerics never call it
        raise AssertionError("block floating point goes through allgather + allreduce_fixed")


def test_async_hook_returns_a_pending_future_completed_with_the_mean() -> None:
    group = _GatedGroup()
    state = AgentHookState(group, block_elements=1)  # asynchronous, block floating point, a scale per value
    grads = [torch.tensor([1e-8, -3e-9, 0.5]), torch.tensor([1000.0, 2.0**-20, 0.0])]
    want = [g.clone() for g in grads]
    futs = [mean_hook(state, _Bucket(g)) for g in grads]  # both queued while the first all-reduce is held
    assert group.started.wait(30)
    assert not any(f.done() for f in futs)
    group.gate.set()
    for f, g, w in zip(futs, grads, want):
        assert f.wait() is g and torch.equal(g, w)  # mean of 4 identical workers = own gradient, bit for bit
    step = state.take_step()
    assert step.buckets == 2 and step.comm > 0
    state.close()


def test_async_hook_hands_errors_to_the_future() -> None:
    class Broken(_FakeAgent):
        def allreduce(self, array):
            raise RuntimeError("stream broken")

    state = AgentHookState(Broken(), numerics=Numerics.FIXED)
    with pytest.raises(RuntimeError, match="stream broken"):
        weighted_hook(state, _Bucket(torch.ones(3))).wait()
    state.close()


def test_ddp_backward_goes_on_while_buckets_are_reduced(tmp_path) -> None:
    """The first bucket's all-reduce is held until backward has called the hook of the last bucket.

    A synchronous hook could never get there (backward would wait inside the first hook): the test
    asserts the overlap by what happened, not by timing. The gradients come out as without DDP.
    """
    import threading

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(32, 32) for _ in range(4)]
        model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())])
        ref = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())])
        ddp = DDP(model, bucket_cap_mb=32 * 33 * 4 / 2**20)  # about one bucket per layer

        class OneWorker(_Submitting):
            rank, size = 0, 1

            def __init__(self) -> None:
                self.hold = False
                self.started = threading.Event()  # the communication thread has begun bucket 0
                self.saw_later_hook = threading.Event()

            def allgather(self, a):
                if self.hold:  # hold bucket 0 until another bucket's hook has been called
                    self.hold = False
                    calls = state.clock.hooks_called
                    self.started.set()
                    for _ in range(3000):
                        if state.clock.hooks_called > calls:
                            self.saw_later_hook.set()
                            break
                        self.saw_later_hook.wait(0.01)
                return a[None]

            def allreduce_fixed(self, q):
                return q.astype(np.int64)

            def allreduce(self, a):  # pragma: no cover
                raise AssertionError

        def hook(st, bucket):  # bucket 0's hook returns only once its all-reduce is under way
            fut = mean_hook(st, bucket)
            if agent.hold and bucket.index() == 0:
                assert agent.started.wait(30)
            return fut

        agent = OneWorker()
        state = AgentHookState(agent)
        ddp.register_comm_hook(state, hook)
        ddp(torch.randn(8, 32)).sum().backward()  # DDP rebuilds its buckets after the first iteration
        assert state.take_step().buckets == 1
        model.zero_grad()
        agent.hold = True
        x = torch.randn(8, 32)
        ddp(x).square().sum().backward()
        step = state.take_step()
        assert agent.saw_later_hook.is_set()
        assert step.buckets >= 2 and step.hidden > 0 and 0 < step.overlap <= 1
        expected = torch.autograd.grad(ref(x).square().sum(), list(ref.parameters()))
        peak = max(float(g.abs().max()) for g in expected)
        for p, g in zip(model.parameters(), expected):
            # block floating point, one worker: |error| <= half a step of 2**(E - 30), max|block| < 2**E
            np.testing.assert_allclose(p.grad.numpy(), g.numpy(), rtol=0, atol=peak * 2**-30)
        state.close()
    finally:
        dist.destroy_process_group()


def test_weighted_batch_sampler_splits_each_global_batch() -> None:
    alloc = static_allocation([1.0, 2.0, 1.0], 12)
    samplers = [WeightedBatchSampler(50, alloc, r, seed=3) for r in range(3)]
    steps = [list(s) for s in samplers]
    assert all(len(s) == len(samplers[0]) == 4 for s in steps)
    for step in range(4):
        batch = [i for r in range(3) for i in steps[r][step]]
        assert [len(steps[r][step]) for r in range(3)] == list(alloc.batch_sizes)
        assert len(set(batch)) == 12
    samplers[0].set_epoch(1)
    assert list(samplers[0]) != steps[0]
    with pytest.raises(ValueError, match="global batch"):
        samplers[0].set_allocation(static_allocation([1.0, 1.0, 1.0], 9))


# --------------------------------------------------------------------------- against gloo, in processes


def _child(rank: int, n: int, store_path: str, workers: str, controller: str | None, secret: str, job: str, task: str,
           out) -> None:
    try:
        import torch.distributed as dist

        from host_agent.agent import Agent
        from host_agent.grant import JobSpec, parse_workers

        torch.manual_seed(0)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank, world_size=n)
        spec = JobSpec(job, parse_workers(workers), backend="auto" if controller else "ring", secret=secret)
        agent = Agent(spec, rank, controller=controller)
        try:
            if task == "allreduce":
                rng = np.random.default_rng(rank)
                # multiples of 1/256 below 2**12: exact in fixed point (scale 2**16) and in float32 sums
                x = (rng.integers(-2**20, 2**20, size=5000) / 256.0).astype(np.float32)
                t = torch.from_numpy(x.copy())
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
                out.put((rank, agent.backend, agent.allreduce(x).tobytes(), t.numpy().tobytes()))
            else:
                out.put((rank, agent.backend, *_train_both(agent, rank, n)))
        finally:
            agent.close()
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        out.put((rank, "error", traceback.format_exc(), None))


def _train_both(agent, rank: int, n: int):
    """Train the same model twice, with DDP's gloo all-reduce and with the agent's hook; final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    gen = torch.Generator().manual_seed(1)
    X = torch.randn(240, 10, generator=gen)
    y = (X[:, :3].sum(dim=1) > 0).long()
    alloc = static_allocation([1.0] * n, 48)
    sampler = WeightedBatchSampler(len(X), alloc, rank, seed=5)
    finals = []
    for use_hook in (False, True):
        torch.manual_seed(2)
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        ddp = DDP(model)
        if use_hook:
            ddp.register_comm_hook(AgentHookState.for_allocation(agent, alloc), get_hook("weighted"))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for idx in sampler:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(X[idx]), y[idx]).backward()
                opt.step()
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes())
    return finals[0], finals[1]


def _spawn(n: int, tmp_path, workers: str, controller: str | None, job: str, task: str, secret: str = "") -> list:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = str(tmp_path / f"store-{task}")
    procs = [ctx.Process(target=_child, args=(r, n, store, workers, controller, secret, job, task, out)) for r in range(n)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=120) for _ in range(n))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    for r in results:
        assert r[1] != "error", r[2]
    return results


def _worker_list(cl: LoopbackCluster) -> str:
    """The cluster's workers as ``IP:PORT@HOST,...``: their sockets closed, for the children to bind."""
    addresses = []
    for w, (udp, tcp) in zip(cl.spec.workers, cl.sockets):
        addresses.append(f"{w.ip}:{w.udp_port}@{w.host}")
        udp.close()
        tcp.close()
    return ",".join(addresses)


@pytest.mark.skipif(os.cpu_count() is None, reason="needs processes")
def test_ring_allreduce_equals_gloo_allreduce(tmp_path) -> None:
    n = 3
    with LoopbackCluster(["s1"] * n) as cl:  # only for its free ports: the ring runs without a controller
        workers = _worker_list(cl)
        results = _spawn(n, tmp_path, workers, None, "vs-gloo", "allreduce")
    for _, backend, ours, gloo in results:
        assert backend == "ring"
        assert ours == gloo


def test_training_through_the_ina_hook_matches_gloo(tmp_path) -> None:
    n = 2
    with LoopbackCluster(["s1"] * n, slots=16) as cl:
        workers = _worker_list(cl)
        results = _spawn(n, tmp_path, workers, cl.address, "ddp", "train", cl.spec.secret)
    for _, backend, gloo, hooked in results:
        assert backend == "ina"
        a, b = np.frombuffer(gloo, dtype=np.float32), np.frombuffer(hooked, dtype=np.float32)
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-4)  # fixed point: |error| <= n / 2 / 2**16 per step
    assert results[0][3] == results[1][3], "every worker holds the same model"
