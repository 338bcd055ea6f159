"""The worker's TCP listener, shared by its rings and its mesh: connections handed out by their hello's magic.

A worker has one TCP address (its INA address, docs/agent.md), and two kinds of links connect to it: the rings'
(``host_agent.ring``, hello ``RNG1``) and the mesh's (``host_agent.mesh``, hello ``MSH1``). A ring may be built
(on the stream's idle service, after a generation change) while the communication thread builds the mesh, so
neither can accept on the listener itself: one would take and refuse the other's connection. ``Acceptor`` is
the only one that accepts. Its thread peeks at the first four bytes of every new connection (the magic,
left in the socket for the link to read with the rest of its hello) and queues the connection in the
``Inbox`` of that magic; a link takes its connections from its inbox (``Inbox.accept``, the listening socket's
``accept`` with ``settimeout``). A connection that sends no known magic within ``hello_timeout`` is closed.
"""
from __future__ import annotations

import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Iterable

__all__ = ["Acceptor", "Inbox", "recv_exact"]

log = logging.getLogger("host_agent.acceptor")

MAGIC_BYTES = 4
HELLO_TIMEOUT = 30.0  # s: a connection that has not sent its magic by then is closed


class Inbox:
    """Connections of one hello magic, in arrival order; ``accept`` as on a listening socket.

    ``interrupt`` (any thread) makes the ``accept`` in progress, or the next one, raise ``OSError``: what shutting
    a listener down did to a ring being connected when a generation change aborts it. ``clear_interrupt`` drops
    an interrupt nobody took. ``close`` is a no-op (the acceptor owns the listener), so a link that owns the
    listener it was given may close it.
    """

    def __init__(self, magic: bytes) -> None:
        self.magic = magic
        self._queue: queue.SimpleQueue[tuple[socket.socket, tuple[str, int]] | None] = queue.SimpleQueue()
        self._timeout: float | None = None
        self._interrupted = threading.Event()

    def put(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        self._queue.put((conn, addr))

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def accept(self) -> tuple[socket.socket, tuple[str, int]]:
        """The oldest connection (blocking, with the socket's own timeouts); TimeoutError after ``settimeout``."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            if self._interrupted.is_set():
                self._interrupted.clear()
                raise OSError(f"accepting {self.magic!r} connections was interrupted")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no {self.magic!r} connection within {self._timeout}s")
            try:
                item = self._queue.get(timeout=0.05 if left is None else min(left, 0.05))
            except queue.Empty:
                continue
            if item is None:  # interrupt's wake-up
                continue
            conn, addr = item
            conn.setblocking(True)
            return conn, addr

    def interrupt(self) -> None:
        self._interrupted.set()
        self._queue.put(None)

    def clear_interrupt(self) -> None:
        self._interrupted.clear()

    def listen(self, backlog: int = 0) -> None:
        """Nothing to do: the acceptor listens (a link calls this on a listener it was given)."""

    def close(self) -> None:
        """Nothing to do: the acceptor owns the listener."""

    def drain(self) -> None:
        """Close the connections nobody took."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].close()


class Acceptor:
    """Accepts every connection on ``listener`` (owned from here on) and queues it in the inbox of its magic.

    Args:
        listener: a bound, listening TCP socket (the worker's address).
        magics: the hellos of the links that connect here (their inboxes exist from the start, so a connection
            that comes before its link asks for it waits there, as it would in the listener's backlog); any
            other hello is closed.
        hello_timeout: seconds a new connection has to send its four-byte magic.
        name: the thread's name.
    """

    def __init__(self, listener: socket.socket, magics: Iterable[bytes], *, hello_timeout: float = HELLO_TIMEOUT,
                 name: str = "ina-acceptor") -> None:
        self.listener = listener
        self.address: tuple[str, int] = listener.getsockname()[:2]
        self.hello_timeout = hello_timeout
        self._inboxes: dict[bytes, Inbox] = {}
        for magic in magics:
            if len(magic) != MAGIC_BYTES:
                raise ValueError(f"a hello magic has {MAGIC_BYTES} bytes, got {magic!r}")
            self._inboxes[magic] = Inbox(magic)
        self._waiting: dict[socket.socket, tuple[tuple[str, int], float]] = {}  # connection -> (peer, deadline)
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False
        listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def inbox(self, magic: bytes) -> Inbox:
        """The inbox of ``magic`` (one of the acceptor's)."""
        try:
            return self._inboxes[magic]
        except KeyError:
            raise ValueError(f"no inbox for hello {magic!r}; the acceptor takes {sorted(self._inboxes)}") from None

    def _run(self) -> None:
        try:
            while not self._closed:
                timeout = None
                if self._waiting:
                    timeout = max(0.0, min(d for _, d in self._waiting.values()) - time.monotonic())
                for key, _ in self._sel.select(timeout):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        return
                    else:
                        self._peek(key.fileobj)  # type: ignore[arg-type]
                self._expire()
        except Exception:
            if not self._closed:
                log.exception("acceptor on %s:%d stopped", *self.address)
        finally:
            for conn in list(self._waiting):
                conn.close()
            self._waiting.clear()

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("accept on %s:%d failed: %s", *self.address, exc)
                return
            conn.setblocking(False)
            self._waiting[conn] = (addr, time.monotonic() + self.hello_timeout)
            self._sel.register(conn, selectors.EVENT_READ)

    def _peek(self, conn: socket.socket) -> None:
        addr, _ = self._waiting[conn]
        try:
            head = conn.recv(MAGIC_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            head = b""
        if len(head) == MAGIC_BYTES or not head:
            self._sel.unregister(conn)
            del self._waiting[conn]
        if not head:
            conn.close()
            return
        if len(head) < MAGIC_BYTES:
            time.sleep(0.001)  # the rest of the magic is on its way
            return
        box = self._inboxes.get(head)
        if box is None:
            log.warning("connection from %s:%d sent no hello (%r): closed", *addr, head)
            conn.close()
            return
        box.put(conn, addr)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn, (addr, deadline) in list(self._waiting.items()):
            if deadline <= now:
                log.warning("connection from %s:%d sent no hello within %gs: closed", *addr, self.hello_timeout)
                self._sel.unregister(conn)
                del self._waiting[conn]
                conn.close()

    def close(self) -> None:
        """Stop accepting, close the listener and every connection no link took."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._sel.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()
        for box in self._inboxes.values():
            box.drain()


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from a blocking socket (a peer's hello); ConnectionError if it closes first."""
    buf = bytearray()
    while len(buf) < size:
        part = sock.recv(size - len(buf))
        if not part:
            raise ConnectionError("connection closed")
        buf += part
    return bytes(buf)
