"""PyTorch integration (optional extra ``torch``): a DDP communication hook through the agent, and a weighted sampler.

The backend ``"ina"`` (``host_agent.torch_backend``) is the way to train through the testbed: DDP calls it as it
calls gloo, with no hook. This hook is the lower-level API: a script that builds its own ``Agent`` hands DDP's
buckets to it. The weighted sampler (and its ``loss_weight``) and the communication clock serve both.

torch is imported only when a hook runs, so ``host_agent`` works without it. Like torch's own
``ddp_comm_hooks``: free functions with the signature ``hook(state, bucket) -> Future[Tensor]``, a state
object that checks its fields when it is built, and a registry from names to hooks.

    from host_agent.torch_hook import AgentHookState, get_hook, WeightedBatchSampler
    state = AgentHookState.for_allocation(agent, allocation)          # weight b_i / B
    ddp_model.register_comm_hook(state, get_hook("weighted"))
    loader = DataLoader(dataset, batch_sampler=WeightedBatchSampler(len(dataset), allocation, agent.rank))

The hook all-reduces each gradient bucket through whatever backend the agent's job runs (INA, ring or
Rina), so DDP never calls the process group for gradients; DDP still needs an initialised process
group for its start-up broadcast of the parameters. As torch's ``allreduce_hook`` returns the future of an
asynchronous ``all_reduce``, the hook here returns the future of an ``AgentWork`` (``host_agent.torch_work``, the
backend's Work too) that the agent's communication thread (``Agent.submit``, ``host_agent.comm``) completes:
bucket k is all-reduced while backward computes the gradients of bucket k + 1. Values go through block floating
point by default (``host_agent.block_scale``): a power-of-two scale per block of 256, agreed by all workers.
``timed_allreduce_hook`` is DDP's own all-reduce through any process group, timed (``CommClock``).
"""
from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import numpy as np

from host_agent.allocation import Allocation, epoch_permutation
from host_agent.block_scale import BLOCK_ELEMENTS, BlockScaledReducer

__all__ = [
    "HOOKS",
    "AgentHookState",
    "CommClock",
    "CommStep",
    "Numerics",
    "WeightedBatchSampler",
    "get_hook",
    "mean_hook",
    "register_hook",
    "timed_allreduce_hook",
    "weighted_hook",
]


class _Reducer(Protocol):
    rank: int
    size: int

    def allreduce(self, array: np.ndarray) -> np.ndarray: ...

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...


class Numerics(str, Enum):
    """How a bucket's float32 values become the int32 the switch adds (docs/agent.md, "Fixed point")."""

    BLOCK = "block"  # a power-of-two scale per block of 256 values, agreed by all workers first (block_scale.py)
    FIXED = "fixed"  # the job's one scale (agent.allreduce; 2**16 by default)


@dataclass(frozen=True)
class CommStep:
    """Communication of one backward pass, as the hooks saw it (seconds).

    ``comm``: time the all-reduces of the buckets took; ``hidden``: the part of it that ran while
    backward was computing gradients, i.e. between the return of one bucket's hook and the call of the
    next one's; ``exposed``: how long communication held backward up: the time spent inside the hooks
    plus how long after the last hook returned the last all-reduce ended. A synchronous hook hides
    nothing (its all-reduce runs inside the hook) and exposes all of it.
    """

    buckets: int
    comm: float
    hidden: float
    exposed: float

    @property
    def overlap(self) -> float:
        """Fraction of the communication time hidden behind the backward pass (0 when there was none)."""
        return self.hidden / self.comm if self.comm > 0 else 0.0


