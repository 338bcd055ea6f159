"""Network namespaces, veth pairs, processes and TCP relays across namespaces, always cleaned up.

The one home of the testbed's namespace tooling: integration tests, ``bench/`` and ``ina-exp`` use it.
In the spirit of pyroute2's test fixtures, with iproute2 underneath (no extra dependency):

- ``Network`` owns uniquely named namespaces (``inat-<pid>-<n>-<tag>``) and the veth pairs between them;
  ``close()`` deletes every namespace it made, even when the caller failed, and ``sweep_stale()`` removes
  those left by a process that was killed.
- ``Namespace.entered()`` switches the calling thread into a namespace, so the process itself opens
  AF_PACKET or TCP sockets there (a socket stays in the namespace it was created in).
- ``Process`` starts a command in a namespace with its output in a log file and stops it by PID: SIGTERM,
  then SIGKILL; errors quote the log file's path and its last lines.
- ``wait_until`` polls a condition: nothing sleeps to synchronise.
- ``TcpRelay`` relays TCP connections across namespaces on one thread. ``TcpForward`` makes a port inside a
  namespace (a switch's gRPC server on 127.0.0.1) reachable on 127.0.0.1 here; ``LoopbackForward`` makes
  127.0.0.1:PORT here reachable on 127.0.0.1:PORT inside each Mininet host (agents reach the controller).

Everything stays on this machine: no namespace is bridged to a physical interface.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Self

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/var/run/netns")
PREFIX = "inat"
_libc = ctypes.CDLL(None, use_errno=True)
_counter = itertools.count(1)

__all__ = [
    "LoopbackForward", "Namespace", "NetnsError", "Network", "Process", "TcpForward", "TcpRelay",
    "listen_in_netns", "run", "sweep_stale", "wait_until",
]


class NetnsError(RuntimeError):
    """A namespace, link or process operation that failed; the message says which command and why."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:  # os.setns exists from Python 3.12 only
        err = ctypes.get_errno()
        raise NetnsError(f"setns failed: {os.strerror(err)}")


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess:
    """Run a command, capture its output; NetnsError with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def wait_until(
    condition: Callable[[], object], timeout: float = 5.0, *, interval: float = 0.005, message: str | Callable[[], str] = ""
):
    """Poll ``condition`` until it returns a true value (returned) or ``timeout`` passes (TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise TimeoutError(text or f"condition not met within {timeout} s")
        time.sleep(interval)


class Namespace:
    """A named network namespace (``ip netns``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["ip", "-n", self.name, *args], check=check)

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: the PID stays the command's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess:
        return run(self.exec_argv(argv), check=check, timeout=timeout)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Switch the calling thread into this namespace for the ``with`` block."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(self.path, os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(own)

    def socket(self, *args, **kwargs) -> socket.socket:
        """A socket created inside the namespace (it stays there)."""
        with self.entered():
            return socket.socket(*args, **kwargs)

    def tcp_port_open(self, port: int, host: str = "127.0.0.1") -> bool:
        """True once something accepts TCP connections on host:port inside the namespace."""
        s = self.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.settimeout(0.2)
            s.connect((host, port))
            return True
        except OSError:
            return False
        finally:
            s.close()


def sweep_stale(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces named ``<prefix>-<pid>-...`` whose creating process is gone (a killed test run)."""
    removed = []
    if not NETNS_DIR.is_dir():
        return removed
    for entry in NETNS_DIR.iterdir():
        parts = entry.name.split("-")
        if len(parts) < 3 or parts[0] != prefix or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        if run(["ip", "netns", "del", entry.name], check=False).returncode == 0:
            removed.append(entry.name)
    return removed


class Network:
    """Namespaces and veth pairs made for one test (or one session); ``close()`` removes all of them."""

    def __init__(self, tag: str = "t") -> None:
        self.tag = tag
        self.namespaces: list[Namespace] = []
        self._processes: list[Process] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_namespace(self, role: str) -> Namespace:
        """A new namespace with loopback up and IPv6 off (so its kernel sends nothing by itself)."""
        name = f"{PREFIX}-{os.getpid()}-{next(_counter)}-{self.tag}-{role}"[:64]
        run(["ip", "netns", "add", name])
        ns = Namespace(name)
        self.namespaces.append(ns)
        ns.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
        ns.ip("link", "set", "lo", "up")
        return ns

    def add_veth(
        self, a: Namespace, a_name: str, b: Namespace, b_name: str, *, tx_off: Sequence[Namespace] = (), mtu: int | None = None
    ) -> None:
        """A veth pair ``a_name`` in ``a`` <-> ``b_name`` in ``b``, both up; TX checksum offload off in ``tx_off``."""
        for name in (a_name, b_name):
            if len(name) > 15:
                raise ValueError(f"interface name {name!r} is longer than 15 characters")
        run(["ip", "link", "add", a_name, "netns", a.name, "type", "veth", "peer", "name", b_name, "netns", b.name])
        for ns, name in ((a, a_name), (b, b_name)):
            if mtu is not None:
                ns.ip("link", "set", name, "mtu", str(mtu))
            ns.ip("link", "set", name, "up")
            if ns in tx_off:
                # Hosts' frames must leave with finished checksums (see docs/switch.md).
                ns.run(["ethtool", "-K", name, "tx", "off"])

    def track(self, process: Process) -> Process:
        """Stop this process (if still running) before the namespaces go."""
        self._processes.append(process)
        return process

    def close(self) -> None:
        errors = []
        for p in reversed(self._processes):
            try:
                p.stop()
            except Exception as e:  # keep cleaning up  # noqa: BLE001
                errors.append(str(e))
        self._processes.clear()
        for ns in reversed(self.namespaces):
            proc = run(["ip", "netns", "del", ns.name], check=False)
            if proc.returncode != 0 and ns.path.exists():
                errors.append(f"ip netns del {ns.name}: {proc.stderr.strip()}")
        self.namespaces.clear()
        if errors:
            raise NetnsError("; ".join(errors))


class Process:
    """A command started in a namespace, its output in ``log_path``; stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: Sequence[str], log_path: str | Path, *, namespace: Namespace | None = None) -> None:
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.namespace = namespace
        full = namespace.exec_argv(self.argv) if namespace is not None else self.argv
        with open(self.log_path, "wb") as log:  # the process writes to its own copy of the file descriptor
            self.popen = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.popen.pid
        self.exit_code: int | None = None
        self.stop_seconds: float | None = None

    def __repr__(self) -> str:
        return f"Process(pid={self.pid}, log={str(self.log_path)!r})"

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> str:
        return f"{self.argv[0]} (pid {self.pid}, log {self.log_path}):\n{self.log_tail()}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise NetnsError(f"process exited with {self.popen.returncode}: {self.describe()}")

    def wait_until(self, condition: Callable[[], object], timeout: float, what: str):
        """Poll ``condition``; fail early, with the log, if the process dies meanwhile."""

        def check():
            self.check_alive()
            return condition()

        return wait_until(check, timeout, message=lambda: f"{what} not within {timeout} s: {self.describe()}")

    def stop(self, timeout: float = 3.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
        if self.exit_code is not None:
            return self.exit_code
        t0 = time.monotonic()
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.stop_seconds = time.monotonic() - t0
        self.exit_code = self.popen.returncode
        return self.exit_code




# --- TCP relays across namespaces ------------------------------------------------------------------------


def _lo_up() -> None:
    """Bring up ``lo`` in the calling thread's namespace (Mininet does not for its hosts)."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(backlog)
    s.setblocking(False)
    return s


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
            _lo_up()
            box["sock"] = _listen("127.0.0.1", port, 64)
        except OSError as exc:
            box["error"] = exc

    t = threading.Thread(target=make, name=f"netns-listen-{pid}")
    t.start()
    t.join()
    if "error" in box:
        raise OSError(f"cannot listen on 127.0.0.1:{port} in the namespace of process {pid}: {box['error']}")
    return box["sock"]  # type: ignore[return-value]


class TcpRelay:
    """Relay every connection accepted on ``listeners`` to ``target``, bytes both ways, on one thread.

    The listening sockets may live in any namespaces (a socket stays where it was made); the upstream
    connections are made in ``upstream_namespace`` (the thread enters it), or in the caller's namespace.
    """

    def __init__(self, listeners: Iterable[socket.socket], target: tuple[str, int], *, name: str = "tcp-relay",
                 upstream_namespace: Namespace | None = None) -> None:
        self.target = target
        self._listeners = list(listeners)
        self._upstream_namespace = upstream_namespace
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        entered = self._upstream_namespace.entered() if self._upstream_namespace else contextlib.nullcontext()
        with entered:
            sel = selectors.DefaultSelector()
            peers: dict[socket.socket, socket.socket] = {}
            for s in self._listeners:
                sel.register(s, selectors.EVENT_READ, "listen")
            sel.register(self._stop_r, selectors.EVENT_READ, "stop")
            try:
                while self._serve(sel, peers):
                    pass
            finally:
                for x in list(peers):
                    x.close()
                sel.close()

    def _serve(self, sel: selectors.BaseSelector, peers: dict[socket.socket, socket.socket]) -> bool:
        """One round of ready sockets; False once asked to stop."""
        for key, _ in sel.select():
            s = key.fileobj
            if key.data == "stop":
                return False
            if key.data == "listen":
                self._accept(s, sel, peers)
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
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(x)
                    x.close()
        return True

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector, peers: dict[socket.socket, socket.socket]) -> None:
        try:
            client, _ = listener.accept()
        except OSError:  # BlockingIOError included: another round took it
            return
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError:
            client.close()
            upstream.close()
            return
        for x in (client, upstream):
            x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peers[client], peers[upstream] = upstream, client
        sel.register(client, selectors.EVENT_READ, "data")
        sel.register(upstream, selectors.EVENT_READ, "data")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stop_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for s in (*self._listeners, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                s.close()
        self._listeners = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TcpForward(TcpRelay):
    """Forward 127.0.0.1:<local_port> of the calling namespace to host:port inside ``namespace``."""

    def __init__(self, namespace: Namespace, port: int, host: str = "127.0.0.1") -> None:
        self.namespace = namespace
        listener = _listen("127.0.0.1", 0, 16)
        self.local_port = listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.local_port}"
        super().__init__([listener], (host, port), name=f"forward-{namespace.name}", upstream_namespace=namespace)


class LoopbackForward(TcpRelay):
    """Forward 127.0.0.1:``port`` inside each namespace (given by a process id in it) to 127.0.0.1:``target_port`` here.

        with LoopbackForward([h.pid for h in net.hosts], 50060):
            ...   # agents in the hosts reach the controller at 127.0.0.1:50060
    """

    def __init__(self, pids: Iterable[int], port: int, target_port: int | None = None) -> None:
        self.port = port
        listeners: list[socket.socket] = []
        try:
            for pid in pids:
                listeners.append(listen_in_netns(pid, port))
        except BaseException:
            for s in listeners:
                s.close()
            raise
        super().__init__(listeners, ("127.0.0.1", target_port or port), name="loopback-forward")
