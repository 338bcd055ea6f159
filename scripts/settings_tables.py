"""Fill the settings tables of docs/*.md from the documented configuration dataclasses (`make docs`).

A table is marked in a doc as::

    <!-- settings: controller.config:ControllerConfig -->
    | setting | default | meaning |
    ...
    <!-- /settings -->

and everything between the two markers is replaced by ``inaproto.config.markdown_table`` of that class, so
each setting is documented once, beside its field. ``--check`` only reports docs that are out of date (exit 1).
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

from inaproto.config import markdown_table

DOCS = Path(__file__).resolve().parents[1] / "docs"
MARKED = re.compile(r"(<!-- settings: ([\w.]+):(\w+) -->\n)(.*?)(<!-- /settings -->)", re.DOTALL)


def filled(text: str) -> str:
    """``text`` with every marked settings table regenerated."""
    def table(m: re.Match) -> str:
        cls = getattr(importlib.import_module(m.group(2)), m.group(3))
        return m.group(1) + markdown_table(cls) + m.group(5)

    return MARKED.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="report out-of-date docs, change nothing")
    args = p.parse_args(argv)
    stale = []
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        new = filled(text)
        if new != text:
            stale.append(doc.name)
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print(f"settings tables out of date in {', '.join(stale)}: run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
