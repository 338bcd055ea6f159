"""PyTorch integration (optional extra ``torch``): a DDP communication hook through the agent, and a weighted sampler.

torch is imported only when a hook runs, so ``host_agent`` works without it. Like torch's own
``ddp_comm_hooks``: free functions with the signature ``hook(state, bucket) -> Future[Tensor]``, a state
object that checks its fields when it is built, and a registry from names to hooks.

    from host_agent.torch_hook import AgentHookState, get_hook, WeightedBatchSampler
    state = AgentHookState.for_allocation(agent, allocation)          # weight b_i / B
    ddp_model.register_comm_hook(state, get_hook("weighted"))
    loader = DataLoader(dataset, batch_sampler=WeightedBatchSampler(len(dataset), allocation, agent.rank))

The hook all-reduces each gradient bucket through whatever backend the agent's job runs (INA, ring or
Rina), so DDP never calls the process group for gradients; DDP still needs an initialised process
group for its start-up broadcast of the parameters (gloo on CPU is enough).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from host_agent.allocation import Allocation, epoch_permutation

__all__ = [
    "AgentHookState",
    "HOOKS",
    "WeightedBatchSampler",
    "get_hook",
    "mean_hook",
    "register_hook",
    "weighted_hook",
]


class _Reducer(Protocol):
    rank: int
    size: int

    def allreduce(self, array: np.ndarray) -> np.ndarray: ...


@dataclass
class AgentHookState:
    """State of the agent hooks.

    Args:
        agent: the worker's ``Agent`` (anything with ``rank``, ``size`` and ``allreduce(ndarray)``).
        weight: this worker's b_i / B, the factor its bucket is scaled by before the sum (``weighted``);
            change it with ``set_allocation`` when the allocation changes.

    Raises:
        TypeError: ``agent`` cannot all-reduce.
        ValueError: ``weight`` is not in (0, 1].
    """

    agent: Any
    weight: float = 1.0
    comm_seconds: float = 0.0  # time spent all-reducing inside the hooks (subtract it to time the compute)

    def __post_init__(self) -> None:
        if not callable(getattr(self.agent, "allreduce", None)):
            raise TypeError(f"agent must have an allreduce(ndarray) method, got {type(self.agent).__name__}")
        for attr in ("rank", "size"):
            if not isinstance(getattr(self.agent, attr, None), int):
                raise TypeError(f"agent must have an int {attr!r}")
        self._check(self.weight)

    @staticmethod
    def _check(weight: float) -> None:
        if not (math.isfinite(weight) and 0.0 < weight <= 1.0):
            raise ValueError(f"weight (b_i / B) must be in (0, 1], got {weight!r}")

    @classmethod
    def for_allocation(cls, agent: _Reducer, allocation: Allocation) -> AgentHookState:
        """State whose weight is the agent's b_i / B in ``allocation`` (ranks in worker-id order)."""
        return cls(agent, allocation.gradient_scale(agent.rank))

    def set_allocation(self, allocation: Allocation) -> None:
        weight = allocation.gradient_scale(self.agent.rank)
        self._check(weight)
        self.weight = weight


def _reduce_bucket(state: AgentHookState, bucket: Any, weight: float):
    import torch

    start = time.perf_counter()
    tensor = bucket.buffer()
    arr = tensor.detach().to("cpu", torch.float32).numpy()
    if weight != 1.0:
        arr = arr * np.float32(weight)
    total = state.agent.allreduce(arr)
    tensor.copy_(torch.from_numpy(total).to(tensor.device, tensor.dtype))
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    state.comm_seconds += time.perf_counter() - start
    return fut


def weighted_hook(state: AgentHookState, bucket):  # no annotations on bucket/return: DDP checks them against torch's types
    """Sum over workers of b_i / B times each worker's bucket: the mean gradient of the global batch.

    Args:
        state: ``AgentHookState`` (its ``weight`` is b_i / B).
        bucket: DDP's ``GradBucket``.

    Returns:
        A completed ``torch.futures.Future`` holding the bucket's tensor, overwritten with the sum.

    Example:
        ddp.register_comm_hook(AgentHookState.for_allocation(agent, alloc), weighted_hook)

    Warning:
        The all-reduce runs synchronously inside the hook (no overlap with the backward pass), and
        through the agent's fixed point: results are exact sums of ``rint(x * scale)`` (docs/agent.md).
    """
    return _reduce_bucket(state, bucket, state.weight)


def mean_hook(state: AgentHookState, bucket):
    """The plain mean over workers (each bucket scaled by 1/n), as DDP's default all-reduce: equal shares."""
    return _reduce_bucket(state, bucket, 1.0 / state.agent.size)


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
    adaptive allocator changes the split (the steps of an epoch stay ``dataset_size // B``).
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

    def __iter__(self) -> Iterator[list[int]]:
        perm = epoch_permutation(self.seed, self.epoch, self.dataset_size)
        for step in range(len(self)):
            yield self.allocation.indices(perm, self.rank, step).tolist()
