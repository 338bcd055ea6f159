"""Whether a P4Info or device config is the program ina-switch runs, p4src/ina.p4.

The committed ``p4src/ina.p4info.txt`` is the reference (:func:`p4src.p4info.load_p4info`).
``SetForwardingPipelineConfig`` holds every pushed P4Info against it name by name, id by id, width
by width (:func:`p4info_mismatch`) and accepts an empty or p4c-generated BMv2 JSON device config
(:func:`device_config_mismatch`); the ``ina-switch`` command line checks the BMv2 JSON it is started with the
same way, plus its key widths and table sizes (:func:`check_program`).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from p4.config.v1 import p4info_pb2

from p4src import tables as model
from softswitch.errors import SoftSwitchError

__all__ = [
    "JSON_VERSION",
    "ProgramError",
    "check_program",
    "device_config_mismatch",
    "p4info_mismatch",
]

JSON_VERSION = "2.23"  # the BMv2 JSON format version p4c 1.2.4 writes; any 2.x is read


class ProgramError(SoftSwitchError):
    """A program (BMv2 JSON) the pipeline model does not implement."""


def _objects(info: p4info_pb2.P4Info) -> list[tuple[str, list]]:
    """(kind, objects with a preamble) for every P4Info category."""
    return [
        ("table", list(info.tables)),
        ("action", list(info.actions)),
        ("action profile", list(info.action_profiles)),
        ("counter", list(info.counters)),
        ("direct counter", list(info.direct_counters)),
        ("meter", list(info.meters)),
        ("direct meter", list(info.direct_meters)),
        ("controller header", list(info.controller_packet_metadata)),
        ("value set", list(info.value_sets)),
        ("register", list(info.registers)),
        ("digest", list(info.digests)),
    ]


def _fields(fields: Iterable, with_kind: bool = False) -> list[tuple]:
    out = []
    for f in fields:
        t = (f.id, f.name, f.bitwidth)
        if with_kind:
            t += (p4info_pb2.MatchField.MatchType.Name(f.match_type),)
        out.append(t)
    return out


def _describe(kind: str, here, there) -> str | None:
    """What differs between two P4Info objects of one kind with the same id and name (None: nothing)."""
    if kind == "table":
        a, b = _fields(here.match_fields, True), _fields(there.match_fields, True)
        if a != b:
            return f"match fields are {a} here but {b} in the request"
        if {r.id for r in here.action_refs} != {r.id for r in there.action_refs}:
            return (f"action ids are {sorted(r.id for r in here.action_refs)} here but "
                    f"{sorted(r.id for r in there.action_refs)} in the request")
        for attr in ("size", "const_default_action_id", "implementation_id", "is_const_table"):
            if getattr(here, attr) != getattr(there, attr):
                return f"{attr} is {getattr(here, attr)} here but {getattr(there, attr)} in the request"
        if list(here.direct_resource_ids) != list(there.direct_resource_ids):
            return (f"direct resources are {list(here.direct_resource_ids)} here but "
                    f"{list(there.direct_resource_ids)} in the request")
    elif kind == "action":
        a, b = _fields(here.params), _fields(there.params)
        if a != b:
            return f"parameters (id, name, bitwidth) are {a} here but {b} in the request"
    elif kind == "controller header":
        a, b = _fields(here.metadata), _fields(there.metadata)
        if a != b:
            return f"metadata (id, name, bitwidth) are {a} here but {b} in the request"
    elif kind in ("counter", "direct counter"):
        if here.spec.unit != there.spec.unit:
            return f"unit is {here.spec.unit} here but {there.spec.unit} in the request"
        if kind == "counter" and here.size != there.size:
            return f"size is {here.size} here but {there.size} in the request"
    elif kind == "register":
        a, b = here.type_spec.bitstring.bit.bitwidth, there.type_spec.bitstring.bit.bitwidth
        if (a, here.size) != (b, there.size):
            return f"bit<{a}>[{here.size}] here but bit<{b}>[{there.size}] in the request"
    elif here != there:
        return "its definition differs"
    return None


def p4info_mismatch(expected: p4info_pb2.P4Info, got: p4info_pb2.P4Info) -> str | None:
    """The first difference that makes ``got`` another program than ``expected``, in words; None if none.

    Compared: every table, action (and parameter), counter, register, controller header (and metadata),
    by id, name, width, match kind and size; objects of kinds the program does not have must be absent.
    Aliases, annotations and documentation may differ.
    """
    if got.pkg_info.arch and expected.pkg_info.arch and got.pkg_info.arch != expected.pkg_info.arch:
        return f"architecture is {got.pkg_info.arch!r} in the request but {expected.pkg_info.arch!r} here"
    for (kind, here), (_, there) in zip(_objects(expected), _objects(got)):
        by_id = {o.preamble.id: o for o in here}
        by_name = {o.preamble.name: o for o in here}
        seen: set[int] = set()
        for o in there:
            pid, name = o.preamble.id, o.preamble.name
            if pid in seen:
                return f"{kind} id {pid} appears twice in the request"
            seen.add(pid)
            if pid not in by_id:
                if name in by_name:
                    return f"{kind} {name} has id {pid} in the request but {by_name[name].preamble.id} here"
                return f"{kind} {name} (id {pid}) is not part of the program this switch runs"
            mine = by_id[pid]
            if mine.preamble.name != name:
                return f"{kind} id {pid} is {name!r} in the request but {mine.preamble.name!r} here"
            diff = _describe(kind, mine, o)
            if diff:
                return f"{kind} {name}: {diff}"
        for o in here:
            if o.preamble.id not in seen:
                return f"{kind} {o.preamble.name} (id {o.preamble.id}) is missing from the request"
    if len(got.externs):
        return "the request declares externs, which the program this switch runs does not have"
    return None


def device_config_mismatch(data: bytes) -> str | None:
    """Why ``data`` is not a device config for this switch (None if it is): empty, or a BMv2 JSON of the program.

    A BMv2 JSON must hold every table (with its match kinds and actions), action (with its parameter widths),
    counter and register the model has, under the same names (``MyIngress.ina_job`` ...), and no other
    control-plane table, counter or register of ``MyIngress``/``MyEgress`` (p4c's hidden ``tbl_*`` tables aside).
    """
    if not data:
        return None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return ("p4_device_config is neither empty nor JSON: ina-switch accepts an empty device config or the "
                "BMv2 JSON p4c makes from p4src/ina.p4")
    if not isinstance(doc, dict) or not isinstance(doc.get("pipelines"), list) or not isinstance(doc.get("actions"), list):
        return "p4_device_config is JSON but not a BMv2 JSON (it needs 'pipelines' and 'actions' lists)"
    try:
        tables = {t["name"]: t for p in doc["pipelines"] for t in p.get("tables", [])}
        actions = {a["name"]: a for a in doc["actions"]}
        registers = {r["name"]: r for r in doc.get("register_arrays", [])}
        counters = {c["name"]: c for c in doc.get("counter_arrays", [])}
        for name, spec in model.TABLES.items():
            t = tables.get(name)
            if t is None:
                return f"BMv2 JSON has no table {name}"
            kinds = [k.get("match_type") for k in t.get("key", [])]
            if kinds != [kind for _, _, kind in spec.keys]:
                return f"BMv2 JSON table {name} matches {kinds}, the program {[k for _, _, k in spec.keys]}"
            if set(t.get("actions", [])) != set(spec.actions):
                return f"BMv2 JSON table {name} has actions {sorted(t.get('actions', []))}, the program {sorted(spec.actions)}"
        for name, aspec in model.ACTIONS.items():
            a = actions.get(name)
            if a is None:
                return f"BMv2 JSON has no action {name}"
            params = [(p.get("name"), p.get("bitwidth")) for p in a.get("runtime_data", [])]
            if params != list(aspec.params):
                return f"BMv2 JSON action {name} has parameters {params}, the program {list(aspec.params)}"
        for name, (width, size) in model.REGISTERS.items():
            r = registers.get(name)
            if r is None:
                return f"BMv2 JSON has no register {name}"
            if (r.get("bitwidth"), r.get("size")) != (width, size):
                return f"BMv2 JSON register {name} is bit<{r.get('bitwidth')}>[{r.get('size')}], the program bit<{width}>[{size}]"
        for name, size in model.COUNTERS.items():
            c = counters.get(name)
            if c is None:
                return f"BMv2 JSON has no counter {name}"
            if c.get("size") != size or c.get("is_direct", False):
                return f"BMv2 JSON counter {name} has size {c.get('size')}, the program an indirect counter of {size}"
        controls = ("MyIngress.", "MyEgress.")
        for kind, found, known in (("table", tables, model.TABLES), ("register", registers, model.REGISTERS),
                                   ("counter", counters, model.COUNTERS)):
            for name in found:
                if name.startswith(controls) and name not in known and not name.split(".")[-1].startswith("tbl_"):
                    return f"BMv2 JSON has {kind} {name}, which the program this switch runs does not have"
        for extra in ("meter_arrays",):
            if doc.get(extra):
                return f"BMv2 JSON has {extra}, which the program this switch runs does not have"
    except (AttributeError, TypeError, KeyError) as e:
        return f"p4_device_config is not a well-formed BMv2 JSON ({type(e).__name__}: {e})"
    return None


def check_program(path: str) -> bytes:
    """The bytes of a BMv2 JSON that the pipeline model implements; ProgramError with the reason otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ProgramError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise ProgramError(f"{path} is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ProgramError(f"{path} is not a BMv2 JSON (a JSON object with 'pipelines' and 'actions')")
    meta = doc.get("__meta__", {})
    version = meta.get("version") if isinstance(meta, dict) else None
    if isinstance(version, list) and version and version[0] != int(JSON_VERSION.split(".")[0]):
        raise ProgramError(f"{path} is BMv2 JSON version {'.'.join(map(str, version))}; ina-switch reads {JSON_VERSION.split('.')[0]}.x")
    why = device_config_mismatch(data)
    if why is None:
        why = _key_widths_mismatch(doc)
    if why is not None:
        raise ProgramError(f"{path} is not the program ina-switch implements (p4src/ina.p4): {why}")
    return data


def _key_widths_mismatch(doc: dict) -> str | None:
    """Table key widths and sizes of the JSON against the model's, where the JSON states them."""
    try:
        widths = {}
        types = {t["name"]: {f[0]: f[1] for f in t.get("fields", [])} for t in doc.get("header_types", [])}
        for h in doc.get("headers", []):
            widths[h["name"]] = types.get(h.get("header_type"), {})
        tables = {t["name"]: t for p in doc["pipelines"] for t in p.get("tables", [])}
        for name, spec in model.TABLES.items():
            t = tables[name]
            size = t.get("max_size")
            if isinstance(size, int) and size != spec.size:
                return f"table {name} has size {size}, the model {spec.size}"
            for key, (fname, width, _kind) in zip(t.get("key", []), spec.keys):
                target = key.get("target")
                if isinstance(target, list) and len(target) == 2 and target[0] in widths:
                    got = widths[target[0]].get(target[1])
                    if isinstance(got, int) and got != width:
                        return f"table {name} key {fname} is {got} bits wide, the model's {width}"
    except (AttributeError, TypeError, KeyError, IndexError) as e:
        return f"not a well-formed BMv2 JSON ({type(e).__name__}: {e})"
    return None
