"""One worker's agent for one job: joins the job at the controller, follows its grants, all-reduces float32 arrays.

    with Agent(spec, worker_id=0, controller="127.0.0.1:50051") as agent:
        total = agent.allreduce(grad * np.float32(allocation.gradient_scale(rank)))

The agent owns one UDP socket (INA packets) and one TCP listener on the worker's address (its ``Acceptor`` hands
the connections to the rings and to the mesh), the ``ChunkStream`` that reduces the job's chunks, the ``Mesh``
that carries broadcast, the gathers and the sums the switch cannot make, a ``JobWatcher`` (events, heartbeat)
and a ``CommThread`` for asynchronous calls (``submit``, ``allreduce_async``). Several agents (jobs) can run in
one process. Joining: the worker with the lowest id registers the job, the
others find it by name (or every worker is given ``job_id`` by a launcher that registered it); at the
end the worker with the lowest id releases it. Without a controller, a job runs on the ring only.
See docs/agent.md.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Self, TypeVar

import numpy as np

from host_agent.acceptor import Acceptor
from host_agent.comm import CommThread
from host_agent.control import AdmissionClient, JobWatcher
from host_agent.errors import AdmissionError, AgentError, AgentTimeout, JobReleased
from host_agent.fixedpoint import dequantize, quantize_chunks, to_chunks
from host_agent.grant import Grant, JobSpec, Plan, host_rack_name
from host_agent.host_member import HostCopy, is_host_member
from host_agent.mesh import HELLO_MAGIC as MESH_HELLO
from host_agent.mesh import Mesh, MeshOp
from host_agent.options import AgentOptions, StreamOptions
from host_agent.ring import HELLO_MAGIC as RING_HELLO
from host_agent.stats import StreamStats
from host_agent.stream import ChunkStream
from inaproto import wire
from inaproto.backends import Backend, BackendChoice
from inaproto.rina_ring import host_copy_port

__all__ = [
    "Agent",
    "AgentError",
    "AgentOptions",
    "AgentTimeout",
    "JobReleased",
    "MeshOp",
    "StreamOptions",
    "bind_worker_sockets",
]

T = TypeVar("T")

log = logging.getLogger("host_agent.agent")

IDLE_TICK = 0.01  # s: the idle service's period while the stream has idle work (a pending generation, Rina)
IDLE_CHECK = 1.0  # s: its longest sleep otherwise (a safety net; grants, releases and returned calls wake it)


def bind_worker_sockets(ip: str, port: int = 0, *, attempts: int = 50) -> tuple[socket.socket, socket.socket]:
    """A UDP socket and a TCP listener bound to the same ``ip:port`` (port 0: a free one for both).

    The UDP socket carries INA packets; the TCP listener accepts the rings' and the mesh's connections
    (docs/agent.md: a worker's ring address is its INA address, over TCP).
    """
    last: OSError | None = None
    for _ in range(attempts if port == 0 else 1):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            udp.bind((ip, port))
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((ip, udp.getsockname()[1]))
            tcp.listen(64)
            return udp, tcp
        except OSError as exc:
            last = exc
            udp.close()
            tcp.close()
    raise OSError(f"cannot bind UDP and TCP on {ip}:{port}: {last}")


class Agent:
    """A worker's agent for one job.

    Args:
        spec: the job (same on every worker).
        worker_id: this worker's id in ``spec.workers``.
        controller: admission service address "host:port"; None runs the ring only, with no controller.
        job_id: join this already registered job (a launcher registered it) instead of the name rendezvous.
        sock, listener: pre-bound UDP socket and TCP listener on the worker's address (see
            ``bind_worker_sockets``); by default they are bound to the address in ``spec``.
        options: timeouts and the like.

    Raises:
        AdmissionError: the controller refused or failed a call.
        AgentTimeout: the job or its first grant did not appear in time.
    """

    def __init__(
        self,
        spec: JobSpec,
        worker_id: int,
        *,
        controller: str | None = None,
        job_id: int | None = None,
        sock: socket.socket | None = None,
        listener: socket.socket | None = None,
        options: AgentOptions | None = None,
    ) -> None:
        self.spec = spec
        self.worker_id = worker_id
        self.me = spec.worker(worker_id)
        self.options = options = options or AgentOptions()
        self.rank = spec.worker_ids.index(worker_id)
        self.size = len(spec.workers)
        self.registrant = False
        self.client: AdmissionClient | None = None
        self.watcher: JobWatcher | None = None
        self._threads_stop = threading.Event()
        self._idle_work = threading.Event()  # wakes the idle service: a grant or release arrived, a call returned
        self._service: threading.Thread | None = None
        self._closed = False
        self.host_copy: HostCopy | None = None  # Rina on chains: this worker's copy where it is a host member
        self.comm = CommThread(f"ina-comm-w{worker_id}")  # asynchronous calls, in order (``submit``)
        if sock is None or listener is None:
            if sock is not None or listener is not None:
                raise ValueError("pass both sock and listener, or neither")
            sock, listener = bind_worker_sockets(self.me.ip, self.me.udp_port)
        self.sock = sock
        self.acceptor = Acceptor(listener, (RING_HELLO, MESH_HELLO), name=f"ina-accept-w{worker_id}")
        try:
            self._join(controller, job_id)
            # the mesh connects on its first collective: a peer still on its way there is waited for as in any op
            self.mesh = Mesh(self.rank, [spec.worker(w).address for w in spec.worker_ids],
                             self.acceptor.inbox(MESH_HELLO), job_id=self.job_id, timeout=options.stream.op_timeout,
                             connect_timeout=max(options.stream.connect_timeout, options.stream.op_timeout))
        except BaseException:
            self._shutdown()
            raise

    # ------------------------------------------------------------------ joining

    def _join(self, controller: str | None, job_id: int | None) -> None:
        opts = self.options
        if controller is None:
            if self.spec.backend not in (BackendChoice.RING, BackendChoice.AUTO):
                raise ValueError(f"backend {self.spec.backend!r} needs a controller; without one only 'ring' runs")
            self.job_id = job_id or 0
            grant = Grant.ring_only(self.job_id, scale=opts.scale)
            self.stream = self._make_stream(grant, sync=None)
            self._start_service()
            return
        self.client = AdmissionClient(controller, timeout=opts.rpc_timeout, credential=self.spec.secret or None,
                                      retry_for=opts.controller_retry)
        first: Grant | None = None
        if job_id is None and self.worker_id == min(self.spec.worker_ids):
            first = self.client.register(self.spec)
            self.registrant = True
            job_id = first.job_id
        elif job_id is None:
            job_id, first = self.client.find_job(self.spec.name, opts.rendezvous_timeout)
        self.job_id = job_id
        holder: dict[str, object] = {}
        lock = threading.Lock()
        ready = threading.Event()

        def on_grant(grant: Grant) -> None:
            with lock:
                stream = holder.get("stream")
                if stream is None:
                    holder["grant"] = grant
                    ready.set()
                    return
            try:
                self._follow_host_copy(grant)  # before the stream: its first packets of the generation find the copy
            finally:  # a failed copy (HostCopyFailed, reported by the watcher) must not keep the stream on the old grant
                if grant.scale != self.scale:
                    log.warning("job %d: generation %d has scale %g; keeping the job's scale %g",
                                job_id, grant.generation, grant.scale, self.scale)
                stream.notify_grant(grant)
                self._idle_work.set()

        def on_released() -> None:
            with lock:
                holder["released"] = True
                stream = holder.get("stream")
                ready.set()
            if stream is not None:
                stream.notify_released()
            self._idle_work.set()

        self.watcher = JobWatcher(self.client, job_id, self.worker_id, on_grant=on_grant, on_released=on_released,
                                  heartbeat_interval=opts.heartbeat_interval).start()
        if not ready.wait(opts.rendezvous_timeout):
            raise AgentTimeout(f"worker {self.worker_id}: no grant for job {job_id} within {opts.rendezvous_timeout}s")
        with lock:
            if holder.get("released"):
                if self.watcher.error is not None:  # refused: a wrong secret, a worker the job does not have
                    raise self.watcher.error
                raise JobReleased(f"job {job_id} was released before worker {self.worker_id} joined")
            grant = holder["grant"]  # the current grant (WatchJob sends it first)
            self._follow_host_copy(grant)
            self.stream = self._make_stream(grant, sync=self._sync)
            holder["stream"] = self.stream
        if first is not None and first.scale != grant.scale:
            log.warning("job %d: scale changed from %g to %g before the first call; using %g",
                        job_id, first.scale, grant.scale, grant.scale)
        self._start_service()

    def _make_stream(self, grant: Grant, sync) -> ChunkStream:
        self.scale = grant.scale
        return ChunkStream(worker_id=self.worker_id, workers=self.spec.workers, sock=self.sock,
                           ring_inbox=self.acceptor.inbox(RING_HELLO), grant=grant, backend=self.spec.backend, sync=sync,
                           options=self.options.stream, addresses=self._addresses())

    def _addresses(self) -> dict[str, tuple[str, int]]:
        """Where INA packets go per "rack": the options' overrides, and this worker's own copy (host member)."""
        out = dict(self.options.switch_addresses)
        if 0 < self.me.udp_port < 65535:  # this worker's copy, where a grant on chains makes it a host member
            out[host_rack_name(self.worker_id)] = (self.me.ip, host_copy_port(self.me.udp_port))
        return out

    def _follow_host_copy(self, grant: Grant) -> None:
        """Rina on chains: the copy this worker keeps while a grant makes it a host member (started the first
        time one does; host_agent/host_member.py)."""
        if self.host_copy is None:
            if grant.backend != Backend.RINA or not is_host_member(grant, self.worker_id):
                return
            self.host_copy = HostCopy(self.me, self.spec.workers, self.options.switch_addresses)
        self.host_copy.follow(grant)

    def _sync(self, generation: int, first_missing: int) -> int:
        assert self.client is not None
        return self.client.sync(self.job_id, self.worker_id, generation, first_missing,
                                timeout=self.options.stream.op_timeout)

    def _start_service(self) -> None:
        """The idle service thread: it ticks every ``IDLE_TICK`` only while the stream has idle work (a pending
        generation, Rina's repairs), and otherwise sleeps until a grant, a release or a returned call wakes it
        (``IDLE_CHECK`` at most), so a job's agents waiting on the wire do not wake every tick."""
        def serve() -> None:
            stop, work = self._threads_stop, self._idle_work
            while not stop.is_set():
                if self.stream.wants_idle_service():
                    stop.wait(IDLE_TICK)
                else:
                    work.wait(IDLE_CHECK)
                    work.clear()
                if stop.is_set():
                    return
                self.stream.service_idle()

        self._service = threading.Thread(target=serve, name=f"agent-idle-job{self.job_id}-w{self.worker_id}", daemon=True)
        self._service.start()

    # ------------------------------------------------------------------ all-reduce

    @property
    def plan(self) -> Plan:
        """The plan of the generation the stream currently runs under."""
        return self.stream.plan

    @property
    def backend(self) -> str:
        """The backend in use now: ``ina``, ``ring`` or ``rina``."""
        return self.stream.plan.kind

    @property
    def generation(self) -> int:
        return self.stream.generation

    @property
    def stats(self) -> StreamStats:
        return self.stream.stats

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on the agent's communication thread, after every call submitted before it;
        returns its future at once. Every worker must submit the same calls in the same order; a call made
        directly (``allreduce``) while submitted ones run races with them: use one or the other."""
        return self.comm.submit(fn, *args, **kwargs)

    def allreduce_async(self, array: np.ndarray, *, scale: float | None = None) -> Future[np.ndarray]:
        """``allreduce`` on the communication thread: a future of the sum (``array`` must not change meanwhile)."""
        return self.comm.submit(self.allreduce, array, scale=scale)

    def allreduce(self, array: np.ndarray, *, scale: float | None = None) -> np.ndarray:
        """Sum of ``array`` over all workers, as float32 of the same shape.

        Each worker's values are quantised to int32 with the job's scale (``rint(x * scale)``,
        saturated), summed exactly, and returned as ``float32(sum / scale)``: every worker gets the same
        bits, whichever backend carried each chunk. Weight the gradient (b_i / B) before calling.
        Every worker must make the same calls with the same sizes, in the same order.
        """
        arr = np.asarray(array)
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"allreduce needs a numeric array, got {arr.dtype}")
        s = self.scale if scale is None else float(scale)
        flat = arr.reshape(-1)
        if flat.size == 0:
            return np.zeros(arr.shape, dtype=np.float32)
        try:
            sums = self.stream.reduce(quantize_chunks(flat, s)).reshape(-1)[: flat.size]
        finally:
            self._idle_work.set()  # a grant that came during the call may be left to the idle service
        return dequantize(sums, s).reshape(arr.shape)

    def allreduce_fixed(self, q: np.ndarray) -> np.ndarray:
        """Exact int64 sum over all workers of int32 ``q`` (already fixed point), same shape."""
        arr = np.asarray(q)
        if arr.dtype != np.int32:
            raise TypeError(f"allreduce_fixed needs int32, got {arr.dtype}")
        flat = arr.reshape(-1)
        if flat.size == 0:
            return np.zeros(arr.shape, dtype=np.int64)
        try:
            sums = self.stream.reduce(to_chunks(flat))
        finally:
            self._idle_work.set()  # a grant that came during the call may be left to the idle service
        return sums.reshape(-1)[: flat.size].astype(np.int64).reshape(arr.shape)

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Every worker's ``array`` stacked in worker-id order, shape (n, *array.shape), bit for bit.

        Over the mesh (``allgather_into``): each worker's bytes go to every other worker once (e.g. measured
        speeds for the adaptive allocator, block floating point's exponent codes).
        """
        arr = np.ascontiguousarray(array)
        out = np.empty((self.size, *arr.shape), dtype=arr.dtype)
        self.mesh.allgather(arr, list(out))
        return out

    def barrier(self) -> None:
        """Returns once every worker has completed every earlier call."""
        self.stream.reduce(np.zeros((1, wire.LANES), dtype=np.int32))

    # ------------------------------------------------------------------ over the mesh (host_agent.mesh)

    def broadcast(self, array: np.ndarray, root: int) -> None:
        """The ``root`` rank's ``array`` into every worker's ``array`` (in place; same size everywhere), bit for bit."""
        self.mesh.broadcast(array, root)

    def allgather_into(self, array: np.ndarray, outputs: list[np.ndarray]) -> None:
        """``outputs[r]`` = rank r's ``array``, bit for bit (in place; each output sized as that rank's array)."""
        self.mesh.allgather(array, outputs)

    def allreduce_direct(self, array: np.ndarray, op: MeshOp = MeshOp.SUM) -> np.ndarray:
        """``op`` over every worker's ``array`` in its own dtype, over the workers' TCP links (not the switch): each
        chunk reduced by one worker in rank order, so every worker gets the same bits; integer sums exact (wrapping).
        For what the switch cannot add: float64, int64, MIN, MAX, PRODUCT, bitwise ops."""
        return self.mesh.allreduce(array, MeshOp(op))

    def gather(self, array: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
        """At ``root``, ``outputs[r]`` = rank r's ``array``; the other ranks pass ``outputs=None``."""
        self.mesh.gather(array, outputs, root)

    def scatter(self, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None:
        """Rank r's ``output`` = ``root``'s ``inputs[r]``; the other ranks pass ``inputs=None``."""
        self.mesh.scatter(output, inputs, root)

    # ------------------------------------------------------------------ end

    def close(self, *, barrier: bool = True) -> None:
        """End this worker's part: a closing barrier, then the worker with the lowest id releases the job.

        The other workers stay (answering resynchronisations) until the release arrives or
        ``close_timeout`` passes, so a late worker is never left waiting for them. ``barrier=False``: the job
        failed (a worker is gone), nobody waits for anybody: the first worker releases the job at once.
        """
        if self._closed:
            return
        self._closed = True
        if barrier:
            self.comm.close()  # what was submitted runs first
        elif getattr(self, "mesh", None) is not None:
            self.mesh.abort()  # a call stuck on the mesh fails now; the release ends one on the stream
        try:
            if not barrier and self.client is not None and self.worker_id == min(self.spec.worker_ids):
                self._release()
            elif barrier and self.client is not None and self.watcher is not None and not self.stream.released:
                self._closing_barrier()
        finally:
            self._shutdown()

    def _closing_barrier(self) -> None:
        stream, watcher = self.stream, self.watcher
        try:
            stream.reduce(np.zeros((1, wire.LANES), dtype=np.int32), barrier=True)
        except AgentError as exc:
            log.warning("worker %d: closing barrier of job %d failed: %s", self.worker_id, self.job_id, exc)
        if self.worker_id == min(self.spec.worker_ids):  # the job's first worker ends it, whoever registered it
            self._release()
            return
        deadline = time.monotonic() + self.options.close_timeout
        next_beat = time.monotonic() + 0.2
        while not watcher.released.is_set() and time.monotonic() < deadline:
            watcher.released.wait(max(0.0, min(next_beat, deadline) - time.monotonic()))  # woken by the release
            if time.monotonic() >= next_beat:  # in case the controller sends no released event
                watcher.beat_now()
                next_beat = time.monotonic() + 0.2

    def _release(self) -> None:
        try:
            self.client.release(self.job_id)
        except AdmissionError as exc:
            log.warning("worker %d: releasing job %d failed: %s", self.worker_id, self.job_id, exc)

    def _shutdown(self) -> None:
        self.comm.close(timeout=10)
        links = getattr(self, "mesh", None)
        if links is not None:
            links.close()
        self._threads_stop.set()
        self._idle_work.set()
        if self._service is not None:
            self._service.join(timeout=10)
        if self.watcher is not None:
            self.watcher.stop()
        stream = getattr(self, "stream", None)
        if stream is not None:
            stream.close()
        if self.client is not None:
            self.client.close()
        if self.host_copy is not None:
            self.host_copy.close()
        self.sock.close()
        self.acceptor.close()

    def cpu_report(self) -> dict[str, float | int]:
        """CPU seconds this agent used (all its threads, and its host-member copy's child process on Rina's chains),
        the copy's part of them and the INA payloads it processed."""
        out: dict[str, float | int] = {"cpu_seconds": time.process_time()}
        if self.host_copy is not None:
            out.update(self.host_copy.cpu_report())
            out["cpu_seconds"] += out["host_copy_cpu_seconds"]
        return out

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
