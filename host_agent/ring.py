"""Ring all-reduce over TCP: the fallback when the switch has no aggregator slots for a job.

Bandwidth-optimal ring (Patarasuk and Yuan): the array is cut into n chunks; n-1 reduce-scatter
steps leave worker r with the full sum of chunk (r+1) % n, and n-1 all-gather steps pass the sums
round. Each step every worker sends one chunk to its right neighbour (r+1) % n while receiving
one from its left neighbour (r-1) % n.

Steps are pipelined (as NCCL's and Gloo's rings are): each chunk is cut into pieces
(``piece_bounds``), and piece j of step s+1 leaves as soon as piece j of step s has arrived (and,
in the reduce-scatter, been added), instead of after the whole of step s. Without it every step
waits for its last byte to cross the path (store and forward at every hop) and the links idle
between steps: 1.1-1.3x the framed wire time on experiment 1's links. Pieces are local to a member
(they only decide when it adds and sends on); the bytes on the wire are the same.

The algorithm (``ring_allreduce``) only needs a ``RingLink``: "run these steps, piece j of each
step sent once piece j of the step before arrived". ``TcpRingLink`` is the real one;
``QueueRingLink`` runs a ring of threads without sockets. See docs/agent.md, "Ring".
"""
from __future__ import annotations

import itertools
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, Self, TypeVar

import numpy as np

from host_agent.acceptor import Inbox, recv_exact
from host_agent.ring_pieces import (
    MAX_PIECES,
    PIECE_BYTES,
    PieceStream,
    RingStep,
    chunk_bounds,
    frame_mismatch,
    piece_bounds,
    step_tag,
)

__all__ = [
    "HELLO_MAGIC",
    "MAX_PIECES",
    "PIECE_BYTES",
    "QueueRingLink",
    "RingAllReduce",
    "RingError",
    "RingLink",
    "RingStep",
    "RingTimeoutError",
    "TcpRingLink",
    "chunk_bounds",
    "local_queue_links",
    "piece_bounds",
    "ring_allreduce",
    "ring_time_model",
    "run_local_ring",
]

T = TypeVar("T")

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))

# Connection hello (connector -> acceptor) and its ack: magic, rank, ring size.
_HELLO = struct.Struct("!4sII")
HELLO_MAGIC = b"RNG1"  # its first four bytes tell a worker's acceptor (host_agent.acceptor) the connection is a ring's
_SENDMSG_BUFFERS = 64  # buffers handed to one sendmsg (IOV_MAX is 1024)


class RingError(RuntimeError):
    """A ring operation failed; ``peer_rank``/``peer_addr`` name the neighbour involved, if any."""

    def __init__(self, message: str, *, peer_rank: int | None = None, peer_addr: tuple[str, int] | None = None):
        super().__init__(message)
        self.peer_rank = peer_rank
        self.peer_addr = peer_addr


class RingTimeoutError(RingError, TimeoutError):
    """A neighbour made no progress within the timeout."""


# --------------------------------------------------------------------------- algorithm


class RingLink(Protocol):
    """Transport of one ring member: its rank, the ring size, and the pipelined steps of one op."""

    rank: int
    size: int

    def run(self, steps: Sequence[RingStep]) -> None:
        """Run ``steps`` in order, pipelined by pieces (``piece_bounds`` of each step's arrays).

        Piece j of step s's ``send`` may leave only once piece j of step s-1's ``recv`` has arrived
        and been added into its ``reduce``: the ring's step s+1 sends what step s received (so
        ``steps[s].send`` has ``steps[s-1].recv``'s size). Step 0's pieces may all leave at once.
        """
        ...

    def abort(self) -> None:
        """Make a ``run`` blocked in another thread (and every later one) fail at once (any thread)."""
        ...

    def close(self) -> None: ...


def _checked(array: np.ndarray) -> np.ndarray:
    arr = np.asarray(array)
    if arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"ring all-reduce supports {', '.join(str(d) for d in SUPPORTED_DTYPES)} (native byte order), got {arr.dtype}")
    return arr


