"""The agent's communication thread: collective calls run one at a time, in the order they were submitted.

Every worker of a job must make the same calls in the same order (the job's chunk stream numbers them), so an
agent's asynchronous calls all go through one FIFO thread: the caller gets a ``concurrent.futures.Future`` at
once and goes on (a DDP backward pass computing the next bucket) while the thread reduces. ``Agent.submit`` and
``Agent.allreduce_async`` put calls on it; the PyTorch hook (``host_agent.torch_hook``) does too.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["CommThread"]

T = TypeVar("T")


class CommThread:
    """A FIFO of calls run by one thread (started by the first ``submit``, ended by ``close``).

    A call that raises completes its future with the exception; the calls after it still run (the agent's stream
    refuses them itself once a failure broke it)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on the thread after every call submitted before; its future."""
        fut: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the communication thread is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put((fut, fn, args, kwargs))
        return fut

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 (the future carries it to whoever waits)
                fut.set_exception(exc)

    def close(self, timeout: float | None = None) -> None:
        """Run what was submitted, then end the thread (waits at most ``timeout`` seconds)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            if thread is not threading.current_thread():
                thread.join(timeout)
