"""The ``torch.distributed`` backend ``"ina"``: a PyTorch training script runs through the switch unchanged.

    import host_agent.torch_backend  # registers the backend "ina"

    dist.init_process_group("ina")                # under torchrun (env:// rendezvous, torchrun's store)
    ddp = DistributedDataParallel(model)          # its buckets go through INA, the ring or Rina, as granted

Each rank's process group is one ``Agent`` (``host_agent.agent``) of one job: ``dist.init_process_group`` joins
the INA job at the controller named by ``$INA_CONTROLLER`` (the job's secret from ``$INA_JOB_SECRET``), rank r
being the job's worker r; without ``$INA_CONTROLLER`` the ranks run the agents' ring among themselves. The ranks
find each other through the rendezvous store: each binds its agent on the address it reaches the rendezvous host
from (the rendezvous host's own address where that is this host: ``--master-addr`` names it) and publishes it;
rank 0 registers the job and publishes its id, the others join it by id. The agent follows the job's grants for
the whole run (INA, ring, Rina, tree; every generation change resynchronised, no step lost). The group's timeout
(``init_process_group(timeout=...)``) is the agent's: joining, each collective's progress, each collective's
Work (``host_agent.torch_work``).

Collectives (every one asynchronous: queued on the agent's communication thread, in call order, returning an
``AgentWork``; DDP's buckets overlap backward as with gloo, with no hook):

- ``all_reduce`` SUM and AVG of float32, float16 and bfloat16: through the switch in block floating point
  (``host_agent.block_scale``; float16/bfloat16 as float32, rounded back once). int8, int16, int32 and uint8 SUM:
  through the switch, exact (wrapping as gloo's). float64 and int64 SUM (AVG for float64), and MIN, MAX, PRODUCT,
  BAND, BOR, BXOR of any of these dtypes: over the workers' TCP links (``Agent.allreduce_direct``: reduced in rank
  order, the same bits on every rank; integers exact). Anything else (``PREMUL_SUM``, AVG of integers, bool or
  complex sums) is refused with an error naming the op and the dtype.
- ``broadcast``, ``all_gather`` (sizes may differ per rank), ``all_gather_into_tensor`` (``all_gather_single``),
  ``gather``, ``scatter``: bytes over the mesh (``host_agent.mesh``), any dtype, bit for bit.
- ``reduce_scatter_tensor`` (``reduce_scatter_single``), ``reduce_scatter``, ``reduce``: the ``all_reduce`` of the
  whole input (through the switch), of which each rank keeps its part: the same numerics as ``all_reduce``.
- ``barrier``: one chunk through the job's stream.
- Not supported (an error naming the op): point-to-point (``send``, ``recv``), ``all_to_all``.

``dist.new_group(ranks, backend="ina")`` makes a new INA job for the subgroup (its ranks' own agents, sockets
and switch slots), joined the same way through the subgroup's store.

The backend never rescales a gradient: DDP averages over the ranks (it divides each bucket by the world size
before the SUM), so with a data allocation that gives rank i ``b_i`` of the global batch ``B`` each rank scales
its loss by ``n * b_i / B`` (``WeightedBatchSampler.loss_weight``, ``host_agent.torch_hook``). See docs/agent.md,
"PyTorch".
"""
from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from host_agent.agent import Agent, bind_worker_sockets
from host_agent.block_scale import BlockScaledReducer
from host_agent.errors import AgentError, AgentTimeout
from host_agent.grant import JobSpec, Worker
from host_agent.mesh import MeshOp
from host_agent.options import AgentOptions, StreamOptions
from host_agent.torch_work import AgentWork, WorkQueue
from inaproto.backends import BackendChoice
from inaproto.credentials import CONTROLLER_ENV, JOB_SECRET_ENV

__all__ = ["BACKEND", "InaProcessGroup", "JoinError", "agent_address", "agent_options", "join_agent"]

log = logging.getLogger("host_agent.torch_backend")

