"""A small reader of p4src/ina.p4's declarations, so tests can hold the P4Info, the wire format and the
switch model against the P4 source without p4c.

It understands the subset of P4_16 the program is written in (one declaration per statement, #define and
const integers, typedef'd bit widths) and derives P4Info the way p4c does: control-plane names
``Control.object``, aliases as the shortest unique dotted suffix, and ids as the resource-type prefix over
the low 24 bits of the Jenkins one-at-a-time hash of the name, probing linearly in sorted-name order.

    python -m p4src.p4source > p4src/ina.p4info.txt   # regenerate the hand-kept P4Info where p4c is absent
    python -m p4src.p4source --compare A B             # compare two P4Infos up to the order of their lists
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from p4src.p4info import load_p4info

P4_PATH = Path(__file__).resolve().parent / "ina.p4"

_STRIP_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


@dataclass
class P4Source:
    text: str
    ints: dict[str, int] = field(default_factory=dict)  # #define and const integers
    typedefs: dict[str, int] = field(default_factory=dict)
    headers: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    header_annotations: dict[str, str] = field(default_factory=dict)
    controls: dict[str, str] = field(default_factory=dict)  # control name -> body text

    def width(self, type_name: str) -> int:
        m = re.fullmatch(r"bit<(\d+)>", type_name)
        return int(m.group(1)) if m else self.typedefs[type_name]

    def value(self, token: str) -> int:
        token = token.strip()
        if token in self.ints:
            return self.ints[token]
        m = re.fullmatch(r"(?:\d+w)?(0x[0-9a-fA-F]+|\d+)", token)
        if not m:
            raise ValueError(f"not an integer: {token!r}")
        return int(m.group(1), 0)


def read_p4(path: Path = P4_PATH) -> P4Source:
    raw = path.read_text()
    src = P4Source(raw)
    for name, val in re.findall(r"^#define\s+(\w+)\s+(\S+)", raw, re.MULTILINE):
        if re.fullmatch(r"\d+|0x[0-9a-fA-F]+", val):
            src.ints[name] = int(val, 0)
    text = _STRIP_COMMENTS.sub("", raw)
    for name, val in re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*(\w+)\s*;", text):
        src.ints[name] = src.value(val)
    for typ, name in re.findall(r"typedef\s+(bit<\d+>)\s+(\w+)\s*;", text):
        src.typedefs[name] = src.width(typ)
    for annot, name, body in re.findall(r"(@controller_header\(\"\w+\"\)\s*)?header\s+(\w+)\s*\{(.*?)\}", text, re.DOTALL):
        src.headers[name] = [(f, src.width(t)) for t, f in re.findall(r"(bit<\d+>|\w+)\s+(\w+)\s*;", body)]
        if annot:
            src.header_annotations[name] = annot.strip()
    # A control's body runs to the next top-level block.
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^control\s+(\w+)\s*\(", text, re.MULTILINE)]
    ends = [m.start() for m in re.finditer(r"^(?:control|parser|V1Switch)\b", text, re.MULTILINE)] + [len(text)]
    for pos, name in starts:
        end = min(e for e in ends if e > pos)
        src.controls[name] = text[pos:end]
    return src


def jenkins_one_at_a_time(name: str) -> int:
    h = 0
    for byte in name.encode():
        h = (h + byte) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    h = (h + (h << 15)) & 0xFFFFFFFF
    return h


def assign_ids(names: list[str], prefix: int) -> dict[str, int]:
    """p4c's computeIdsForSymbols: sorted names, hash, linear probing on collisions."""
    taken: set[int] = set()
    ids = {}
    for name in sorted(names):
        value = jenkins_one_at_a_time(name)
        while ((prefix << 24) | (value & 0xFFFFFF)) in taken:
            value = (value + 1) & 0xFFFFFFFF
        ids[name] = (prefix << 24) | (value & 0xFFFFFF)
        taken.add(ids[name])
    return ids


