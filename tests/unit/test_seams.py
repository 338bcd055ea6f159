"""The product's seams, read from its source with ``ast``: no import circle, no read of another's private names.

Product packages import each other only through public names: a module never imports a name that starts with
``_`` from another module, and never reads ``x._y`` where ``x`` is not ``self`` or ``cls`` (the documented
underscore APIs of the standard library and namedtuples aside). And no two product modules import each other,
directly or through others, imports inside functions included.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("inaproto", "p4src", "softswitch", "controller", "host_agent", "simulator", "topologies")
GENERATED = {"inaproto/admission_pb2.py", "inaproto/admission_pb2_grpc.py"}

# Underscore names that are public API where they are defined (namedtuple's methods, os._exit, sys._getframe,
# enum's hooks, a dataclass's __dataclass_fields__ is a dunder and never flagged).
DOCUMENTED = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit", "_getframe", "_value_",
              "_name_", "_missing_", "_generate_next_value_", "_base_executable", "_current_frames"}

# What the product still does that this test forbids, as (module, what); each entry is a debt to pay, and the
# list only shrinks: a new violation fails the test, and so does an entry that no longer occurs.
KNOWN: set[tuple[str, str]] = set()


def product_files() -> list[Path]:
    files = []
    for package in PACKAGES:
        files += [p for p in sorted((ROOT / package).rglob("*.py")) if p.relative_to(ROOT).as_posix() not in GENERATED]
    return files


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, tree: ast.AST) -> set[str]:
    """Product modules this file imports, anywhere in it (functions included)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def private_reads(path: Path, tree: ast.AST) -> set[str]:
    """``x._y`` with ``x`` not self/cls, and ``from m import _y``, as text."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if node.attr in DOCUMENTED:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.add(f"{ast.unparse(node.value)}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            out.update(f"from {node.module} import {a.name}" for a in node.names
                       if a.name.startswith("_") and not a.name.startswith("__"))
    return out


@pytest.fixture(scope="module")
def parsed() -> dict[str, tuple[Path, ast.AST]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in product_files()}


def test_no_import_circle(parsed):
    modules = set(parsed)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, (path, tree) in parsed.items():
        for target in imports_of(path, tree):
            while target and target not in modules:  # `from pkg import name`: name may be a module or not
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    circles = _cycles(graph)
    found = {(c[0], "circle " + " -> ".join(c)) for c in circles}
    _compare(found, {k for k in KNOWN if k[1].startswith("circle ")}, "import circles")


def test_no_private_reads(parsed):
    found = {(name, what) for name, (path, tree) in parsed.items() for what in private_reads(path, tree)}
    _compare(found, {k for k in KNOWN if not k[1].startswith("circle ")}, "reads of private names")


def _compare(found: set[tuple[str, str]], known: set[tuple[str, str]], what: str) -> None:
    new = sorted(found - known)
    gone = sorted(known - found)
    assert not new, f"{what}: " + "; ".join(f"{m}: {w}" for m, w in new)
    assert not gone, "paid debts still listed in KNOWN: " + "; ".join(f"{m}: {w}" for m, w in gone)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), rotated to start at its
    smallest name so the report is stable."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps
