"""The control-plane objects of p4src/ina.p4 (tables, actions, counters, registers) and table semantics.

The names, widths and sizes are the P4Info's (tests/unit/test_p4info.py holds the two together); a
:class:`Table` checks what a P4Runtime write may put in it the way BMv2 does (widths, LPM prefixes,
@defaultonly and const default actions) and looks entries up. The packet path that reads them is
:mod:`p4src.ina_model`.
"""
from __future__ import annotations

from dataclasses import dataclass

from inaproto import wire

__all__ = [
    "ACTIONS", "COUNTERS", "NUM_BINDINGS", "NUM_CELLS", "NUM_CHAINS", "REGISTERS", "TABLES", "ActionScopeError",
    "ActionSpec", "Match", "PipelineError", "Table", "TableEntry", "TableSpec",
]

NUM_CELLS = wire.NUM_SLOTS * 2
NUM_CHAINS = 4096  # ina_chain entries
NUM_BINDINGS = wire.MAX_JOBS * wire.MAX_WORKERS  # table ina_binding, register ina_tx_next: (job, member)


class PipelineError(ValueError):
    """A control-plane request that names something the program does not have, or bad values: the base of the
    errors ``p4src`` raises."""


class ActionScopeError(PipelineError):
    """An action used where the program's annotations forbid it: a @defaultonly action in a table entry (BMv2,
    through PI, answers PERMISSION_DENIED)."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    keys: tuple[tuple[str, int, str], ...]  # (match field name, bitwidth, match kind)
    actions: tuple[str, ...]
    size: int
    default_action: str
    default_only: frozenset[str] = frozenset()  # @defaultonly actions
    const_default: bool = False  # const default_action


@dataclass(frozen=True)
class ActionSpec:
    name: str
    params: tuple[tuple[str, int], ...]


# The program's control-plane objects, as in p4src/ina.p4info.txt (a test checks the two agree).
ACTIONS: dict[str, ActionSpec] = {
    a.name: a
    for a in (
        ActionSpec("NoAction", ()),
        ActionSpec("MyIngress.drop", ()),
        ActionSpec("MyIngress.ipv4_forward", (("dstAddr", 48), ("port", 9))),
        ActionSpec("MyIngress.send_to_cpu", ()),
        ActionSpec(
            "MyIngress.set_job",
            (("base_slot", 16), ("num_slots", 16), ("worker_mask", 32), ("num_workers", 8), ("mcast_grp", 16), ("generation", 16),
             ("owner_epoch", 32)),
        ),
        ActionSpec("MyIngress.bind_member", (("port", 9), ("mac", 48), ("ip", 32), ("udp_port", 16))),
        ActionSpec("MyIngress.bind_link", (("port", 9), ("udp_port", 16), ("next_port", 9), ("next_udp_port", 16))),
        ActionSpec("MyIngress.multicast_to_job", ()),
        ActionSpec("MyIngress.reply_to_sender", ()),
        ActionSpec(
            "MyIngress.set_chain",
            (("member_id", 8), ("upstream_mask", 32), ("num_upstream", 8), ("chain_end", 1), ("next_grp", 16),
             ("final_grp", 16)),
        ),
        ActionSpec("MyIngress.transit", ()),
        ActionSpec("MyIngress.send_onward", ()),
        ActionSpec("MyIngress.stamp_prev_done", ()),  # loss signals (docs/protocol.md)
        ActionSpec("MyIngress.gap_report", ()),
        ActionSpec("MyEgress.drop", ()),
        ActionSpec("MyEgress.set_worker_addr", (("mac", 48), ("ip", 32), ("udp_port", 16))),
    )
}
TABLES: dict[str, TableSpec] = {
    t.name: t
    for t in (
        TableSpec(
            "MyIngress.ipv4_lpm",
            (("hdr.ipv4.dstAddr", 32, "lpm"),),
            ("MyIngress.ipv4_forward", "MyIngress.send_to_cpu", "MyIngress.drop", "NoAction"),
            1024,
            "MyIngress.drop",
        ),
        TableSpec(
            "MyIngress.ina_job",
            (("hdr.ina.job_id", 16, "exact"),),
            ("MyIngress.set_job", "NoAction"),
            wire.MAX_JOBS,
            "NoAction",
            default_only=frozenset({"NoAction"}),
            const_default=True,
        ),
        TableSpec(
            "MyIngress.ina_chain",
            (("hdr.ina.job_id", 16, "exact"), ("hdr.ina.slot", 16, "lpm")),
            ("MyIngress.set_chain", "NoAction"),
            NUM_CHAINS,
            "NoAction",
            default_only=frozenset({"NoAction"}),
            const_default=True,
        ),
        TableSpec(
            "MyIngress.ina_transit",
            (("hdr.ina.job_id", 16, "exact"),),
            ("MyIngress.transit", "NoAction"),
            wire.MAX_JOBS,
            "NoAction",
            default_only=frozenset({"NoAction"}),
            const_default=True,
        ),
        TableSpec(
            "MyIngress.ina_binding",
            (("hdr.ina.job_id", 16, "exact"), ("meta.member_id", 8, "exact")),
            ("MyIngress.bind_member", "MyIngress.bind_link", "NoAction"),
            NUM_BINDINGS,
            "NoAction",
            default_only=frozenset({"NoAction"}),
            const_default=True,
        ),
        TableSpec(
            "MyEgress.ina_worker",
            (("hdr.ina.job_id", 16, "exact"), ("standard_metadata.egress_rid", 16, "exact")),
            ("MyEgress.set_worker_addr", "MyEgress.drop"),
            8192,
            "MyEgress.drop",
            default_only=frozenset({"MyEgress.drop"}),
            const_default=True,
        ),
    )
}
COUNTERS: dict[str, int] = {
    "MyIngress.ina_aggregated": wire.MAX_JOBS,
    "MyIngress.ina_duplicates": wire.MAX_JOBS,
    "MyIngress.ina_drops": wire.NUM_DROP_REASONS,
    "MyIngress.ina_job_drops": wire.MAX_JOBS * wire.NUM_DROP_REASONS,
    "MyEgress.ina_results": wire.MAX_JOBS,
    "MyIngress.ina_partials": wire.MAX_JOBS,
}
REGISTERS: dict[str, tuple[int, int]] = {  # name -> (bitwidth, size)
    "MyIngress.ina_owner": (64, wire.NUM_SLOTS),
    "MyIngress.ina_bitmap": (32, NUM_CELLS),
    "MyIngress.ina_count": (8, NUM_CELLS),
    "MyIngress.ina_overflow": (8, NUM_CELLS),
    "MyIngress.ina_seq": (32, NUM_CELLS),
    "MyIngress.ina_lanes": (32, NUM_CELLS * wire.LANES),
    "MyIngress.ina_final": (8, NUM_CELLS),
    "MyIngress.ina_tx_next": (32, NUM_BINDINGS),
    "MyIngress.ina_last_done": (32, wire.MAX_JOBS),
}

Match = tuple  # exact: (value, ...); lpm: ((value, prefix_len),)


@dataclass(frozen=True)
class TableEntry:
    table: str
    match: Match
    action: str
    params: tuple[int, ...]


class Table:
    """Entries of one match-action table, keyed by their match; the default action is separate."""

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.entries: dict[Match, TableEntry] = {}
        self.default: tuple[str, tuple[int, ...]] = (spec.default_action, ())
        self._lpm_lengths: list[int] = []

    def check(self, match: Match, action: str, params: tuple[int, ...]) -> None:
        spec = self.spec
        if len(match) != len(spec.keys):
            raise PipelineError(f"{spec.name}: expected {len(spec.keys)} match fields, got {len(match)}")
        for value, (fname, width, kind) in zip(match, spec.keys):
            if kind == "lpm":
                v, plen = value
                if not 0 <= plen <= width or not 0 <= v < (1 << width):
                    raise PipelineError(f"{spec.name}: bad LPM value for {fname}")
                if v & ((1 << (width - plen)) - 1):
                    raise PipelineError(f"{spec.name}: {fname} has bits set beyond its prefix length")
            elif not 0 <= value < (1 << width):
                raise PipelineError(f"{spec.name}: {fname} value {value} does not fit in {width} bits")
        if action in spec.default_only:
            raise ActionScopeError(f"{spec.name}: action {action} is @defaultonly: it cannot be used in an entry")
        self.check_action(action, params)

    def check_action(self, action: str, params: tuple[int, ...]) -> None:
        if action not in self.spec.actions:
            raise PipelineError(f"{self.spec.name}: action {action} is not one of {', '.join(self.spec.actions)}")
        aspec = ACTIONS[action]
        if len(params) != len(aspec.params):
            raise PipelineError(f"{action}: expected {len(aspec.params)} parameters, got {len(params)}")
        for value, (pname, width) in zip(params, aspec.params):
            if not 0 <= value < (1 << width):
                raise PipelineError(f"{action}: parameter {pname}={value} does not fit in {width} bits")

    def insert(self, entry: TableEntry) -> None:
        if entry.match in self.entries:
            raise KeyError(f"{self.spec.name}: entry already exists")
        if len(self.entries) >= self.spec.size:
            raise OverflowError(f"{self.spec.name}: table is full ({self.spec.size} entries)")
        self.entries[entry.match] = entry
        self._reindex()

    def clear(self) -> None:
        """No entries, the P4's default action."""
        self.entries.clear()
        self.default = (self.spec.default_action, ())
        self._reindex()

    def modify(self, entry: TableEntry) -> None:
        if entry.match not in self.entries:
            raise LookupError(f"{self.spec.name}: no such entry")
        self.entries[entry.match] = entry

    def delete(self, match: Match) -> None:
        if match not in self.entries:
            raise LookupError(f"{self.spec.name}: no such entry")
        del self.entries[match]
        self._reindex()

    def _reindex(self) -> None:
        if len(self.spec.keys) == 1 and self.spec.keys[0][2] == "lpm":
            self._lpm_lengths = sorted({m[0][1] for m in self.entries}, reverse=True)

    def lookup_lpm(self, value: int) -> TableEntry | None:
        entries = self.entries
        for plen in self._lpm_lengths:
            masked = (value >> (32 - plen)) << (32 - plen) if plen else 0
            e = entries.get(((masked, plen),))
            if e is not None:
                return e
        return None
