"""The lab's warm start of an agent: a process started ahead of its job, imports done, waiting for its arguments.

    python -m topologies.experiments.warm_agent READY_FILE    (then the arguments as one JSON line on stdin)

Experiment 3 measures job completion times on a 2-core testbed where every job's agents start on the same two
cores; a cluster's workers each start on a host of their own. So ``Testbed.prestart`` starts each agent's process
before the trace's clock runs: this launcher imports the agent (``host_agent.cli``, the interpreter's and the
agent's start-up: 0.5-0.7 CPU-s each), creates READY_FILE, then reads one line from stdin, its ``ina-agent``
arguments as a JSON list, and runs them (``host_agent.cli.main``). Stdin closed without a line: the job never
came, a quiet exit. A mistake exits 2 with one line, as ``ina-agent``'s do.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from inaproto.cli import UsageError

PROG = "warm_agent"


def read_arguments(argv: Sequence[str]) -> list[str] | None:
    """Import the agent, create READY_FILE, read the arguments (None: stdin closed without a line)."""
    if len(argv) != 1 or not argv[0]:
        raise UsageError(f"usage: python -m topologies.experiments.{PROG} READY_FILE (then the arguments as one JSON "
                         "line on stdin)")
    import host_agent.cli  # noqa: F401  (everything ina-agent imports before it joins its job)

    try:
        with open(argv[0], "w"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot create {argv[0]}: {exc.strerror or exc}") from None
    line = sys.stdin.readline()
    if not line.strip():
        return None
    try:
        args = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"the line on stdin is not JSON ({exc})") from None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UsageError("the line on stdin must be a JSON list of strings")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = read_arguments(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        return exc.report(PROG)
    if args is None:
        return 0
    from host_agent.cli import main as agent_main  # imported already (read_arguments)

    return agent_main(args)


if __name__ == "__main__":
    sys.exit(main())
