"""The agent's client of the controller's admission service (inaproto/admission.proto).

One error type, ``host_agent.errors.AdmissionError``, wraps ``grpc.RpcError`` with its status code and details. The
event stream (``WatchJob``) and the heartbeat run in ``JobWatcher``'s background threads, which hand
grants and releases to a callback; everything else is a plain blocking call with a deadline.

Every call carries the job's secret (inaproto/credentials.py). A controller that is down or restarting
(UNAVAILABLE) is retried with capped exponential backoff and jitter for ``retry_for`` seconds (default
30) before the call fails; meanwhile the data plane keeps running. RegisterJob sends an idempotency
key, the same on every retry, so that a registration whose reply was lost is not refused as a duplicate.
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from host_agent.errors import AdmissionError, AgentTimeout, StaleGeneration
from host_agent.grant import Grant, JobSpec
from inaproto import admission_pb2 as pb
from inaproto import admission_pb2_grpc as pb_grpc
from inaproto.backends import JobState
from inaproto.credentials import JOB_SECRET_ENV, TlsFiles, admission_channel

__all__ = ["AdmissionClient", "AdmissionError", "Backoff", "JobWatcher"]

T = TypeVar("T")
RETRIED = (grpc.StatusCode.UNAVAILABLE,)  # the controller is down or restarting

log = logging.getLogger("host_agent.control")


def _wrap(what: str, exc: grpc.RpcError) -> AdmissionError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "ERROR"
    return AdmissionError(f"{what}: {name}: {details}", code, details or "")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter: the n-th wait is uniform in [d/2, d], d = min(cap, first * 2**n)."""

    first: float = 0.05
    cap: float = 2.0

    def delay(self, attempt: int) -> float:
        d = min(self.cap, self.first * 2 ** min(attempt, 30))
        return random.uniform(d / 2, d)


