"""Relay a control channel on 127.0.0.1 of the root namespace into the testbed's host namespaces.

Agents run inside Mininet hosts (network namespaces of their own), while the controller's admission
service listens on 127.0.0.1 of the root namespace. :class:`LoopbackForward` listens on the same
``127.0.0.1:PORT`` inside each host's namespace (its own loopback; nothing is bridged to any outside
interface) and relays every connection to ``127.0.0.1:PORT`` of the namespace the runner runs in. One
thread serves every host.

    with LoopbackForward([h.pid for h in net.hosts], 50060):
        ...   # agents in the hosts reach the controller at 127.0.0.1:50060
"""
from __future__ import annotations

import ctypes
import os
import selectors
import socket
import threading
from typing import Iterable

__all__ = ["LoopbackForward", "listen_in_netns"]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:  # os.setns exists from Python 3.12 only
        raise OSError(ctypes.get_errno(), f"setns: {os.strerror(ctypes.get_errno())}")


def listen_in_netns(pid: int, port: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` inside the network namespace of process ``pid``.

    The socket is made by a short-lived thread that enters the namespace (setns affects only the calling
    thread), so the caller's own namespace never changes; the socket stays in the namespace it was made in.
    """
    box: dict[str, object] = {}

    def make() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            subprocess_lo_up()
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen(64)
            s.setblocking(False)
            box["sock"] = s
        except OSError as exc:
            box["error"] = exc

    t = threading.Thread(target=make, name=f"netns-listen-{pid}")
    t.start()
    t.join()
    if "error" in box:
        raise OSError(f"cannot listen on 127.0.0.1:{port} in the namespace of process {pid}: {box['error']}")
    return box["sock"]  # type: ignore[return-value]


def subprocess_lo_up() -> None:
    """Bring up ``lo`` in the calling thread's namespace (Mininet does; this is for other namespaces)."""
    import fcntl
    import struct

    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


class LoopbackForward:
    """Forward 127.0.0.1:``port`` inside each namespace (given by a process id in it) to 127.0.0.1:``target_port`` here."""

    def __init__(self, pids: Iterable[int], port: int, target_port: int | None = None) -> None:
        self.port = port
        self.target = ("127.0.0.1", target_port or port)
        self._listeners = []
        self._sel = selectors.DefaultSelector()
        self._stop_r, self._stop_w = socket.socketpair()
        try:
            for pid in pids:
                s = listen_in_netns(pid, port)
                self._listeners.append(s)
                self._sel.register(s, selectors.EVENT_READ, "listen")
        except BaseException:
            self._close_all()
            raise
        self._sel.register(self._stop_r, selectors.EVENT_READ, "stop")
        self._peers: dict[socket.socket, socket.socket] = {}
        self._thread = threading.Thread(target=self._run, name="loopback-forward", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sel, peers = self._sel, self._peers
        while True:
            for key, _ in sel.select():
                s = key.fileobj
                if key.data == "stop":
                    return
                if key.data == "listen":
                    try:
                        client, _ = s.accept()
                    except (BlockingIOError, OSError):
                        continue
                    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    try:
                        upstream.connect(self.target)
                    except OSError:
                        client.close()
                        upstream.close()
                        continue
                    for x in (client, upstream):
                        x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    peers[client], peers[upstream] = upstream, client
                    sel.register(client, selectors.EVENT_READ, "data")
                    sel.register(upstream, selectors.EVENT_READ, "data")
                    continue
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                other = peers.get(s)
                if data and other is not None:
                    try:
                        other.setblocking(True)
                        other.sendall(data)
                        continue
                    except OSError:
                        pass
                for x in (s, other):
                    if x is not None and x in peers:
                        del peers[x]
                        try:
                            sel.unregister(x)
                        except (KeyError, ValueError):
                            pass
                        x.close()

    def _close_all(self) -> None:
        for s in [*self._listeners, *getattr(self, "_peers", {}).keys(), self._stop_r, self._stop_w]:
            try:
                s.close()
            except OSError:
                pass
        self._listeners = []

    def close(self) -> None:
        try:
            self._stop_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sel.close()
        self._close_all()

    def __enter__(self) -> "LoopbackForward":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