def ring_allreduce(array: np.ndarray, link: RingLink, *, call: int = 0) -> np.ndarray:
    """Element-wise sum of ``array`` over the ring; every member gets the same bits.

    Chunk c is summed in ring order starting at its owner: ((x_c + x_{c+1}) + x_{c+2}) + ... over
    ranks mod n, in the array's dtype (int overflow wraps modulo 2**bits, as numpy does); the
    all-gather then copies that one result to every member, so float results are bit-identical
    everywhere. ``array`` is not modified; the result has its shape. ``call`` numbers the call in
    the tags so a member that skipped a call is detected rather than mixed in.

    The reduce-scatter receives into one scratch chunk, reused by every step: the link completes
    pieces in stream order and adds each one before the next arrives. The all-gather receives
    chunk (r-s) where the reduce-scatter's step s sent it from: its sum cannot arrive before this
    member's part of it left.
    """
    arr = _checked(array)
    acc, steps = _op_steps(arr, link.rank, link.size, call)
    if steps:
        link.run(steps)
    return acc.reshape(arr.shape)


def _op_steps(arr: np.ndarray, r: int, n: int, call: int) -> tuple[np.ndarray, list[RingStep]]:
    """The accumulator (a flat copy of ``arr``, the result once the steps ran) and one op's 2(n-1) steps."""
    acc = np.array(arr, order="C", copy=True).reshape(-1)
    if n == 1:
        return acc, []
    bounds = chunk_bounds(acc.size, n)
    chunks = [acc[bounds[c] : bounds[c + 1]] for c in range(n)]
    scratch = np.empty(bounds[1] - bounds[0], dtype=acc.dtype)

    def tag(step: int) -> bytes:
        return step_tag(call, step, acc.dtype, acc.size)

    steps = []
    for s in range(n - 1):  # reduce-scatter: chunk (r-s-1) += what the left neighbour sends
        mine = chunks[(r - s - 1) % n]
        steps.append(RingStep(chunks[(r - s) % n], scratch[: mine.size], mine, tag(s)))
    for s in range(n - 1):  # all-gather: the sums go round
        steps.append(RingStep(chunks[(r + 1 - s) % n], chunks[(r - s) % n], None, tag(n - 1 + s)))
    return acc, steps


