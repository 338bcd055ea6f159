"""The mesh: a TCP link between every two workers of a job, for the collectives that are not the stream's sums.

The job's chunk stream adds int32 (through the switch or a ring). Broadcast, the gathers, scatter and the sums the
switch cannot make (float64, int64; MIN, MAX, PRODUCT and bitwise ops of any dtype) need bytes to go from one worker
to others: ``Mesh`` keeps one TCP connection to every other worker of the job, on the same address as the ring's
(its connections reach this worker through its acceptor, ``host_agent.acceptor``, by their hello ``MSH1``), and
runs each collective as one or two **exchanges**: every worker sends its messages to some peers and receives its
messages from some peers, all at once over non-blocking sockets. On a star of full-duplex links this is as few
bytes per link as a ring moves: an all-gather sends and receives ``(n-1)/n`` of the result per worker.

- ``allgather``: every worker's buffer to every other (uneven sizes allowed: each receiver knows its own).
- ``broadcast``: below ``SMALL_BROADCAST`` bytes, or with two workers, the root sends the whole buffer to each;
  above it, scatter then all-gather (van de Geijn): the root sends piece ``p`` and its own piece to worker ``p``,
  then the other workers exchange their pieces, so the root's link carries ``2(n-1)/n`` of the buffer instead of
  ``n-1`` times it.
- ``allreduce``: reduce-scatter then all-gather: worker ``p`` receives chunk ``p`` of every worker and reduces it
  in rank order (``((x_0 op x_1) op x_2) ...``), then the reduced chunks go to every worker. Each chunk is reduced
  once, by its owner: every worker gets the same bits; integer sums are exact (wrapping as numpy's), float sums
  are rounded in rank order, deterministically.
- ``gather`` and ``scatter``: to and from one root.

Every message carries the exchange's number and its length; a worker that receives another number or length
than it expects (workers whose calls differ) fails with ``MeshError`` instead of mixing data. No progress for
``timeout`` seconds fails with ``MeshTimeout`` naming the peer. A failure breaks the mesh for good (its
connections are shut down, so the peers fail at once too).

The mesh does not follow the job's generations: its links join workers' addresses, which a grant never changes,
and a mesh collective holds no chunk of the stream, so a worker waiting in one leaves the stream free for its
idle service to resynchronise (``host_agent.agent``).
"""
from __future__ import annotations

import itertools
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from enum import Enum

import numpy as np

from host_agent.acceptor import Inbox, recv_exact
from host_agent.errors import AgentError, AgentTimeout
from host_agent.ring_pieces import chunk_bounds

__all__ = ["HELLO_MAGIC", "SMALL_BROADCAST", "Mesh", "MeshError", "MeshOp", "MeshTimeout"]

HELLO_MAGIC = b"MSH1"
_HELLO = struct.Struct("!4sIII")  # magic, rank, size, job id (the connector's, then the acceptor's answer)
_FRAME = struct.Struct("!4sQQ")  # magic, exchange number, payload bytes
_FRAME_MAGIC = b"MSHf"
_SENDMSG_BUFFERS = 64
SMALL_BROADCAST = 64 * 1024  # bytes: a broadcast up to this size goes from the root to each worker directly