def shortest_unique_suffixes(names: list[str]) -> dict[str, str]:
    aliases = {}
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            suffix = ".".join(parts[-k:])
            if sum(1 for other in names if other == suffix or other.endswith("." + suffix)) < 2:
                break
        aliases[name] = suffix
    return aliases


def _field_width(src: P4Source, expr: str) -> int:
    """Width of a key expression like hdr.ipv4.dstAddr, meta.member_id or standard_metadata.egress_rid."""
    if expr.startswith("standard_metadata."):
        return {"egress_rid": 16, "ingress_port": 9, "egress_spec": 9, "egress_port": 9}[expr.split(".")[1]]
    if expr.startswith("meta."):
        meta_body = re.search(r"struct\s+metadata_t\s*\{(.*?)\}", _STRIP_COMMENTS.sub("", src.text), re.DOTALL).group(1)
        return {f: src.width(t) for t, f in re.findall(r"(bit<\d+>|\w+)\s+(\w+)\s*;", meta_body)}[expr.split(".")[1]]
    _, inst, fld = expr.split(".")
    struct_body = re.search(r"struct\s+headers_t\s*\{(.*?)\}", _STRIP_COMMENTS.sub("", src.text), re.DOTALL).group(1)
    htype = {n: t for t, n in re.findall(r"(\w+)\s+(\w+)\s*;", struct_body)}[inst]
    return dict(src.headers[htype])[fld]