BACKEND = "ina"
_KEY = "ina/"  # the backend's keys in the group's store (torch gives every group its own prefix)
_ERROR = _KEY + "error"
_SWITCH_FLOATS = {torch.float32, torch.float16, torch.bfloat16}  # block floating point through the switch
_SWITCH_INTS = {torch.int8, torch.int16, torch.int32, torch.uint8}  # exact int32 sums through the switch
_DIRECT = {torch.float64, torch.int64}  # SUM over the mesh
_ORDERED = _SWITCH_FLOATS | _SWITCH_INTS | _DIRECT | {torch.bool}  # MIN, MAX, PRODUCT over the mesh
_BITWISE = _SWITCH_INTS | {torch.int64, torch.bool}
_MESH_OPS = {dist.ReduceOp.MIN: MeshOp.MIN, dist.ReduceOp.MAX: MeshOp.MAX, dist.ReduceOp.PRODUCT: MeshOp.PRODUCT,
             dist.ReduceOp.BAND: MeshOp.BAND, dist.ReduceOp.BOR: MeshOp.BOR, dist.ReduceOp.BXOR: MeshOp.BXOR}


class JoinError(AgentError):
    """A rank could not join the group's job (it names the rank and why); every rank raises it."""


# --------------------------------------------------------------------------- joining