def ring_time_model(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` among ``n`` workers (alpha-beta model).

    2(n-1)/n * nbytes/bandwidth + 2(n-1)*latency: each of the 2(n-1) steps moves nbytes/n per link
    and pays one latency. ``bandwidth`` in bytes/s per link, ``latency`` in seconds per step.
    """
    if n < 1 or nbytes < 0 or bandwidth <= 0 or latency < 0:
        raise ValueError(f"need n >= 1, nbytes >= 0, bandwidth > 0, latency >= 0; got {n}, {nbytes}, {bandwidth}, {latency}")
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


# --------------------------------------------------------------------------- TCP transport


class TcpRingLink:
    """One ring member's two TCP connections: to the right neighbour (connected) and from the left (accepted).

    Set-up retries the connection until ``connect_timeout`` (peers start at different times) and
    checks a hello naming rank and ring size on both connections. Each op sends and receives
    concurrently with non-blocking sockets, so chunks larger than the TCP buffers cannot deadlock;
    no progress for ``timeout`` seconds raises RingTimeoutError naming the stalled neighbour.
    ``piece_bytes`` sizes the pieces steps are pipelined by (``piece_bounds``; local to this member).
    The link takes ownership of ``listen``: a bound socket, a port, or the ring's ``Inbox`` of the worker's
    acceptor (``host_agent.acceptor``, which gives it the connections whose hello is a ring's).
    """

    def __init__(
        self,
        rank: int,
        peers: Sequence[tuple[str, int]],
        listen: socket.socket | Inbox | int | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 60.0,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        self.size = len(peers)
        if self.size < 1 or not 0 <= rank < self.size:
            if not isinstance(listen, int | None):
                listen.close()
            raise ValueError(f"rank {rank} out of range for {self.size} peers")
        self.rank = rank
        self.peers = tuple((str(h), int(p)) for h, p in peers)
        self.timeout = timeout
        self.piece_bytes = piece_bytes
        self.right_rank = (rank + 1) % self.size
        self.left_rank = (rank - 1) % self.size
        self._right: socket.socket | None = None
        self._left: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        listener = self._make_listener(listen)
        try:
            if self.size > 1:
                self._connect(listener, time.monotonic() + connect_timeout, connect_timeout)
                self._selector = selectors.DefaultSelector()
        except BaseException:
            self.close()
            raise
        finally:
            if listener is not None:
                listener.close()

    def _make_listener(self, listen: socket.socket | Inbox | int | None) -> socket.socket | Inbox | None:
        if not isinstance(listen, int | None):
            if self.size == 1:
                listen.close()
                return None
            listen.listen()
            return listen
        if self.size == 1:
            return None
        host, port = self.peers[self.rank]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port if listen is None else listen))
            sock.listen()
        except BaseException:
            sock.close()
            raise
        return sock

    def _peer(self, rank: int) -> str:
        host, port = self.peers[rank]
        return f"rank {rank} at {host}:{port}"

    def _connect(self, listener: socket.socket | Inbox, deadline: float, connect_timeout: float) -> None:
        # Connect right and send the hello first: that completes against the peer's listen backlog
        # without it calling accept, so no worker waits on another in a cycle.
        right_addr = self.peers[self.right_rank]
        delay, last_error = 0.01, None
        while self._right is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RingTimeoutError(
                    f"rank {self.rank}: could not connect to {self._peer(self.right_rank)} within {connect_timeout}s: {last_error}",
                    peer_rank=self.right_rank, peer_addr=right_addr,
                )
            try:
                self._right = socket.create_connection(right_addr, timeout=min(remaining, 1.0))
            except OSError as exc:  # refused or unreachable until the peer is up: retry
                last_error = exc
                time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
                delay = min(delay * 2, 0.2)
        self._right.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._right.settimeout(max(deadline - time.monotonic(), 0.001))
            self._right.sendall(_HELLO.pack(HELLO_MAGIC, self.rank, self.size))
        except OSError as exc:
            raise RingError(f"rank {self.rank}: hello to {self._peer(self.right_rank)} failed: {exc}",
                            peer_rank=self.right_rank, peer_addr=right_addr) from exc

        rejected: list[str] = []
        while self._left is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RingTimeoutError(
                    f"rank {self.rank}: {self._peer(self.left_rank)} did not connect within {connect_timeout}s"
                    + (f" (rejected: {'; '.join(rejected)})" if rejected else ""),
                    peer_rank=self.left_rank, peer_addr=self.peers[self.left_rank],
                )
            listener.settimeout(remaining)
            try:
                conn, addr = listener.accept()
            except TimeoutError:
                continue
            try:
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                magic, rank, size = _HELLO.unpack(recv_exact(conn, _HELLO.size))
                if magic != HELLO_MAGIC or rank != self.left_rank or size != self.size:
                    raise ValueError(f"hello {magic!r} rank {rank} size {size}, expected rank {self.left_rank} size {self.size}")
                conn.sendall(_HELLO.pack(HELLO_MAGIC, self.rank, self.size))
            except (OSError, ValueError, struct.error) as exc:
                rejected.append(f"{addr[0]}:{addr[1]}: {exc}")
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._left = conn

        try:
            magic, rank, size = _HELLO.unpack(recv_exact(self._right, _HELLO.size))
        except (OSError, struct.error) as exc:
            raise RingError(f"rank {self.rank}: no hello ack from {self._peer(self.right_rank)}: {exc}",
                            peer_rank=self.right_rank, peer_addr=right_addr) from exc
        if magic != HELLO_MAGIC or rank != self.right_rank or size != self.size:
            raise RingError(
                f"rank {self.rank}: {right_addr[0]}:{right_addr[1]} answered as rank {rank} of {size}, "
                f"expected rank {self.right_rank} of {self.size}", peer_rank=self.right_rank, peer_addr=right_addr)
        self._right.setblocking(False)
        self._left.setblocking(False)

    def run(self, steps: Sequence[RingStep]) -> None:
        """The steps over the two connections, pipelined by pieces (see ``RingLink.run``).

        One stream each way: per step a header (magic, tag, length) and the chunk's bytes. Sends are
        queued as their pieces become ready and handed to the kernel as the socket takes them;
        received pieces are added (reduce-scatter) and release the next step's piece at once.
        """
        right, left, sel = self._right, self._left, self._selector
        if right is None or left is None or sel is None:
            raise RingError(f"rank {self.rank}: ring link is closed")
        stream = PieceStream(steps, self.piece_bytes)
        interest: dict[socket.socket, int] = {}

        def want(sock: socket.socket, flag: int, on: bool) -> None:
            if on and sock not in interest:
                sel.register(sock, flag)
                interest[sock] = flag
            elif not on and sock in interest:
                sel.unregister(sock)
                del interest[sock]

        try:
            last_progress = time.monotonic()
            while not stream.finished:
                want(right, selectors.EVENT_WRITE, bool(stream.pending))
                want(left, selectors.EVENT_READ, stream.receiving)
                if not interest:
                    raise RingError(f"rank {self.rank}: ring steps stalled: nothing to send or receive")
                events = sel.select(timeout=max(last_progress + self.timeout - time.monotonic(), 0))
                if not events:
                    if time.monotonic() - last_progress < self.timeout:
                        continue
                    if stream.receiving:
                        raise RingTimeoutError(
                            f"rank {self.rank}: no data from {self._peer(self.left_rank)} for {self.timeout}s",
                            peer_rank=self.left_rank, peer_addr=self.peers[self.left_rank])
                    raise RingTimeoutError(
                        f"rank {self.rank}: {self._peer(self.right_rank)} read nothing for {self.timeout}s",
                        peer_rank=self.right_rank, peer_addr=self.peers[self.right_rank])
                for key, _ in events:
                    if key.fileobj is right:
                        try:
                            sent = right.sendmsg(list(itertools.islice(stream.pending, _SENDMSG_BUFFERS)))
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError as exc:
                            raise RingError(f"rank {self.rank}: sending to {self._peer(self.right_rank)} failed: {exc}",
                                            peer_rank=self.right_rank, peer_addr=self.peers[self.right_rank]) from exc
                        stream.sent(sent)
                    else:
                        try:
                            got = left.recv_into(stream.receive_buffer)
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError as exc:
                            raise RingError(f"rank {self.rank}: receiving from {self._peer(self.left_rank)} failed: {exc}",
                                            peer_rank=self.left_rank, peer_addr=self.peers[self.left_rank]) from exc
                        if got == 0:
                            raise RingError(f"rank {self.rank}: {self._peer(self.left_rank)} closed the connection",
                                            peer_rank=self.left_rank, peer_addr=self.peers[self.left_rank])
                        header = stream.received(got)
                        if header is not None:
                            self._check_frame(*header)
                    last_progress = time.monotonic()
        finally:
            for sock in list(interest):
                sel.unregister(sock)

    def _check_frame(self, header: bytes, tag: bytes, nbytes: int) -> None:
        """A step's header against the step this member expects next."""
        why = frame_mismatch(header, tag, nbytes)
        if why is not None:
            raise RingError(f"rank {self.rank}: {self._peer(self.left_rank)} {why}",
                            peer_rank=self.left_rank, peer_addr=self.peers[self.left_rank])

    def abort(self) -> None:
        """Make a ``run`` blocked in another thread (and every later one) fail at once.

        Shuts both connections down without closing them, so the neighbours' ops fail too;
        ``close`` still releases the sockets. Safe to call from any thread, more than once.
        """
        for sock in (self._right, self._left):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        for sock in (self._right, self._left):
            if sock is not None:
                sock.close()
        if self._selector is not None:
            self._selector.close()
        self._right = self._left = self._selector = None


# --------------------------------------------------------------------------- in-process transport


class QueueRingLink:
    """A ring member whose neighbours are threads of the same process: tests and simulations.

    The same piece streams as ``TcpRingLink``, carried as byte messages through queues.
    """

    def __init__(self, rank: int, inboxes: Sequence[queue.Queue], timeout: float = 10.0,
                 piece_bytes: int = PIECE_BYTES) -> None:
        self.rank, self.size, self.timeout, self.piece_bytes = rank, len(inboxes), timeout, piece_bytes
        self._inboxes = inboxes
        self._closed = False

    def run(self, steps: Sequence[RingStep]) -> None:
        if self._closed:
            raise RingError(f"rank {self.rank}: ring link is closed")
        left = (self.rank - 1) % self.size
        stream = PieceStream(steps, self.piece_bytes)
        while not stream.finished:
            if stream.pending:
                data = b"".join(bytes(b) for b in stream.pending)
                self._inboxes[(self.rank + 1) % self.size].put(data)
                stream.sent(len(data))
                continue
            if not stream.receiving:
                raise RingError(f"rank {self.rank}: ring steps stalled: nothing to send or receive")
            try:
                data = self._inboxes[self.rank].get(timeout=self.timeout)
            except queue.Empty:
                raise RingTimeoutError(f"rank {self.rank}: no data from rank {left} for {self.timeout}s", peer_rank=left) from None
            if data is None:
                raise RingError(f"rank {self.rank}: rank {left} closed the connection", peer_rank=left)
            view = memoryview(data)
            while view.nbytes:
                if not stream.receiving:
                    raise RingError(f"rank {self.rank}: rank {left} sent more than the op's steps", peer_rank=left)
                buf = stream.receive_buffer
                k = min(view.nbytes, buf.nbytes)
                buf[:k] = view[:k]
                view = view[k:]
                header = stream.received(k)
                why = frame_mismatch(*header) if header is not None else None
                if why is not None:
                    raise RingError(f"rank {self.rank}: rank {left} {why}", peer_rank=left)

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._inboxes[(self.rank + 1) % self.size].put(None)


def local_queue_links(n: int, timeout: float = 10.0, piece_bytes: int = PIECE_BYTES) -> list[QueueRingLink]:
    """``n`` connected in-process links, one per thread."""
    inboxes: list[queue.Queue] = [queue.Queue() for _ in range(n)]
    return [QueueRingLink(r, inboxes, timeout, piece_bytes) for r in range(n)]


# --------------------------------------------------------------------------- front end


class RingAllReduce:
    """Ring all-reduce among ``peers`` (address of every member in rank order); this member is ``rank``.

    Args:
        rank: this member's position in ``peers``.
        peers: (host, port) each member listens on; member i connects to member (i+1) % n.
        listen: a bound socket to accept on (ownership passes to the ring), a port to bind on this
            member's host, or None to bind ``peers[rank]``.
        timeout: seconds without progress on a socket before RingTimeoutError.
        connect_timeout: deadline for the whole connection set-up.
        piece_bytes: size of the pieces each step is pipelined by (``piece_bounds``).

    Calls must be made in the same order with the same dtype and length on every member. Use
    ``RingAllReduce.over(link)`` to run the same algorithm over another transport.

    Example:
        with RingAllReduce(rank, peers, timeout=10) as ring:
            total = ring.allreduce(grad)
    """

    def __init__(
        self,
        rank: int,
        peers: Sequence[tuple[str, int]],
        listen: socket.socket | int | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 60.0,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        self._init(TcpRingLink(rank, peers, listen, timeout=timeout, connect_timeout=connect_timeout,
                               piece_bytes=piece_bytes))

    @classmethod
    def over(cls, link: RingLink) -> RingAllReduce:
        """The ring algorithm over an already connected transport."""
        self = cls.__new__(cls)
        self._init(link)
        return self

    def _init(self, link: RingLink) -> None:
        self.link = link
        self._calls = 0
        self._lock = threading.Lock()
        self._broken: BaseException | None = None

    @property
    def rank(self) -> int:
        return self.link.rank

    @property
    def size(self) -> int:
        return self.link.size

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        """Element-wise sum over all members (see ``ring_allreduce``); a failure breaks the ring for good."""
        with self._lock:
            if self._broken is not None:
                raise RingError(f"rank {self.rank}: ring is broken by an earlier failure: {self._broken}")
            arr = _checked(array)  # before any traffic: a bad argument does not break the ring
            try:
                result = ring_allreduce(arr, self.link, call=self._calls)
            except BaseException as exc:
                # Close at once so the neighbours fail fast instead of waiting for their timeouts.
                self._broken = exc
                self.link.close()
                raise
            self._calls += 1
            return result

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Every member's ``array`` stacked in rank order, shape (n, *array.shape).

        An all-reduce of zeros with this member's row filled in: adding zeros is exact, so values
        arrive unchanged (e.g. measured speeds for the adaptive allocator).
        """
        arr = np.asarray(array)
        rows = np.zeros((self.size, *arr.shape), dtype=arr.dtype)
        rows[self.rank] = arr
        return self.allreduce(rows)

    def close(self) -> None:
        self.link.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_local_ring(
    n: int,
    fn: Callable[[RingAllReduce], T],
    *,
    host: str = "127.0.0.1",
    timeout: float = 10.0,
    connect_timeout: float = 10.0,
    return_exceptions: bool = False,
    piece_bytes: int = PIECE_BYTES,
) -> list[T | BaseException]:
    """Run ``fn(ring)`` on ``n`` TCP ring members, one thread each, on ephemeral ports of ``host``.

    Returns each member's result in rank order; the first exception is raised unless
    ``return_exceptions``, in which case exceptions are returned in place of results. All threads
    are joined and all sockets closed before returning.
    """
    listeners: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.bind((host, 0))
            sock.listen()
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    peers = [s.getsockname()[:2] for s in listeners]
    results: list[T | BaseException | None] = [None] * n

    def member(rank: int) -> None:
        try:
            with RingAllReduce(rank, peers, listeners[rank], timeout=timeout, connect_timeout=connect_timeout,
                               piece_bytes=piece_bytes) as ring:
                results[rank] = fn(ring)
        except BaseException as exc:  # reported to the caller below  # noqa: BLE001
            results[rank] = exc

    threads = [threading.Thread(target=member, args=(r,), name=f"ring-{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not return_exceptions:
        for res in results:
            if isinstance(res, BaseException):
                raise res
    return results  # type: ignore[return-value]