def derive_p4info(src: P4Source | None = None) -> p4info_pb2.P4Info:
    """The P4Info p4c would emit for p4src/ina.p4 (ids, names, aliases, widths, sizes, action refs)."""
    src = src or read_p4()
    actions: dict[str, list[tuple[str, int]]] = {"NoAction": []}
    tables: dict[str, dict] = {}
    counters: dict[str, int] = {}
    registers: dict[str, tuple[int, int]] = {}
    for control, body in src.controls.items():
        for size, name in re.findall(r"counter\((\w+),\s*CounterType\.packets\)\s*(\w+)\s*;", body):
            counters[f"{control}.{name}"] = src.value(size)
        for width, size, name in re.findall(r"register<bit<(\d+)>>\((\w+)\)\s*(\w+)\s*;", body):
            registers[f"{control}.{name}"] = (int(width), src.value(size))
        for name, params in re.findall(r"action\s+(\w+)\s*\(([^)]*)\)", body):
            plist = [p.split() for p in params.split(",") if p.strip()]
            actions[f"{control}.{name}"] = [(pn, src.width(pt)) for pt, pn in plist]
        for name, tbody in re.findall(r"table\s+(\w+)\s*\{(.*?\n    \})", body, re.DOTALL):
            keys = re.findall(r"([\w.]+)\s*:\s*(exact|lpm|ternary)\s*;", re.search(r"key\s*=\s*\{(.*?)\}", tbody, re.DOTALL).group(1))
            acts = re.findall(r"(@defaultonly\s+)?(\w+)\s*;", re.search(r"actions\s*=\s*\{(.*?)\}", tbody, re.DOTALL).group(1))
            full = lambda a, control=control: "NoAction" if a == "NoAction" else f"{control}.{a}"
            const_default = re.search(r"const\s+default_action\s*=\s*(\w+)\s*\(", tbody)
            tables[f"{control}.{name}"] = {
                "keys": [(k, _field_width(src, k), kind) for k, kind in keys],
                "actions": [(full(a), bool(only)) for only, a in acts],
                "size": src.value(re.search(r"size\s*=\s*(\w+)\s*;", tbody).group(1)),
                "const_default": full(const_default.group(1)) if const_default else None,
            }
    ctrl_headers = {h: a for h, a in src.header_annotations.items()}
    ctrl_names = {h: re.search(r"\"(\w+)\"", a).group(1) for h, a in ctrl_headers.items()}

    all_names = list(actions) + list(tables) + list(counters) + list(registers) + list(ctrl_names.values())
    alias = shortest_unique_suffixes(all_names)
    P = p4info_pb2.P4Ids
    action_ids = assign_ids(list(actions), P.ACTION)
    table_ids = assign_ids(list(tables), P.TABLE)
    counter_ids = assign_ids(list(counters), P.COUNTER)
    register_ids = assign_ids(list(registers), P.REGISTER)
    # p4c keys controller headers by the header *type* name (its control-plane name), while the P4Info
    # preamble carries the @controller_header name.
    header_ids = {ctrl_names[h]: i for h, i in assign_ids(list(ctrl_names), P.CONTROLLER_HEADER).items()}

    info = p4info_pb2.P4Info()
    info.pkg_info.arch = "v1model"
    for name in sorted(tables, key=lambda n: table_ids[n]):
        t = info.tables.add()
        t.preamble.id, t.preamble.name, t.preamble.alias = table_ids[name], name, alias[name]
        for i, (key, width, kind) in enumerate(tables[name]["keys"], 1):
            mf = t.match_fields.add(id=i, name=key, bitwidth=width)
            mf.match_type = {"exact": p4info_pb2.MatchField.EXACT, "lpm": p4info_pb2.MatchField.LPM,
                             "ternary": p4info_pb2.MatchField.TERNARY}[kind]
        for a, default_only in tables[name]["actions"]:
            ref = t.action_refs.add(id=action_ids[a])
            if default_only:
                ref.annotations.append("@defaultonly")
                ref.scope = p4info_pb2.ActionRef.DEFAULT_ONLY
        if tables[name]["const_default"]:
            t.const_default_action_id = action_ids[tables[name]["const_default"]]
        t.size = tables[name]["size"]
    for name in sorted(actions, key=lambda n: action_ids[n]):
        a = info.actions.add()
        a.preamble.id, a.preamble.name, a.preamble.alias = action_ids[name], name, alias[name]
        if name == "NoAction":
            a.preamble.annotations.append('@noWarn("unused")')
        for i, (pname, width) in enumerate(actions[name], 1):
            a.params.add(id=i, name=pname, bitwidth=width)
    for name in sorted(counters, key=lambda n: counter_ids[n]):
        c = info.counters.add()
        c.preamble.id, c.preamble.name, c.preamble.alias = counter_ids[name], name, alias[name]
        c.spec.unit = p4info_pb2.CounterSpec.PACKETS
        c.size = counters[name]
    for hname, cname in sorted(ctrl_names.items(), key=lambda kv: header_ids[kv[1]]):
        m = info.controller_packet_metadata.add()
        m.preamble.id, m.preamble.name, m.preamble.alias = header_ids[cname], cname, alias[cname]
        m.preamble.annotations.append(ctrl_headers[hname])
        for i, (fname, width) in enumerate(src.headers[hname], 1):
            m.metadata.add(id=i, name=fname, bitwidth=width)
    for name in sorted(registers, key=lambda n: register_ids[n]):
        r = info.registers.add()
        r.preamble.id, r.preamble.name, r.preamble.alias = register_ids[name], name, alias[name]
        r.type_spec.bitstring.bit.bitwidth = registers[name][0]
        r.size = registers[name][1]
    info.type_info.SetInParent()
    return info


def canonical(info: p4info_pb2.P4Info) -> p4info_pb2.P4Info:
    """A copy with every top-level list sorted by id: p4c emits in declaration order, this file by id."""
    out = p4info_pb2.P4Info()
    out.CopyFrom(info)
    for field_name in ("tables", "actions", "counters", "registers", "controller_packet_metadata"):
        items = sorted(getattr(out, field_name), key=lambda x: x.preamble.id)
        copies = [type(x)() for x in items]
        for c, x in zip(copies, items):
            c.CopyFrom(x)
        out.ClearField(field_name)
        getattr(out, field_name).extend(copies)
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--compare"] and len(argv) == 3:
        a, b = (canonical(load_p4info(f)) for f in argv[1:])
        if a != b:
            print(f"P4Info differs: {argv[1]} vs {argv[2]}")
            return 1
        print("P4Info identical (up to order)")
        return 0
    print(text_format.MessageToString(derive_p4info()), end="")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
