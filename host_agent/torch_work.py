"""The agent's asynchronous calls as PyTorch ``Work`` objects: the one mechanism of the DDP hook and the backend.

Every call goes to the agent's communication thread (``Agent.submit``, ``host_agent.comm``), in order; its
``AgentWork`` is what ``torch.distributed`` and DDP expect back: ``wait()`` blocks until the call ended and raises
its error, ``get_future()`` is a ``torch.futures.Future`` of the call's tensors (DDP chains its bucket's
callbacks to it), ``is_completed()``. The DDP hook (``host_agent.torch_hook``) returns the future of one; every
collective of the backend ``"ina"`` (``host_agent.torch_backend``) returns one.

Why not ``torch._C._distributed_c10d._create_work_from_future``: the Work it makes ignores the timeout of
``wait(timeout)`` and, in PyTorch 2.13, also the future's error: ``wait()`` returns True and the future's value
is the exception object (``torch.futures.Future.set_exception`` stores it as a value with a Python-side unwrap
that the C++ Work never calls), so a failed collective would pass silently. ``AgentWork`` subclasses
``torch.distributed.Work`` (PyTorch's public base; its Python overrides are what the C++ side calls, DDP
included) and raises itself. Its future carries an error the C++ side sees: a callback that re-raises the
call's exception (``Future.then``), which PyTorch records as the future's error.

Timeouts: ``WorkQueue(timeout=T)`` fails a call that has been running for T seconds (its ``wait()`` raises
``AgentTimeout``, its future fails), and every call queued after it, since the FIFO behind a stuck call cannot
move: a script blocked in DDP's backward gets the error instead of a hang. A call whose Work already failed is
skipped when its turn comes (its tensors are not touched after the error was reported).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from host_agent.errors import AgentError, AgentTimeout

__all__ = ["AgentWork", "WorkQueue"]

WATCH_POLL = 0.5  # s: the watchdog's longest sleep while the call at the head has not started


def _reraise(fut: torch.futures.Future) -> Any:
    return fut.value()  # raises the call's exception: the chained future then holds it as a C++ error


class AgentWork(dist.Work):
    """One call on the agent's communication thread (see the module docstring).

    Args:
        op: what the call does, for messages ("all_reduce", "broadcast", ...).
        result: the future's value once the call succeeded (the collective's output tensors).
    """

    def __init__(self, op: str, result: Any) -> None:
        super().__init__()
        self.op = op
        self.result_value = result
        self.queued = time.monotonic()
        self.started: float | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._future: torch.futures.Future = torch.futures.Future()

    def complete(self, error: BaseException | None = None) -> bool:
        """End the call with its result or ``error``; False if it had ended already (a timeout came first)."""
        with self._lock:
            if self._done.is_set():
                return False
            self._error = error
            self._done.set()
        if error is None:
            self._future.set_result(self.result_value)
        else:
            self._future.set_exception(error)
        return True

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call ended; raise its error. ``timeout`` (None or zero: none) raises ``AgentTimeout``
        if it has not ended by then (the call goes on)."""
        seconds = timeout.total_seconds() if timeout else 0.0
        if not self._done.wait(seconds if seconds > 0 else None):
            raise AgentTimeout(f"{self.op} did not complete within {seconds:g}s")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        """A future of the result tensors that fails (for PyTorch's C++ side too) if the call fails."""
        return self._future.then(_reraise)

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self.result_value


class WorkQueue:
    """Calls on an agent's communication thread as ``AgentWork``; with ``timeout``, a watchdog fails stuck ones.

    Args:
        agent: anything with ``submit(fn, *args)`` returning a ``concurrent.futures.Future`` (an ``Agent``).
        timeout: seconds a call may run before its Work fails (None: no limit; the agent's own no-progress
            timeouts still apply).
        name: for the watchdog thread and messages.
    """

    def __init__(self, agent: Any, timeout: float | None = None, name: str = "agent") -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 or None, got {timeout!r}")
        self.agent, self.timeout, self.name = agent, timeout, name
        self._pending: deque[AgentWork] = deque()
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        self._closed = False
        self._watchdog: threading.Thread | None = None

    @property
    def failed(self) -> BaseException | None:
        """The timeout that broke the queue, if one did (every later call fails with it)."""
        return self._failed

    def run(self, op: str, fn: Callable[..., Any], *args: Any, result: Any = None) -> AgentWork:
        """Queue ``fn(*args)`` on the agent's communication thread; its Work at once (``result``: the value of
        the Work's future once ``fn`` returned)."""
        work = AgentWork(op, result)
        if self._failed is not None:
            work.complete(AgentError(f"{self.name}: {op} refused: {self._failed}"))
            return work

        def call() -> None:
            if work.done:  # failed by the watchdog while it waited: its tensors stay as the error left them
                return
            work.started = time.monotonic()
            with self._cond:
                self._cond.notify_all()
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 (the Work carries it to whoever waits)
                work.complete(exc)
            else:
                work.complete()
            with self._cond:
                self._cond.notify_all()

        with self._cond:
            if self.timeout is not None:
                self._pending.append(work)
                if self._watchdog is None:
                    self._watchdog = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
                    self._watchdog.start()
        try:
            self.agent.submit(call)
        except BaseException as exc:  # noqa: BLE001 (a closed communication thread)
            work.complete(AgentError(f"{self.name}: {op} refused: {exc}"))
        return work

    def _watch(self) -> None:
        assert self.timeout is not None
        with self._cond:
            while not self._closed:
                while self._pending and self._pending[0].done:
                    self._pending.popleft()
                if not self._pending:
                    self._cond.wait()
                    continue
                head = self._pending[0]
                if head.started is None:
                    self._cond.wait(WATCH_POLL)
                    continue
                left = head.started + self.timeout - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._expire(head)

    def _expire(self, head: AgentWork) -> None:
        """``head`` ran for the whole timeout: it fails, and so does everything queued behind it (caller holds the lock)."""
        error = AgentTimeout(f"{self.name}: {head.op} did not complete within {self.timeout:g}s")
        self._failed = error
        head.complete(error)
        for work in self._pending:
            work.complete(AgentError(f"{self.name}: {work.op} not run: {error}"))
        self._pending.clear()

    def drain(self) -> None:
        """Wait until every call queued so far has ended (its error, if any, stays with its Work)."""
        self.agent.submit(lambda: None).result()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._watchdog is not None:
            self._watchdog.join(5.0)