class AdmissionClient:
    """Blocking calls to the admission service at ``address`` ("host:port").

    Args:
        credential: the job's secret; None: ``$INA_JOB_SECRET`` (calls without one are refused).
        tls: the controller's CA (and a client certificate); None: ``$INA_TLS_*``, else plaintext.
        retry_for: how long a call is retried while the controller is unavailable (seconds).
    """

    def __init__(self, address: str, *, timeout: float = 10.0, credential: str | None = None,
                 tls: TlsFiles | None = None, retry_for: float = 30.0, backoff: Backoff = Backoff()) -> None:
        self.address = address
        self.timeout = timeout
        self.retry_for = retry_for
        self.backoff = backoff
        if credential is None:
            credential = os.environ.get(JOB_SECRET_ENV, "")
        self.channel = admission_channel(address, credential or None, tls if tls is not None else TlsFiles.from_env())
        self.stub = pb_grpc.AdmissionStub(self.channel)

    def _retrying(self, what: str, call: Callable[[], T], deadline: float | None = None) -> T:
        """``call()``, retried while the controller is unavailable, until ``retry_for`` seconds after the first
        failure (or ``deadline``, a time.monotonic() value, if later)."""
        attempt = 0
        give_up: float | None = None
        while True:
            try:
                return call()
            except grpc.RpcError as exc:
                now = time.monotonic()
                if give_up is None:
                    give_up = max(now + self.retry_for, deadline or 0.0)
                if exc.code() not in RETRIED or now >= give_up:
                    raise _wrap(what, exc) from None
                wait = min(self.backoff.delay(attempt), max(0.0, give_up - now))
                if attempt == 0:
                    log.info("%s: %s; retrying for up to %.0f s", what, exc.code().name, give_up - now)
                attempt += 1
                time.sleep(wait)

    def register(self, spec: JobSpec) -> Grant:
        req = spec.register_request()
        req.idempotency_key = uuid.uuid4().hex  # the same on every retry of this registration
        return Grant.from_proto(self._retrying(
            f"RegisterJob({spec.name!r})", lambda: self.stub.RegisterJob(req, timeout=self.timeout)))

    def find_job(self, name: str, timeout: float) -> tuple[int, Grant]:
        """The running job called ``name`` (registered by another worker): polls ListJobs until it appears."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            jobs = self._retrying("ListJobs", lambda: self.stub.ListJobs(pb.ListJobsRequest(), timeout=self.timeout).jobs,
                                  deadline=deadline)
            found = [j for j in jobs if j.name == name and j.state != JobState.RELEASED]
            if found:
                if len(found) > 1:
                    log.warning("%d running jobs are called %r; joining the newest", len(found), name)
                job = max(found, key=lambda j: (j.registered_at, j.job_id))
                return int(job.job_id), Grant.from_proto(job.grant)
            if time.monotonic() > deadline:
                raise AgentTimeout(f"no job called {name!r} appeared at {self.address} within {timeout}s "
                                   "(the worker with the lowest id registers it)")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def heartbeat(self, job_id: int, worker_id: int) -> int:
        try:
            return int(self.stub.Heartbeat(pb.HeartbeatRequest(job_id=job_id, worker_id=worker_id),
                                           timeout=self.timeout).generation)
        except grpc.RpcError as exc:
            raise _wrap(f"Heartbeat({job_id}, {worker_id})", exc) from None

    def release(self, job_id: int) -> None:
        try:
            self._retrying(f"ReleaseJob({job_id})",
                           lambda: self.stub.ReleaseJob(pb.ReleaseJobRequest(job_id=job_id), timeout=self.timeout))
        except AdmissionError as exc:
            if exc.code != grpc.StatusCode.NOT_FOUND:
                raise

    def sync(self, job_id: int, worker_id: int, generation: int, first_missing: int, timeout: float) -> int:
        """SyncGeneration: the resume chunk; StaleGeneration on FAILED_PRECONDITION."""
        req = pb.SyncGenerationRequest(job_id=job_id, worker_id=worker_id, generation=generation,
                                       first_missing_chunk=first_missing)
        try:
            resp = self._retrying(f"SyncGeneration(job {job_id}, generation {generation})",
                                  lambda: self.stub.SyncGeneration(req, timeout=timeout))
        except AdmissionError as exc:
            if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                raise StaleGeneration(exc.details) from None
            raise
        if resp.generation != generation:
            raise StaleGeneration(f"controller answered for generation {resp.generation}, not {generation}")
        return int(resp.resume_chunk)

    def close(self) -> None:
        self.channel.close()


class JobWatcher:
    """Follows a job: WatchJob events and a heartbeat, each in a daemon thread, until ``stop``.

    ``on_grant(grant)`` gets every grant (the current one first); ``on_released()`` is called once when
    the job is gone (a released event, or NOT_FOUND from either call). A broken event stream is
    reopened with backoff; it delivers the current grant first again, so nothing is missed.
    """

    def __init__(self, client: AdmissionClient, job_id: int, worker_id: int, *,
                 on_grant: Callable[[Grant], None], on_released: Callable[[], None],
                 heartbeat_interval: float = 1.0) -> None:
        self.client, self.job_id, self.worker_id = client, job_id, worker_id
        self.on_grant, self.on_released = on_grant, on_released
        self.heartbeat_interval = heartbeat_interval
        self.first_grant = threading.Event()
        self.released = threading.Event()
        self._stop = threading.Event()
        self._call = None
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._watch, name=f"watch-job{job_id}-w{worker_id}", daemon=True),
            threading.Thread(target=self._beat, name=f"heartbeat-job{job_id}-w{worker_id}", daemon=True),
        ]
        self.error: BaseException | None = None

    def start(self) -> JobWatcher:
        for t in self._threads:
            t.start()
        return self

    def _gone(self) -> None:
        if not self.released.is_set():
            self.released.set()
            self.on_released()

    def _watch(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                call = self.client.stub.WatchJob(pb.WatchJobRequest(job_id=self.job_id, worker_id=self.worker_id))
                with self._lock:
                    self._call = call
                    if self._stop.is_set():  # stop() ran before this call existed
                        self._call = None
                        call.cancel()
                        return
                for event in call:
                    attempt = 0
                    if event.released:
                        self._gone()
                        return
                    self.on_grant(Grant.from_proto(event.grant))
                    self.first_grant.set()
                if self._stop.is_set():
                    return
            except grpc.RpcError as exc:
                if self._stop.is_set() or exc.code() == grpc.StatusCode.CANCELLED:
                    return
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    self._gone()
                    return
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    self.error = _wrap(f"WatchJob({self.job_id})", exc)
                    log.error("worker %d: %s", self.worker_id, self.error)
                    self._gone()
                    return
                log.warning("worker %d: job %d event stream broke (%s); reopening", self.worker_id, self.job_id,
                            exc.code().name)
            except BaseException as exc:  # a callback failed: report, keep watching
                self.error = exc
                log.exception("worker %d: handling an event of job %d failed", self.worker_id, self.job_id)
            self._stop.wait(self.client.backoff.delay(attempt))
            attempt += 1

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self.client.heartbeat(self.job_id, self.worker_id)
            except AdmissionError as exc:
                if exc.code == grpc.StatusCode.NOT_FOUND:
                    self._gone()
                    return
                log.debug("heartbeat failed: %s", exc)

    def beat_now(self) -> None:
        """One heartbeat now (used while waiting for the release at the end)."""
        try:
            self.client.heartbeat(self.job_id, self.worker_id)
        except AdmissionError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                self._gone()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the event stream and end both threads, so no gRPC call outlives the agent's channel (a
        call left to the interpreter's finalizers can hang the process at exit)."""
        self._stop.set()
        with self._lock:
            call, self._call = self._call, None
        if call is not None:
            call.cancel()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=timeout)
                if t.is_alive():
                    log.warning("worker %d: thread %s of job %d did not end within %g s", self.worker_id, t.name,
                                self.job_id, timeout)
