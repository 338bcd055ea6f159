"""``ina-agent`` processes end by themselves once their job is done: against the real controller (topologies.loopback), two
workers all-reduce over their ring and exit with status 0, no thread of theirs left running (the interpreter waits
for none and finalizes normally)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from topologies.loopback import LocalControlPlane

# ina-agent's main, then the threads still alive when it returned (what could keep an interpreter from exiting)
ENTRY = """
import json, sys, threading
from host_agent import cli
code = cli.main(sys.argv[1:])
print(json.dumps([t.name for t in threading.enumerate() if t is not threading.main_thread()]), file=sys.stderr)
sys.exit(code)
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_agents_exit_by_themselves_after_their_job(tmp_path) -> None:
    with LocalControlPlane(tmp_path / "ctl.db") as h:
        workers = ",".join(f"127.0.0.1:{p}@h1{i + 1}" for i, p in enumerate(_free_ports(2)))
        env = dict(os.environ, INA_JOB_SECRET="exit-test-secret-0123456789abcdef")
        procs = [subprocess.Popen([sys.executable, "-c", ENTRY, "allreduce", "--workers", workers, "--worker-id", str(i),
                                   "--controller", h.address, "--backend", "ring", "--job-name", "exit", "--elements",
                                   "1000", "--iterations", "1", "--quiet"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
        for p in procs:
            _out, err = p.communicate(timeout=120)  # a generous bound: whether it exits, not how fast
            assert p.returncode == 0, err
            assert json.loads(err.strip().splitlines()[-1]) == []
