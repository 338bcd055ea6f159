"""Network namespaces, veth pairs and processes for integration tests, always cleaned up.

In the spirit of pyroute2's test fixtures, with iproute2 underneath (no extra dependency):

- ``Network`` owns uniquely named namespaces (``inat-<pid>-<n>-<tag>``) and the veth pairs between them;
  ``close()`` (or the ``network`` fixture's finalizer) deletes every namespace it made, even when a test
  failed, and ``sweep_stale()`` removes those left by a test process that was killed.
- ``Namespace.entered()`` switches the calling thread into a namespace, so the test process itself opens
  AF_PACKET or TCP sockets there (a socket stays in the namespace it was created in).
- ``Process`` starts a command in a namespace with its output in a log file and stops it by PID: SIGTERM,
  then SIGKILL; errors quote the log file's path and its last lines.
- ``wait_until`` polls a condition: tests never sleep to synchronise.
- ``TcpForward`` makes a TCP port inside a namespace (a switch's gRPC server on 127.0.0.1) reachable on
  127.0.0.1 of the test's own namespace, without any address or route outside the namespaces.

Everything stays on this machine: no namespace is bridged to a physical interface.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/var/run/netns")
PREFIX = "inat"
_libc = ctypes.CDLL(None, use_errno=True)
_counter = itertools.count(1)


class NetnsError(RuntimeError):
    """A namespace, link or process operation that failed; the message says which command and why."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"setns failed: {os.strerror(err)}")


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 10.0) -> subprocess.CompletedProcess:
    """Run a command, capture its output; NetnsError with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
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

    def __enter__(self) -> Network:
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
            except Exception as e:  # keep cleaning up
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
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.popen = subprocess.Popen(full, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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
        self._log.close()
        return self.exit_code


class TcpForward:
    """Forward 127.0.0.1:<local_port> of the calling namespace to host:port inside ``namespace``.

    One thread, which lives in the target namespace, accepts on a listening socket made in the caller's
    namespace and relays bytes both ways. Enough for a gRPC control channel in tests.
    """

    def __init__(self, namespace: Namespace, port: int, host: str = "127.0.0.1") -> None:
        self.namespace, self.target = namespace, (host, port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.local_port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.local_port}"
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name=f"forward-{namespace.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        peers: dict[socket.socket, socket.socket] = {}
        with self.namespace.entered():  # this thread's upstream sockets are created inside the namespace
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._stop_r, selectors.EVENT_READ)
            try:
                while True:
                    for key, _ in sel.select():
                        s = key.fileobj
                        if s is self._stop_r:
                            return
                        if s is self._listener:
                            try:
                                client, _ = self._listener.accept()
                            except BlockingIOError:
                                continue
                            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                            try:
                                upstream.connect(self.target)
                            except OSError:
                                client.close()
                                upstream.close()
                                continue
                            peers[client], peers[upstream] = upstream, client
                            sel.register(client, selectors.EVENT_READ)
                            sel.register(upstream, selectors.EVENT_READ)
                            continue
                        try:
                            data = s.recv(65536)
                        except OSError:
                            data = b""
                        other = peers.get(s)
                        if data and other is not None:
                            try:
                                other.sendall(data)
                                continue
                            except OSError:
                                pass
                        for x in (s, other):
                            if x is not None and x in peers:
                                sel.unregister(x)
                                peers.pop(x)
                                x.close()
            finally:
                for x in list(peers):
                    x.close()
                sel.close()

    def close(self) -> None:
        try:
            self._stop_w.send(b"x")
        except OSError:
            pass
        self._thread.join(2)
        for s in (self._listener, self._stop_r, self._stop_w):
            s.close()