def agent_address(master: str | None = None) -> str:
    """The IPv4 address this rank's agent binds: ``master`` (``$MASTER_ADDR``, the rendezvous host) where it is one of
    this host's addresses, else the source address of the route towards it. ``--standalone`` (``localhost``):
    127.0.0.1, a ring among the local ranks; through a switch, name the host's address with ``--master-addr``."""
    target = socket.gethostbyname(master or os.environ.get("MASTER_ADDR") or "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((target, 0))
            return target
        except OSError:
            pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
        route.connect((target, 9))  # no packet is sent: only a route lookup
        return route.getsockname()[0]


def agent_options(timeout: float) -> AgentOptions:
    """The agent's configuration under a process group's ``timeout`` (seconds): every wait of the agent within it."""
    return AgentOptions(
        stream=StreamOptions(op_timeout=timeout, connect_timeout=timeout, ring_grace=min(10.0, timeout)),
        rendezvous_timeout=timeout, rpc_timeout=min(10.0, timeout), close_timeout=min(10.0, timeout),
        controller_retry=min(30.0, timeout))


def _await(store: dist.Store, key: str, deadline: float, what: str) -> str:
    """The value of ``key`` once some rank set it; JoinError as soon as any rank reported a failure."""
    delay = 0.005
    while True:
        if store.check([key]):
            return store.get(key).decode()
        if store.check([_ERROR]):
            raise JoinError(store.get(_ERROR).decode())
        if time.monotonic() > deadline:
            raise AgentTimeout(f"{what} within the process group's timeout")
        time.sleep(delay)
        delay = min(2 * delay, 0.1)


def join_agent(store: dist.Store, rank: int, size: int, timeout: float, *, controller: str | None = None,
               ip: str | None = None) -> Agent:
    """This rank's agent of the group's job, every rank of the group joined (see the module docstring).

    Raises:
        JoinError: some rank could not join (the message names it and why), on every rank.
        AgentTimeout: some rank did not get this far within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    # torch reuses a group's store prefix after destroy_process_group: the keys of each creation of the group are
    # apart (every rank creates the group the same number of times, so every rank counts the same)
    store = dist.PrefixStore(f"{_KEY}{store.add(f'{_KEY}created/{rank}', 1)}", store)
    agent: Agent | None = None
    try:
        agent = _join(store, rank, size, timeout, deadline, controller, ip)
        store.set(f"{_KEY}joined/{rank}", "ok")
        for r in range(size):
            _await(store, f"{_KEY}joined/{r}", deadline, f"rank {r} did not join the INA job")
    except BaseException as exc:
        if not isinstance(exc, JoinError):
            try:
                store.set(_ERROR, f"rank {rank} could not join the INA job: {type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 (the store itself is gone: every rank's wait times out)
                log.warning("rank %d: could not report its failure to the store", rank)
        if agent is not None:
            agent.close(barrier=False)
        if isinstance(exc, JoinError | AgentTimeout):
            raise
        raise JoinError(f"rank {rank} could not join the INA job: {type(exc).__name__}: {exc}") from exc
    return agent


def _join(store: dist.Store, rank: int, size: int, timeout: float, deadline: float, controller: str | None,
          ip: str | None) -> Agent:
    udp, tcp = bind_worker_sockets(ip or agent_address())
    try:
        host, port = udp.getsockname()[:2]
        store.set(f"{_KEY}worker/{rank}", f"{host}:{port}")
        if rank == 0:
            store.set(f"{_KEY}name", f"torch-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}-{secrets.token_hex(4)}")
        workers = []
        for r in range(size):
            addr = _await(store, f"{_KEY}worker/{r}", deadline, f"rank {r} published no address")
            a_ip, a_port = addr.rsplit(":", 1)
            workers.append(Worker(r, a_ip, int(a_port)))
        name = _await(store, f"{_KEY}name", deadline, "rank 0 named no job")
        spec = JobSpec(name, tuple(workers), backend=BackendChoice.AUTO if controller else BackendChoice.RING,
                       secret=os.environ.get(JOB_SECRET_ENV, ""))
        job_id = None
        if controller and rank != 0:
            job_id = int(_await(store, f"{_KEY}job", deadline, "rank 0 registered no job at the controller"))
    except BaseException:
        udp.close()
        tcp.close()
        raise
    left = max(1.0, deadline - time.monotonic())  # joining the job within what is left of the timeout
    options = replace(agent_options(timeout), rendezvous_timeout=left, controller_retry=min(30.0, left))
    agent = Agent(spec, rank, controller=controller, job_id=job_id, sock=udp, listener=tcp, options=options)
    if controller and rank == 0:
        store.set(f"{_KEY}job", str(agent.job_id))
    return agent


# --------------------------------------------------------------------------- the process group


def _tensor(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"the ina backend takes one tensor per {op}, got {len(tensors)}")
    return _checked(tensors[0], op)


def _checked(t: torch.Tensor, op: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ValueError(f"the ina backend runs on CPU tensors; {op} got a tensor on {t.device}")
    if t.is_sparse or t.is_complex():
        raise ValueError(f"the ina backend has no {op} of {'sparse' if t.is_sparse else t.dtype} tensors")
    return t


def _raw(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a uint8 array sharing its memory (a contiguous tensor)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


class _Contiguous:
    """A contiguous stand-in for ``t`` while a collective writes into it, copied back at the end."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.buf = t if t.is_contiguous() else t.contiguous()

    def done(self) -> None:
        if self.buf is not self.t:
            self.t.copy_(self.buf)


def _reduce_op(opts: Any) -> Any:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return getattr(op, "op", op)  # a ReduceOp's RedOpType


class InaProcessGroup(dist.ProcessGroup):
    """A ``torch.distributed`` process group whose collectives go through one rank's ``Agent``.

    Built by ``dist.init_process_group("ina")`` / ``dist.new_group(..., backend="ina")``; ``join`` builds one from a
    store directly. ``agent`` is public: ``agent.backend`` tells what the job runs now (ina, ring, rina).

    Args:
        agent: this rank's agent (its rank and size are the group's).
        timeout: seconds a collective may run before its Work fails.
    """

    def __init__(self, agent: Agent, timeout: float) -> None:
        super().__init__(agent.rank, agent.size)
        self.agent = agent
        self.timeout = timeout
        self._bfp = BlockScaledReducer(agent)
        self._queue = WorkQueue(agent, timeout, name=f"ina rank {agent.rank}")
        self._failed: BaseException | None = None
        self._closed = False
        _LIVE.add(self)

    @classmethod
    def join(cls, store: dist.Store, rank: int, size: int, timeout: timedelta | float, *,
             controller: str | None = None, ip: str | None = None) -> InaProcessGroup:
        """Every rank of the group joins its job (``join_agent``); the group of this rank."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        return cls(join_agent(store, rank, size, seconds, controller=controller, ip=ip), seconds)

    def getBackendName(self) -> str:
        return BACKEND

    def name(self) -> str:
        return BACKEND

    def _run(self, op: str, fn: Callable[[], None], result: Any) -> AgentWork:
        if self._closed:
            raise AgentError(f"the ina process group is shut down: no {op}")

        def guarded() -> None:
            try:
                fn()
            except BaseException as exc:
                self._failed = exc
                raise

        return self._queue.run(op, guarded, result=result)

    # ------------------------------------------------------------------ all-reduce

    def _reducer(self, dtype: torch.dtype, op: Any, name: str) -> Callable[[torch.Tensor], None]:
        """The in-place all-reduce of a contiguous tensor of ``dtype`` under ``op``, or ValueError naming both."""
        n = self.agent.size
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            avg = op == dist.ReduceOp.AVG
            if dtype in _SWITCH_FLOATS:
                return lambda t: self._sum_floats(t, avg)
            if dtype in _SWITCH_INTS and not avg:
                return self._sum_ints
            if dtype in _DIRECT and not (avg and dtype == torch.int64):
                return lambda t: self._direct(t, MeshOp.SUM, n if avg else 1)
        elif op in _MESH_OPS and dtype in (_BITWISE if op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR,
                                                               dist.ReduceOp.BXOR) else _ORDERED):
            return lambda t: self._direct(t, _MESH_OPS[op], 1)
        raise ValueError(f"the ina backend has no {name} with {str(op).split('.')[-1]} of {dtype} (see "
                         "host_agent.torch_backend: SUM/AVG of float32, float16, bfloat16 and float64; SUM of int8, "
                         "int16, int32, uint8 and int64; MIN, MAX, PRODUCT and bitwise ops over TCP)")

    def _sum_floats(self, t: torch.Tensor, avg: bool) -> None:
        total = self._bfp.allreduce(t.detach().to(torch.float32).numpy())
        if avg:
            total = total / np.float32(self.agent.size)
        t.copy_(torch.from_numpy(total).reshape(t.shape))

    def _sum_ints(self, t: torch.Tensor) -> None:
        sums = self.agent.allreduce_fixed(t.detach().numpy().astype(np.int32))
        t.copy_(torch.from_numpy(sums.astype(t.detach().numpy().dtype)))  # int64 sums, wrapped as the dtype's

    def _direct(self, t: torch.Tensor, op: MeshOp, divide: int) -> None:
        arr = t.detach().to(torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.detach()
        out = self.agent.allreduce_direct(arr.numpy(), op)
        if divide != 1:
            out = out / divide
        t.copy_(torch.from_numpy(np.ascontiguousarray(out)).reshape(t.shape))

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> AgentWork:
        t = _tensor(tensors, "all_reduce")
        reduce = self._reducer(t.dtype, _reduce_op(opts), "all_reduce")
        box = _Contiguous(t)

        def run() -> None:
            reduce(box.buf)
            box.done()

        return self._run("all_reduce", run, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> AgentWork:
        op = _reduce_op(opts)
        reducers = [self._reducer(_checked(t, "all_reduce_coalesced").dtype, op, "all_reduce_coalesced")
                    for t in tensors]
        boxes = [_Contiguous(t) for t in tensors]

        def run() -> None:
            for reduce, box in zip(reducers, boxes):
                reduce(box.buf)
                box.done()

        return self._run("all_reduce_coalesced", run, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> AgentWork:
        t = _tensor(tensors, "reduce")
        reduce = self._reducer(t.dtype, _reduce_op(opts), "reduce")
        root = int(opts.rootRank)

        def run() -> None:
            buf = t.detach().clone(memory_format=torch.contiguous_format)
            reduce(buf)
            if self.agent.rank == root:
                t.copy_(buf)

        return self._run("reduce", run, tensors)

    # ------------------------------------------------------------------ reduce-scatter

    def _scatter_sum(self, output: torch.Tensor, inputs: torch.Tensor, op: Any, name: str) -> Callable[[], None]:
        """Reduce-scatter as the all-reduce of the whole input (through the switch), each rank keeping its part."""
        reduce = self._reducer(inputs.dtype, op, name)
        n, rank = self.agent.size, self.agent.rank
        if inputs.numel() != n * output.numel():
            raise ValueError(f"{name}: the input has {inputs.numel()} elements, need {n} x the output's {output.numel()}")

        def run() -> None:
            buf = inputs.detach().clone(memory_format=torch.contiguous_format).reshape(n, -1)
            reduce(buf)
            output.copy_(buf[rank].reshape(output.shape))

        return run

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> AgentWork:
        run = self._scatter_sum(_checked(output, "reduce_scatter_tensor"), _checked(input, "reduce_scatter_tensor"),
                                _reduce_op(opts), "reduce_scatter_tensor")
        return self._run("reduce_scatter_tensor", run, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> AgentWork:
        runs = [self._scatter_sum(o, i, _reduce_op(opts), "reduce_scatter_tensor") for o, i in zip(outputs, inputs)]

        def run() -> None:
            for one in runs:
                one()

        return self._run("reduce_scatter_tensor_coalesced", run, outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> AgentWork:
        out = _tensor(outputs, "reduce_scatter")
        if len(input_lists) != 1 or len(input_lists[0]) != self.agent.size:
            raise ValueError(f"reduce_scatter needs one list of {self.agent.size} input tensors")
        whole = torch.cat([_checked(t, "reduce_scatter").reshape(-1) for t in input_lists[0]])
        return self._run("reduce_scatter", self._scatter_sum(out, whole, _reduce_op(opts), "reduce_scatter"), outputs)

    # ------------------------------------------------------------------ bytes over the mesh

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> AgentWork:
        root = int(getattr(opts, "rootRank", 0))
        t = _checked(tensors[int(getattr(opts, "rootTensor", 0))], "broadcast")
        box = _Contiguous(t)

        def run() -> None:
            self.agent.broadcast(_raw(box.buf), root)
            box.done()

        return self._run("broadcast", run, tensors)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> AgentWork:
        t = _tensor(inputs, "all_gather")
        if len(output_lists) != 1 or len(output_lists[0]) != self.agent.size:
            raise ValueError(f"all_gather needs one list of {self.agent.size} output tensors")
        outs = [_checked(o, "all_gather") for o in output_lists[0]]
        if any(o.dtype != t.dtype for o in outs):
            raise ValueError(f"all_gather: the output tensors must have the input's dtype {t.dtype}")
        if outs[self.agent.rank].numel() != t.numel():
            raise ValueError(f"all_gather: output {self.agent.rank} has {outs[self.agent.rank].numel()} elements, "
                             f"the input {t.numel()}")
        boxes = [_Contiguous(o) for o in outs]
        src = t.contiguous()

        def run() -> None:
            self.agent.allgather_into(_raw(src), [_raw(b.buf) for b in boxes])
            for b in boxes:
                b.done()

        return self._run("all_gather", run, output_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> AgentWork:
        _checked(output, "all_gather_into_tensor")
        _checked(input, "all_gather_into_tensor")
        n = self.agent.size
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise ValueError(f"all_gather_into_tensor: the output must be {n} x the input's {input.numel()} elements "
                             f"of {input.dtype}, got {output.numel()} of {output.dtype}")
        box = _Contiguous(output)
        src = input.contiguous()

        def run() -> None:
            rows = _raw(box.buf).reshape(n, -1)
            self.agent.allgather_into(_raw(src), list(rows))
            box.done()

        return self._run("all_gather_into_tensor", run, [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> AgentWork:
        works = [(o, i) for o, i in zip(outputs, inputs)]
        n = self.agent.size
        for o, i in works:
            if o.numel() != n * i.numel() or o.dtype != i.dtype:
                raise ValueError("all_gather_into_tensor_coalesced: each output must be n x its input")
        boxes = [(_Contiguous(_checked(o, "all_gather")), _checked(i, "all_gather").contiguous()) for o, i in works]

        def run() -> None:
            for box, src in boxes:
                self.agent.allgather_into(_raw(src), list(_raw(box.buf).reshape(n, -1)))
                box.done()

        return self._run("all_gather_into_tensor_coalesced", run, outputs)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> AgentWork:
        t = _tensor(inputs, "gather").contiguous()
        root = int(opts.rootRank)
        boxes = None
        if self.agent.rank == root:
            if len(output_lists) != 1 or len(output_lists[0]) != self.agent.size:
                raise ValueError(f"gather needs one list of {self.agent.size} output tensors at the root")
            boxes = [_Contiguous(_checked(o, "gather")) for o in output_lists[0]]

        def run() -> None:
            self.agent.gather(_raw(t), None if boxes is None else [_raw(b.buf) for b in boxes], root)
            for b in boxes or ():
                b.done()

        return self._run("gather", run, output_lists)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> AgentWork:
        out = _Contiguous(_tensor(outputs, "scatter"))
        root = int(opts.rootRank)
        srcs = None
        if self.agent.rank == root:
            if len(input_lists) != 1 or len(input_lists[0]) != self.agent.size:
                raise ValueError(f"scatter needs one list of {self.agent.size} input tensors at the root")
            srcs = [_checked(i, "scatter").contiguous() for i in input_lists[0]]

        def run() -> None:
            self.agent.scatter(_raw(out.buf), None if srcs is None else [_raw(s) for s in srcs], root)
            out.done()

        return self._run("scatter", run, outputs)

    # ------------------------------------------------------------------ barrier, refusals, end

    def barrier(self, opts: Any = None) -> AgentWork:
        return self._run("barrier", self.agent.barrier, [])

    def _refuse(self, op: str) -> AgentWork:
        raise NotImplementedError(f"the ina backend has no {op} (it has all_reduce, broadcast, all_gather, "
                                  "all_gather_into_tensor, reduce_scatter_tensor, reduce, gather, scatter, barrier)")

    def send(self, *args: Any, **kwargs: Any) -> AgentWork:
        return self._refuse("send (point-to-point)")

    def recv(self, *args: Any, **kwargs: Any) -> AgentWork:
        return self._refuse("recv (point-to-point)")

    def recv_anysource(self, *args: Any, **kwargs: Any) -> AgentWork:
        return self._refuse("recv (point-to-point)")

    def alltoall(self, *args: Any, **kwargs: Any) -> AgentWork:
        return self._refuse("all_to_all")

    def alltoall_base(self, *args: Any, **kwargs: Any) -> AgentWork:
        return self._refuse("all_to_all_single")

    def allgather_coalesced(self, *args: Any, **kwargs: Any) -> AgentWork:
        return self._refuse("all_gather_coalesced")

    def shutdown(self) -> None:
        """``destroy_process_group``: the queued collectives run, then the agent leaves the job (the first rank
        releases it; after a failure nobody waits for anybody) and its threads end."""
        self._close(barrier=self._failed is None and self._queue.failed is None)

    def abort(self) -> None:
        """Leave at once: no rank is waited for."""
        self.agent.mesh.abort()
        self._close(barrier=False)

    def _close(self, barrier: bool) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        try:
            self.agent.close(barrier=barrier)
        finally:
            self._queue.close()


_LIVE: weakref.WeakSet[InaProcessGroup] = weakref.WeakSet()  # groups not shut down yet


@atexit.register
def _abort_live_groups() -> None:
    """A script that exits without ``destroy_process_group`` (after an error, typically) still ends its agents'
    threads while the interpreter is whole: torch's C++ side aborts the process (exit -6, hiding the script's own
    exit code) if they are cut off during finalisation."""
    for group in list(_LIVE):
        try:
            group.abort()
        except Exception:  # noqa: BLE001 (leaving anyway)
            log.warning("rank %d: the ina process group did not close cleanly at exit", group.rank())


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> InaProcessGroup:
    """The creator ``dist.init_process_group("ina")`` and ``dist.new_group(backend="ina")`` call."""
    return InaProcessGroup.join(store, rank, size, timeout, controller=os.environ.get(CONTROLLER_ENV) or None)


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
