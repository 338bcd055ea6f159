"""What every ina-* command line shares: a mistake is one readable line, ``prog: error: message``, not a usage dump.

:class:`Parser` is argparse whose mistakes raise :class:`UsageError`; a command raises the same error for
its own checks and turns it into its message and exit status in one place:

    try:
        args = Parser(prog="ina-exp").parse_args(argv)
    except UsageError as exc:
        return exc.report("ina-exp", err)    # "ina-exp: error: ..." on err; returns EXIT_USAGE (2)
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

__all__ = ["EXIT_USAGE", "Parser", "UsageError"]

EXIT_USAGE = 2


class UsageError(Exception):
    """A command-line mistake; its text is one line that says what to change. ``prog`` names the parser
    (sub-command) that found it, where one did."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog

    def report(self, prog: str, err: TextIO | None = None, *, see_help: bool = False) -> int:
        """Write ``prog: error: message`` (and a pointer to --help) to ``err``; the exit status, EXIT_USAGE."""
        hint = f" (see {prog} --help)" if see_help else ""
        print(f"{prog}: error: {self}{hint}", file=err or sys.stderr)
        return EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of printing its usage and exiting.

    Give it to sub-commands as ``add_subparsers(parser_class=Parser)`` so their mistakes are one line too.
    """

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise UsageError(message, self.prog)

    def parse_args_or_exit(self, args: Sequence[str] | None = None) -> argparse.Namespace:
        """``parse_args``, but a mistake exits with status 2 after one line ``subprog: error: message`` on stderr:
        argparse's own contract, without the usage dump."""
        try:
            return self.parse_args(args)
        except UsageError as exc:
            raise SystemExit(exc.report(exc.prog or self.prog)) from None