class CommClock:
    """When a backward pass's hooks were called and returned and when their all-reduces ran: its ``CommStep``.

    A hook calls ``called()`` on entry and ``returned(i)`` before it returns; each all-reduce reports ``span(start,
    end)`` once it ended (any thread). ``take_step()`` after ``backward()`` gives the pass's ``CommStep``.
    ``group``: the process group ``timed_allreduce_hook`` all-reduces through (None: the default group).
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self._lock = threading.Lock()
        self._calls: list[tuple[float, float]] = []  # (called, returned) of each hook in the current backward pass
        self._spans: list[tuple[float, float]] = []  # (start, end) of its all-reduces
        self.comm_seconds = 0.0  # time spent all-reducing buckets, in total

    @property
    def hooks_called(self) -> int:
        """Hooks called since the last ``take_step``."""
        with self._lock:
            return len(self._calls)

    def called(self) -> int:
        now = time.perf_counter()
        with self._lock:
            self._calls.append((now, now))
            return len(self._calls) - 1

    def returned(self, index: int) -> None:
        with self._lock:
            self._calls[index] = (self._calls[index][0], time.perf_counter())

    def span(self, start: float, end: float) -> None:
        with self._lock:
            self._spans.append((start, end))
            self.comm_seconds += end - start

    def take_step(self) -> CommStep:
        """The communication of the backward pass(es) since the last call (call it after ``backward()``)."""
        with self._lock:
            calls, spans = self._calls, self._spans
            self._calls, self._spans = [], []
        if not calls:
            return CommStep(0, 0.0, 0.0, 0.0)
        calls.sort()
        computing = [(ret, nxt) for (_, ret), (nxt, _) in itertools.pairwise(calls)]  # backward between two hooks
        comm = sum(e - s for s, e in spans)
        hidden = sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans for a, b in computing)
        last_return = calls[-1][1]
        exposed = sum(r - c for c, r in calls) + max([0.0] + [e - last_return for _, e in spans])
        return CommStep(len(calls), comm, hidden, exposed)


def timed_allreduce_hook(clock: CommClock, bucket):  # no annotations on bucket/return: DDP checks them
    """DDP's own all-reduce (the bucket divided by the world size, then a SUM through ``clock.group``,
    asynchronously), timed by ``clock``: the same communication on any backend, with its ``CommStep``.

    Example:
        ddp.register_comm_hook(CommClock(), timed_allreduce_hook)       # gloo or "ina" alike
    """
    import torch.distributed as dist

    index = clock.called()
    start = time.perf_counter()
    tensor = bucket.buffer().div_(dist.get_world_size(clock.group))
    fut = dist.all_reduce(tensor, group=clock.group, async_op=True).get_future()

    def done(f):
        clock.span(start, time.perf_counter())
        return f.value()[0]

    clock.returned(index)
    return fut.then(done)


@dataclass
class AgentHookState:
    """State of the agent hooks: the agent, the worker's weight and the numerics.

    Args:
        agent: the worker's ``Agent`` (anything with ``rank``, ``size``, ``allreduce(ndarray)`` and, for
            asynchronous hooks, ``submit(fn, *args)``; with ``Numerics.BLOCK`` also ``allgather`` and
            ``allreduce_fixed``).
        weight: this worker's b_i / B, the factor its bucket is scaled by before the sum (``weighted``);
            change it with ``set_allocation`` when the allocation changes.
        numerics: ``Numerics.BLOCK`` (default) or ``Numerics.FIXED``.
        asynchronous: True (default): a hook queues its bucket on the agent's communication thread
            (``Agent.submit``) and returns a pending future that the thread completes, so backward goes on
            computing the next buckets; False: the all-reduce runs inside the hook (for comparison).
        block_elements: values per agreed scale with ``Numerics.BLOCK``.

    While a backward pass runs, the agent belongs to the communication thread: make other calls on it
    (losses, speeds) only after ``backward()`` has returned (DDP waits for every bucket's future).

    Raises:
        TypeError: ``agent`` cannot all-reduce.
        ValueError: ``weight`` is not in (0, 1].
    """

    agent: Any
    weight: float = 1.0
    numerics: Numerics = Numerics.BLOCK
    asynchronous: bool = True
    block_elements: int = BLOCK_ELEMENTS

    def __post_init__(self) -> None:
        if not callable(getattr(self.agent, "allreduce", None)):
            raise TypeError(f"agent must have an allreduce(ndarray) method, got {type(self.agent).__name__}")
        for attr in ("rank", "size"):
            if not isinstance(getattr(self.agent, attr, None), int):
                raise TypeError(f"agent must have an int {attr!r}")
        self._check(self.weight)
        self.numerics = Numerics(self.numerics)
        self._reducer = (BlockScaledReducer(self.agent, self.block_elements) if self.numerics is Numerics.BLOCK
                         else self.agent)
        from host_agent.torch_work import WorkQueue  # torch only where a hook is used

        self._queue = WorkQueue(self.agent, name="ddp-hook")
        self.clock = CommClock()

    @staticmethod
    def _check(weight: float) -> None:
        if not (math.isfinite(weight) and 0.0 < weight <= 1.0):
            raise ValueError(f"weight (b_i / B) must be in (0, 1], got {weight!r}")

    @classmethod
    def for_allocation(cls, agent: _Reducer, allocation: Allocation, **options: Any) -> AgentHookState:
        """State whose weight is the agent's b_i / B in ``allocation`` (ranks in worker-id order)."""
        return cls(agent, allocation.gradient_scale(agent.rank), **options)

    def set_allocation(self, allocation: Allocation) -> None:
        weight = allocation.gradient_scale(self.agent.rank)
        self._check(weight)
        self.weight = weight

    def submit(self, tensor: Any, weight: float):
        """All-reduce ``weight * tensor`` into ``tensor`` on the agent's communication thread; a future of ``tensor``
        (pending if asynchronous; an error in it is raised by DDP's ``backward()``)."""
        index = self.clock.called()
        work = self._queue.run("all-reduce of a DDP bucket", self.reduce_now, tensor, weight, result=tensor)
        if not self.asynchronous:
            with contextlib.suppress(Exception):  # the error stays in the future, as asynchronously
                work.wait()
        self.clock.returned(index)
        return work.get_future()

    def reduce_now(self, tensor: Any, weight: float) -> None:
        """All-reduce ``weight * tensor`` into ``tensor`` here (the communication thread)."""
        import torch

        start = time.perf_counter()
        arr = tensor.detach().to("cpu", torch.float32).numpy()
        if weight != 1.0:
            arr = arr * np.float32(weight)
        total = self._reducer.allreduce(arr)
        tensor.copy_(torch.from_numpy(total).to(tensor.device, tensor.dtype))
        self.clock.span(start, time.perf_counter())

    @property
    def comm_seconds(self) -> float:
        """Time spent all-reducing buckets, in total."""
        return self.clock.comm_seconds

    def take_step(self) -> CommStep:
        """The communication of the backward pass(es) since the last call (call it after ``backward()``)."""
        return self.clock.take_step()

    def close(self) -> None:
        """Wait until the buckets queued so far are all-reduced (after the last backward pass)."""
        self._queue.drain()
        self._queue.close()


def weighted_hook(state: AgentHookState, bucket):  # no annotations on bucket/return: DDP checks them against torch's types
    """Sum over workers of b_i / B times each worker's bucket: the mean gradient of the global batch.

    Args:
        state: ``AgentHookState`` (its ``weight`` is b_i / B).
        bucket: DDP's ``GradBucket``.

    Returns:
        A ``torch.futures.Future`` of the bucket's tensor, overwritten with the sum once the agent's
        communication thread has all-reduced it (already completed if the state is synchronous).

    Example:
        ddp.register_comm_hook(AgentHookState.for_allocation(agent, alloc), weighted_hook)
    """
    return state.submit(bucket.buffer(), state.weight)


def mean_hook(state: AgentHookState, bucket):
    """The plain mean over workers (each bucket scaled by 1/n), as DDP's default all-reduce: equal shares."""
    return state.submit(bucket.buffer(), 1.0 / state.agent.size)


HookFn = Callable[[AgentHookState, Any], Any]
HOOKS: dict[str, HookFn] = {"weighted": weighted_hook, "mean": mean_hook}


def register_hook(name: str, hook: HookFn) -> None:
    """Add a hook to the registry (``get_hook`` finds it by name)."""
    if not name or name in HOOKS:
        raise ValueError(f"hook name {name!r} is empty or taken")
    HOOKS[name] = hook


def get_hook(name: str) -> HookFn:
    try:
        return HOOKS[name]
    except KeyError:
        raise KeyError(f"no hook {name!r}; registered: {', '.join(sorted(HOOKS))}") from None


class WeightedBatchSampler:
    """Batches of indices for one worker under an allocation: worker i gets b_i samples per step.

    At each step the workers take consecutive slices of the epoch's shared permutation (see
    ``Allocation.indices``), so one step of all workers is exactly one global batch. Use it as a
    DataLoader's ``batch_sampler``; call ``set_epoch`` every epoch and ``set_allocation`` when an
    adaptive allocator changes the split (the steps of an epoch stay ``dataset_size // B``). Under DDP, scale
    each loss by ``loss_weight`` (the hook's ``weighted`` state weights the gradient itself instead).
    """

    def __init__(self, dataset_size: int, allocation: Allocation, rank: int, *, seed: int = 0, epoch: int = 0) -> None:
        if not 0 <= rank < allocation.size:
            raise ValueError(f"rank {rank} out of range for {allocation.size} workers")
        allocation.steps_per_epoch(dataset_size)  # raises if the data set is smaller than one global batch
        self.dataset_size, self.allocation, self.rank, self.seed, self.epoch = dataset_size, allocation, rank, seed, epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_allocation(self, allocation: Allocation) -> None:
        if allocation.global_batch != self.allocation.global_batch or allocation.size != self.allocation.size:
            raise ValueError("a new allocation must keep the global batch and the number of workers")
        self.allocation = allocation

    def __len__(self) -> int:
        return self.allocation.steps_per_epoch(self.dataset_size)

    @property
    def loss_weight(self) -> float:
        """n * b_i / B: what this worker multiplies its loss by under DDP (backend ``"ina"``, gloo, any), so that DDP's
        mean over the n workers' gradients is the mean over the global batch. The backend never rescales::

            loss = F.cross_entropy(ddp(x), y) * sampler.loss_weight
        """
        return self.allocation.size * self.allocation.gradient_scale(self.rank)

    def __iter__(self) -> Iterator[list[int]]:
        perm = epoch_permutation(self.seed, self.epoch, self.dataset_size)
        for step in range(len(self)):
            yield self.allocation.indices(perm, self.rank, step).tolist()
