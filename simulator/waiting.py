"""Jobs waiting for workers, in arrival order, indexed by size: finding those that fit the free workers costs a
look at each distinct size, not at every waiting job."""
from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable

from simulator.trace import JobSpec

__all__ = ["WaitingQueue"]


class WaitingQueue:
    """A FIFO of waiting jobs per size (workers); a job's place in arrival order is its sequence number."""

    def __init__(self) -> None:
        self._by_size: dict[int, deque[tuple[int, JobSpec]]] = {}
        self._sizes: list[int] = []  # the sizes that have waiting jobs, ascending
        self._seq = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, spec: JobSpec) -> None:
        queue = self._by_size.get(spec.num_workers)
        if queue is None:
            queue = self._by_size[spec.num_workers] = deque()
            bisect.insort(self._sizes, spec.num_workers)
        queue.append((self._seq, spec))
        self._seq += 1
        self._count += 1

    def smallest(self) -> float:
        """The fewest workers a waiting job needs (infinity when none waits)."""
        return self._sizes[0] if self._sizes else math.inf

    def start_fitting(self, free: Callable[[], int], start: Callable[[JobSpec], bool], *, fifo: bool) -> None:
        """Offer `start` the waiting jobs that need at most `free()` workers, in arrival order; those it starts
        (returns True for) leave the queue. `free()` only falls as jobs start, so a job passed over once stays
        passed over. ``fifo``: stop at the first job that cannot start (whatever its size)."""
        if fifo:
            while self._count:
                size = min(self._sizes, key=lambda s: self._by_size[s][0][0])
                spec = self._by_size[size][0][1]
                if spec.num_workers > free() or not start(spec):
                    return
                self._remove(size, 0)
            return
        heads = [(self._by_size[s][0][0], s, 0) for s in self._sizes[: bisect.bisect_right(self._sizes, free())]]
        heapq.heapify(heads)
        while heads:
            _, size, index = heapq.heappop(heads)
            if size > free():
                continue
            queue = self._by_size[size]
            if start(queue[index][1]):
                self._remove(size, index)
            else:
                index += 1
            if index < len(queue):
                heapq.heappush(heads, (queue[index][0], size, index))

    def _remove(self, size: int, index: int) -> None:
        queue = self._by_size[size]
        del queue[index]
        self._count -= 1
        if not queue:
            del self._by_size[size]
            self._sizes.remove(size)