class MeshError(AgentError):
    """A mesh collective failed; ``peer`` is the rank involved, if one is."""

    def __init__(self, message: str, *, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class MeshTimeout(MeshError, AgentTimeout):
    """A peer made no progress within the mesh's timeout."""


class MeshOp(Enum):
    """How ``Mesh.allreduce`` combines the workers' values (numpy's ufuncs, applied in rank order)."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    @property
    def ufunc(self) -> np.ufunc:
        return {
            MeshOp.SUM: np.add, MeshOp.PRODUCT: np.multiply, MeshOp.MIN: np.minimum, MeshOp.MAX: np.maximum,
            MeshOp.BAND: np.bitwise_and, MeshOp.BOR: np.bitwise_or, MeshOp.BXOR: np.bitwise_xor,
        }[self]


def _bytes(array: np.ndarray) -> memoryview:
    """The array's memory as bytes (C-contiguous arrays only: the caller's buffers are read or filled in place)."""
    if not array.flags.c_contiguous:
        raise ValueError("mesh buffers must be C-contiguous")
    return memoryview(array.reshape(-1)).cast("B")


class _Incoming:
    """What one peer still owes this worker in the current exchange: a queue of buffers, each behind a header."""

    def __init__(self, views: Sequence[memoryview]) -> None:
        self.views = deque(views)
        self.header = bytearray(_FRAME.size)
        self.header_got = 0
        self.got = 0  # bytes of views[0] received

    @property
    def done(self) -> bool:
        return not self.views


class Mesh:
    """This worker's TCP links to every other worker of the job, and the collectives over them.

    Args:
        rank: this worker's position in ``addresses``.
        addresses: every worker's (ip, port), in rank order (each worker's ring address).
        inbox: the mesh connections of this worker's acceptor (``Acceptor.inbox(HELLO_MAGIC)``).
        job_id: checked in every hello, so links of another job are refused.
        timeout: seconds without progress before a collective fails (``MeshTimeout``).
        connect_timeout: seconds to connect to every peer (on the first collective).

    Collectives are called by one thread at a time, in the same order with the same sizes on every worker;
    ``abort`` may come from any thread.
    """

    def __init__(self, rank: int, addresses: Sequence[tuple[str, int]], inbox: Inbox, *, job_id: int,
                 timeout: float = 60.0, connect_timeout: float = 30.0) -> None:
        self.size = len(addresses)
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} out of range for {self.size} workers")
        self.rank, self.addresses, self.inbox = rank, [tuple(a) for a in addresses], inbox
        self.job_id, self.timeout, self.connect_timeout = job_id, timeout, connect_timeout
        self._links: dict[int, socket.socket] = {}
        self._sel: selectors.BaseSelector | None = None
        self._exchanges = 0
        self._broken: BaseException | None = None
        self._lock = threading.Lock()  # the links, between a collective and abort/close

    # ------------------------------------------------------------------ links

    @property
    def connected(self) -> bool:
        return self._sel is not None

    def connect(self) -> None:
        """Connect to every peer (the first collective does): to the higher ranks, then from the lower ones."""
        if self._sel is not None or self.size == 1:
            return
        if self._broken is not None:
            raise MeshError(f"rank {self.rank}: the mesh is broken by an earlier failure: {self._broken}")
        deadline = time.monotonic() + self.connect_timeout
        try:
            for peer in range(self.rank + 1, self.size):
                self._dial(peer, deadline)
            self.inbox.clear_interrupt()
            while len([p for p in self._links if p < self.rank]) < self.rank:
                self._answer(deadline)
            for peer in range(self.rank + 1, self.size):
                self._await_ack(peer, deadline)
        except BaseException as exc:
            self._fail(exc)
            if isinstance(exc, MeshError):
                raise
            raise MeshError(f"rank {self.rank}: connecting the mesh failed: {exc}") from exc
        sel = selectors.DefaultSelector()
        for sock in self._links.values():
            sock.setblocking(False)
        with self._lock:
            self._sel = sel

    def _peer(self, peer: int) -> str:
        host, port = self.addresses[peer]
        return f"rank {peer} at {host}:{port}"

    def _dial(self, peer: int, deadline: float) -> None:
        delay, last = 0.01, None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeshTimeout(f"rank {self.rank}: could not connect to {self._peer(peer)} within "
                                  f"{self.connect_timeout}s: {last}", peer=peer)
            try:
                sock = socket.create_connection(self.addresses[peer], timeout=min(left, 1.0))
                break
            except OSError as exc:  # refused until the peer listens: retry
                last = exc
                time.sleep(min(delay, max(left, 0)))
                delay = min(2 * delay, 0.2)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._links[peer] = sock
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(_HELLO.pack(HELLO_MAGIC, self.rank, self.size, self.job_id))

    def _answer(self, deadline: float) -> None:
        """Take one connection from a lower rank: check its hello, answer with this worker's."""
        self.inbox.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            conn, _ = self.inbox.accept()
        except TimeoutError:
            missing = [p for p in range(self.rank) if p not in self._links]
            raise MeshTimeout(f"rank {self.rank}: {', '.join(self._peer(p) for p in missing)} did not connect within "
                              f"{self.connect_timeout}s", peer=missing[0]) from None
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            magic, rank, size, job = _HELLO.unpack(recv_exact(conn, _HELLO.size))
            if magic != HELLO_MAGIC or not 0 <= rank < self.rank or size != self.size or job != self.job_id \
                    or rank in self._links:
                raise ValueError(f"hello of rank {rank} of {size} in job {job}, expected a rank below {self.rank} "
                                 f"of {self.size} in job {self.job_id}")
            conn.sendall(_HELLO.pack(HELLO_MAGIC, self.rank, self.size, self.job_id))
        except (OSError, ValueError, struct.error):
            conn.close()  # a stale or foreign connection: wait for the right one
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._links[rank] = conn

    def _await_ack(self, peer: int, deadline: float) -> None:
        sock = self._links[peer]
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            magic, rank, size, job = _HELLO.unpack(recv_exact(sock, _HELLO.size))
        except TimeoutError:
            raise MeshTimeout(f"rank {self.rank}: {self._peer(peer)} did not answer within {self.connect_timeout}s",
                              peer=peer) from None
        except (OSError, struct.error) as exc:
            raise MeshError(f"rank {self.rank}: no answer from {self._peer(peer)}: {exc}", peer=peer) from exc
        if magic != HELLO_MAGIC or rank != peer or size != self.size or job != self.job_id:
            raise MeshError(f"rank {self.rank}: {self._peer(peer)} answered as rank {rank} of {size} in job {job}",
                            peer=peer)

    def _fail(self, exc: BaseException) -> None:
        self._broken = exc
        self.abort()

    def abort(self) -> None:
        """Make the collective in progress (any thread) and every later one fail; the peers' fail too."""
        with self._lock:
            links = list(self._links.values())
        for sock in links:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._broken is None:
            self._broken = MeshError("the mesh was aborted")
        self.inbox.interrupt()

    def close(self) -> None:
        with self._lock:
            links, self._links = list(self._links.values()), {}
            sel, self._sel = self._sel, None
        for sock in links:
            sock.close()
        if sel is not None:
            sel.close()
        if self._broken is None:
            self._broken = MeshError("the mesh is closed")

    # ------------------------------------------------------------------ exchanges

    def exchange(self, sends: Mapping[int, Sequence[np.ndarray]], recvs: Mapping[int, Sequence[np.ndarray]]) -> None:
        """Send each peer its arrays and fill the arrays each peer sends, all at once (one exchange).

        Every worker must call the same exchanges in the same order; the arrays a worker expects from a peer must
        have the sizes that peer sends (else ``MeshError``, naming both)."""
        if self._broken is not None:
            raise MeshError(f"rank {self.rank}: the mesh is broken by an earlier failure: {self._broken}")
        number = self._exchanges
        self._exchanges += 1
        if self.size == 1:
            return
        if self.rank in sends or self.rank in recvs:
            raise ValueError("a worker exchanges with its peers, not with itself")
        self.connect()
        # an empty array is its header alone: an empty view in the queue would never be taken by sendmsg
        outgoing = {p: deque(v for a in arrays for v in (_FRAME.pack(_FRAME_MAGIC, number, a.nbytes), _bytes(a)) if len(v))
                    for p, arrays in sends.items() if arrays}
        incoming = {p: _Incoming([_bytes(a) for a in arrays]) for p, arrays in recvs.items() if arrays}
        try:
            self._run(number, outgoing, incoming)
        except BaseException as exc:
            self._fail(exc)
            raise

    def _run(self, number: int, outgoing: dict[int, deque], incoming: dict[int, _Incoming]) -> None:
        sel = self._sel
        assert sel is not None
        registered: dict[int, int] = {}
        try:
            last = time.monotonic()
            while outgoing or incoming:
                for p in set(outgoing) | set(incoming) | set(registered):
                    mask = (selectors.EVENT_WRITE if p in outgoing else 0) | (selectors.EVENT_READ if p in incoming else 0)
                    if registered.get(p) != mask:
                        if p in registered and mask:
                            sel.modify(self._links[p], mask, p)
                        elif p in registered:
                            sel.unregister(self._links[p])
                        else:
                            sel.register(self._links[p], mask, p)
                        if mask:
                            registered[p] = mask
                        else:
                            del registered[p]
                events = sel.select(max(last + self.timeout - time.monotonic(), 0))
                if not events and time.monotonic() - last >= self.timeout:
                    self._stalled(number, outgoing, incoming)
                for key, ev in events:
                    p = key.data
                    if ev & selectors.EVENT_WRITE and p in outgoing and self._send(p, outgoing[p]):
                        del outgoing[p]
                    if ev & selectors.EVENT_READ and p in incoming and self._receive(p, number, incoming[p]):
                        del incoming[p]
                    last = time.monotonic()
        finally:
            for p in registered:
                try:
                    sel.unregister(self._links[p])
                except (KeyError, ValueError):
                    pass

    def _stalled(self, number: int, outgoing: dict[int, deque], incoming: dict[int, _Incoming]) -> None:
        if incoming:
            p = min(incoming)
            raise MeshTimeout(f"rank {self.rank}: no data from {self._peer(p)} for {self.timeout}s (exchange {number})",
                              peer=p)
        p = min(outgoing)
        raise MeshTimeout(f"rank {self.rank}: {self._peer(p)} read nothing for {self.timeout}s (exchange {number})",
                          peer=p)

    def _send(self, p: int, queue: deque) -> bool:
        """Hand the kernel what it takes; True once everything for ``p`` left."""
        try:
            sent = self._links[p].sendmsg(list(itertools.islice(queue, _SENDMSG_BUFFERS)))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise MeshError(f"rank {self.rank}: sending to {self._peer(p)} failed: {exc}", peer=p) from exc
        while sent:
            head = queue[0]
            if len(head) <= sent:
                sent -= len(head)
                queue.popleft()
            else:
                queue[0] = memoryview(head)[sent:]
                sent = 0
        return not queue

    def _receive(self, p: int, number: int, inc: _Incoming) -> bool:
        """Take what ``p`` sent; True once everything expected from ``p`` arrived."""
        sock = self._links[p]
        while not inc.done:
            if inc.header_got < _FRAME.size:
                target = memoryview(inc.header)[inc.header_got:]
            else:
                target = inc.views[0][inc.got:]
            try:
                got = sock.recv_into(target) if len(target) else 0
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                raise MeshError(f"rank {self.rank}: receiving from {self._peer(p)} failed: {exc}", peer=p) from exc
            if len(target) and got == 0:
                raise MeshError(f"rank {self.rank}: {self._peer(p)} closed the connection", peer=p)
            if inc.header_got < _FRAME.size:
                inc.header_got += got
                if inc.header_got == _FRAME.size:
                    self._check_header(p, number, inc)
            else:
                inc.got += got
            if inc.header_got == _FRAME.size and inc.got == len(inc.views[0]):
                inc.views.popleft()
                inc.header_got = inc.got = 0
        return True

    def _check_header(self, p: int, number: int, inc: _Incoming) -> None:
        magic, got_number, nbytes = _FRAME.unpack(inc.header)
        want = len(inc.views[0])
        if magic != _FRAME_MAGIC:
            raise MeshError(f"rank {self.rank}: {self._peer(p)} sent garbage ({magic!r})", peer=p)
        if got_number != number or nbytes != want:
            raise MeshError(f"rank {self.rank}: {self._peer(p)} sent {nbytes} bytes in its exchange {got_number}, "
                            f"expected {want} bytes in exchange {number} (the workers' calls differ)", peer=p)

    # ------------------------------------------------------------------ collectives

    def _others(self) -> list[int]:
        return [p for p in range(self.size) if p != self.rank]

    def allgather(self, mine: np.ndarray, outputs: Sequence[np.ndarray]) -> None:
        """``outputs[p]`` = worker p's ``mine`` (bytes as they are; ``outputs[rank]`` gets a copy of ``mine``)."""
        if len(outputs) != self.size:
            raise ValueError(f"need {self.size} outputs, got {len(outputs)}")
        mine = np.ascontiguousarray(mine)
        self.exchange({p: [mine] for p in self._others()}, {p: [outputs[p]] for p in self._others()})
        _bytes(outputs[self.rank])[:] = _bytes(mine)

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """The root's ``buf`` into every worker's ``buf`` (same size everywhere)."""
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} out of range for {self.size} workers")
        data = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)  # the buffer's own memory where it is contiguous
        if data.nbytes <= SMALL_BROADCAST or self.size <= 2:
            if self.rank == root:
                self.exchange({p: [data] for p in self._others()}, {})
            else:
                self.exchange({}, {root: [data]})
        else:
            self._scatter_allgather(data, root)
        if not np.shares_memory(data, buf):
            buf[...] = data.view(buf.dtype).reshape(buf.shape)

    def _scatter_allgather(self, data: np.ndarray, root: int) -> None:
        bounds = chunk_bounds(data.size, self.size)
        piece = [data[bounds[i]:bounds[i + 1]] for i in range(self.size)]
        others = [p for p in self._others() if p != root]
        if self.rank == root:
            self.exchange({p: [piece[p], piece[root]] for p in self._others()}, {})
            self.exchange({}, {})
            return
        self.exchange({}, {root: [piece[self.rank], piece[root]]})
        self.exchange({p: [piece[self.rank]] for p in others}, {p: [piece[p]] for p in others})

    def allreduce(self, array: np.ndarray, op: MeshOp = MeshOp.SUM) -> np.ndarray:
        """``op`` over every worker's ``array`` (same shape and dtype everywhere): reduce-scatter, then all-gather;
        each chunk reduced by its owner in rank order, so every worker gets the same bits."""
        arr = np.asarray(array)
        flat = np.ascontiguousarray(arr).reshape(-1)
        bounds = chunk_bounds(flat.size, self.size)
        chunk = [flat[bounds[p]:bounds[p + 1]] for p in range(self.size)]
        mine = slice(bounds[self.rank], bounds[self.rank + 1])
        rows = [np.empty(mine.stop - mine.start, dtype=flat.dtype) for _ in range(self.size)]
        rows[self.rank] = chunk[self.rank]
        self.exchange({p: [chunk[p]] for p in self._others()}, {p: [rows[p]] for p in self._others()})
        acc = rows[0].copy()
        for row in rows[1:]:
            op.ufunc(acc, row, out=acc)
        out = np.empty_like(flat)
        out[mine] = acc
        self.exchange({p: [acc] for p in self._others()}, {p: [out[bounds[p]:bounds[p + 1]]] for p in self._others()})
        return out.reshape(arr.shape)

    def gather(self, mine: np.ndarray, outputs: Sequence[np.ndarray] | None, root: int) -> None:
        """At the root, ``outputs[p]`` = worker p's ``mine``; the other workers pass ``outputs=None``."""
        mine = np.ascontiguousarray(mine)
        if self.rank != root:
            self.exchange({root: [mine]}, {})
            return
        if outputs is None or len(outputs) != self.size:
            raise ValueError(f"the root needs {self.size} outputs")
        self.exchange({}, {p: [outputs[p]] for p in self._others()})
        _bytes(outputs[root])[:] = _bytes(mine)

    def scatter(self, output: np.ndarray, inputs: Sequence[np.ndarray] | None, root: int) -> None:
        """Worker p's ``output`` = the root's ``inputs[p]``; the other workers pass ``inputs=None``."""
        if self.rank != root:
            self.exchange({}, {root: [output]})
            return
        if inputs is None or len(inputs) != self.size:
            raise ValueError(f"the root needs {self.size} inputs")
        self.exchange({p: [np.ascontiguousarray(inputs[p])] for p in self._others()}, {})
        _bytes(output)[:] = _bytes(np.ascontiguousarray(inputs[root]))
