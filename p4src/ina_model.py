"""Executable model of p4src/ina.p4 on v1model, as BMv2 simple_switch runs it: the program's one model in Python.

Read it side by side with the P4: the controls, tables, actions, counters and registers carry the P4's names
(``MyIngress.ina_job``, ``ina_bitmap`` ...) and the steps come in the same order, each method marked with the
P4 block it models (``_ingress`` is ``MyIngress.apply``'s steps 1-3, ``_check`` step 4, ``_gradient`` step 6
...). Control-plane state (tables, multicast groups, counters) is addressed by P4Info names, so the P4Runtime
server and the tests drive it exactly as they would drive BMv2; what BMv2 does around the program (drop port,
order of multicast copies) is :mod:`p4src.v1model`.

Hot path: struct, bytes and Python integers only. The lanes register lives in a bytearray in wire order (the
numpy array ``ina_lanes`` is a view of it), so a contribution is added to a slot with one SWAR addition on a
1024-bit integer (32 int32 lanes at once, carries stopped at lane boundaries) and overflow is the P4's
``(cur ^ sum) & (value ^ sum)`` sign test on all lanes at once; the IPv4 checksum is the 16-bit one's
complement sum computed as the header's integer value modulo 0xFFFF. Multicast replicas share everything but
the addresses set_worker_addr writes, so they are joined from pieces cut once per packet.

BMv2 behaviours modelled on purpose: a parser error does not drop by itself (ingress checks
``parser_error``); an unset ``egress_spec`` is port 0; ``mark_to_drop`` sets port 511 and clears
``mcast_grp``; the IPv4 checksum is verified and recomputed over the 20-byte base header.
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Sequence

import numpy as np

from inaproto import wire
from inaproto.wire import DropReason, MsgType
from p4src.tables import COUNTERS, NUM_BINDINGS, NUM_CELLS, TABLES, Match, PipelineError, Table, TableEntry
from p4src.v1model import DROP_PORT, replication_order

__all__ = ["InaPipeline", "Output"]

Output = list[tuple[int, bytes]]  # what a frame makes the switch emit: (egress port, frame), in emission order

TYPE_IPV4 = 0x0800
PROTO_UDP = 17
INT32 = wire.LANES_DTYPE

# Everything the INA path reads, from a frame's first byte: etherType; version/ihl, totalLen, protocol; UDP
# dstPort, length; then ina_t as wire.HEADER.
_INA_HEADERS = struct.Struct("!12xHBxH5xB12xHH2x" + wire.HEADER_FORMAT)
_U16 = struct.Struct("!H")
_O_IP = wire.ETH_LEN
_O_UDP = _O_IP + wire.IPV4_LEN
_O_INA = wire.INA_OFFSET
_O_FLAGS = _O_INA + wire.INA_FIELD_OFFSETS["flags"]
_O_JOB = _O_INA + wire.INA_FIELD_OFFSETS["job_id"]
_O_WORKER = _O_INA + wire.INA_FIELD_OFFSETS["worker_id"]
_O_SLOT = _O_INA + wire.INA_FIELD_OFFSETS["slot"]
_O_RESERVED = _O_INA + wire.INA_FIELD_OFFSETS["reserved_shadow"]  # reserved:7 | shadow:1
_O_DATA = wire.INA_OFFSET + wire.INA_HEADER_LEN
_INA_END = _O_DATA + wire.INA_DATA_LEN
_CELL_BYTES = wire.LANES * 4
_INA_PORT = _U16.pack(wire.INA_UDP_PORT)
# Enum members as plain ints for the hot path (an IntEnum attribute lookup costs as much as a dict lookup).
_GRADIENT, _RESULT, _BROADCAST = int(MsgType.GRADIENT), int(MsgType.RESULT), int(MsgType.BROADCAST)
_QUERY, _STATUS, _HELD = int(MsgType.QUERY), int(MsgType.STATUS), int(wire.Flags.HELD)
_OVERFLOW = int(wire.Flags.OVERFLOW)
_RETRANSMIT = int(wire.Flags.RETRANSMIT)
_TX_COUNTED, _GAP, _PREV_DONE = int(wire.Flags.TX_COUNTED), int(wire.Flags.GAP), int(wire.Flags.PREV_DONE)
_TX_LATE_HALF = wire.TX_LATE_HALF  # INA_TX_LATE_HALF
# SWAR masks over LANES int32 lanes in one big-endian integer: each lane's sign bit, and the bits below it.
_SIGNS = int.from_bytes(b"\x80\x00\x00\x00" * wire.LANES, "big")
_LOWS = int.from_bytes(b"\x7f\xff\xff\xff" * wire.LANES, "big")
_NO_CHAIN = (0, 0, 0, 0)  # meta.chain, own_member_id, chain_end, next_grp of a slot without an ina_chain entry


def _carry_gap(buf: bytearray, gap: tuple[int, bytes] | None) -> None:
    """MyEgress on the sender's replica of a completion that revealed a gap (``gap``: meta.gap_worker and the
    packed meta.gap_slot), and the answer to a resend that did: GAP and the slot field."""
    if gap is not None and buf[_O_WORKER] == gap[0]:
        buf[_O_FLAGS] |= _GAP
        buf[_O_SLOT : _O_SLOT + 2] = gap[1]


def _csum16_folded(header: bytes | bytearray) -> int:
    """The folded 16-bit one's complement sum of a 20-byte header (as wire.ipv4_checksum folds it, before ~).

    2**16 is 1 modulo 0xFFFF, so the sum of the 16-bit words equals the header's integer value modulo 0xFFFF;
    a folded sum is 0 only for an all-zero header and 0xFFFF for any other multiple of 0xFFFF.
    """
    x = int.from_bytes(header, "big")
    r = x % 0xFFFF
    return 0xFFFF if r == 0 and x else r


def _ipv4_checksum_ok(header: bytes | bytearray) -> bool:
    """BMv2's verify_checksum(csum16): the checksum of the other 19 bytes' fields equals the field exactly
    (so 0xFFFF is not accepted where the computed value is 0x0000, although both fold to the same sum)."""
    x = int.from_bytes(header, "big")
    field = (x >> 64) & 0xFFFF  # hdrChecksum: bytes 10-11 of 20
    x ^= field << 64
    r = x % 0xFFFF
    folded = 0xFFFF if r == 0 and x else r
    return field == 0xFFFF - folded


class InaPipeline:
    """The switch's data plane: ``process(port, frame)`` returns the frames it emits, as [(port, frame)].

    Public, for the control plane and for readers: ``tables`` (by P4Info name), ``multicast_groups`` (group ->
    its (port, rid) replicas in the order BMv2 makes the copies), ``counters`` (by P4Info name) and the
    registers (``ina_owner``, ``ina_bitmap`` ... as lists, ``ina_lanes`` as a numpy view); write them through
    the methods, which keep the packet path's lookups current.
    """

    def __init__(self) -> None:
        self.tables = {name: Table(spec) for name, spec in TABLES.items()}
        self.multicast_groups: dict[int, tuple[tuple[int, int], ...]] = {}  # group -> ((port, rid), ...)
        self.counters: dict[str, list[int]] = {name: [0] * size for name, size in COUNTERS.items()}
        self.lock = threading.Lock()  # held by process() and by control-plane writes
        self.reset_registers()
        # The tables as the packet path reads them (rebuilt on every control-plane write, _refresh).
        self._job: dict[int, tuple[int, ...]] = {}
        # table ina_binding as what the frame must carry: (job, member) -> (port, src MAC, src IPv4, src UDP port).
        self._binding: dict[tuple[int, int], tuple[int, bytes, bytes, bytes]] = {}
        # its bind_link entries (chains): (job, member) -> the (port, src UDP port) pairs it may come from.
        self._link_binding: dict[tuple[int, int], frozenset[tuple[int, bytes]]] = {}
        # table ina_worker as the bytes the egress writes: (job, rid) -> (mac, ip, udp_port, worker_id, ip as int),
        # or None for an entry whose action is drop.
        self._worker: dict[tuple[int, int], tuple[bytes, bytes, bytes, bytes, int] | None] = {}
        self._worker_default_drop = True
        # Chains: job -> ((shift, slot >> shift, set_chain params), ...), longest prefix first; transit jobs.
        self._chain: dict[int, tuple[tuple[int, int, tuple[int, ...]], ...]] = {}
        self._transit: frozenset[int] = frozenset()
        self._chain_hits: dict[int, tuple[int, ...] | None] = {}  # _chain_lookup's answers
        # (group, job) -> each replica's port and ina_worker entry as _worker holds it (False: a miss): _replicate's
        self._copies: dict[tuple[int, int], tuple[tuple[int, tuple | None | bool], ...]] = {}
        self._lpm = self.tables["MyIngress.ipv4_lpm"]

    # --- registers: data-plane state only; BMv2 cannot read or write them over P4Runtime -------------
    def reset_registers(self) -> None:
        self.ina_owner = [0] * wire.NUM_SLOTS
        self.ina_bitmap, self.ina_count, self.ina_overflow, self.ina_seq, self.ina_final = (
            [0] * NUM_CELLS for _ in range(5))
        # Loss signals (docs/protocol.md): per (job, member) generation << 8 | 0x80 | the transmission counter
        # expected next (0: none seen), index job_id * 32 + worker_id; per job the same with seq & 0x7F of its
        # latest counted completion.
        self.ina_tx_next = [0] * NUM_BINDINGS
        self.ina_last_done = [0] * wire.MAX_JOBS
        # Lanes in wire order (big-endian int32), cell after cell; ina_lanes is a (NUM_CELLS, LANES) view of it.
        self._lanes_buf = bytearray(NUM_CELLS * _CELL_BYTES)
        self.ina_lanes = np.frombuffer(self._lanes_buf, dtype=INT32).reshape(NUM_CELLS, wire.LANES)

    def register_snapshot(self) -> tuple:
        """A copy of every register, for tests that assert 'no state change'."""
        return (
            list(self.ina_owner), list(self.ina_bitmap), list(self.ina_count), list(self.ina_overflow), list(self.ina_seq),
            list(self.ina_final), list(self.ina_tx_next), list(self.ina_last_done), self.ina_lanes.astype(np.int32),
        )

    # --- control plane, by P4Info names ------------------------------------------------------------
    def table(self, name: str) -> Table:
        try:
            return self.tables[name]
        except KeyError:
            raise PipelineError(f"no table named {name}") from None

    def insert_entry(self, table: str, match: Match, action: str, params: tuple[int, ...] = ()) -> None:
        t = self.table(table)
        t.check(match, action, tuple(params))
        with self.lock:
            t.insert(TableEntry(table, tuple(match), action, tuple(params)))
            self._refresh()

    def modify_entry(self, table: str, match: Match, action: str, params: tuple[int, ...] = ()) -> None:
        t = self.table(table)
        t.check(match, action, tuple(params))
        with self.lock:
            t.modify(TableEntry(table, tuple(match), action, tuple(params)))
            self._refresh()

    def delete_entry(self, table: str, match: Match) -> None:
        with self.lock:
            self.table(table).delete(tuple(match))
            self._refresh()

    def set_default_action(self, table: str, action: str, params: tuple[int, ...] = ()) -> None:
        t = self.table(table)
        if t.spec.const_default:
            raise PipelineError(f"{table}: the default action is const and cannot be changed")
        t.check_action(action, tuple(params))
        with self.lock:
            t.default = (action, tuple(params))
            self._refresh()

    def set_multicast_group(self, group: int, replicas: list[tuple[int, int]]) -> None:
        """Create the group, or replace its replicas; copies are made in BMv2's order (``v1model.replication_order``)."""
        if not 0 < group < (1 << 16):
            raise PipelineError(f"multicast group id {group} out of range 1..65535")
        if any(int(p) == DROP_PORT for p, _ in replicas):
            raise PipelineError(f"multicast group {group}: port {DROP_PORT} is the drop port, not a replica port")
        replicas = [(int(p), int(r)) for p, r in replicas]
        with self.lock:
            self.multicast_groups[group] = replication_order(replicas, self.multicast_groups.get(group))
            self._copies = {}

    def delete_multicast_group(self, group: int) -> None:
        with self.lock:
            if group not in self.multicast_groups:
                raise LookupError(f"no multicast group {group}")
            del self.multicast_groups[group]
            self._copies = {}

    def reset(self) -> None:
        """The state of a freshly loaded program: tables empty with their P4 default actions, no multicast groups,
        counters and registers zero (what SetForwardingPipelineConfig does on BMv2)."""
        with self.lock:
            for table in self.tables.values():
                table.clear()
            self.multicast_groups.clear()
            self._copies = {}
            for values in self.counters.values():
                values[:] = [0] * len(values)
            self.reset_registers()
            self._refresh()

    def counter(self, name: str) -> list[int]:
        try:
            return self.counters[name]
        except KeyError:
            raise PipelineError(f"no counter named {name}") from None

    def _refresh(self) -> None:
        """The packet path's lookups from the tables (after every control-plane write)."""
        self._job = {e.match[0]: e.params for e in self.tables["MyIngress.ina_job"].entries.values() if e.action == "MyIngress.set_job"}
        bindings = self.tables["MyIngress.ina_binding"].entries.values()
        self._binding = {
            e.match: (e.params[0], e.params[1].to_bytes(6, "big"), e.params[2].to_bytes(4, "big"), _U16.pack(e.params[3]))
            for e in bindings if e.action == "MyIngress.bind_member"
        }
        self._link_binding = {
            e.match: frozenset({(e.params[0], _U16.pack(e.params[1])), (e.params[2], _U16.pack(e.params[3]))})
            for e in bindings if e.action == "MyIngress.bind_link"
        }
        workers = self.tables["MyEgress.ina_worker"]
        self._worker = {
            e.match: (e.params[0].to_bytes(6, "big"), e.params[1].to_bytes(4, "big"), _U16.pack(e.params[2]),
                      bytes((e.match[1] & 0xFF,)), e.params[1])
            if e.action == "MyEgress.set_worker_addr" else None
            for e in workers.entries.values()
        }
        self._worker_default_drop = workers.default[0] == "MyEgress.drop"
        chains: dict[int, list[tuple[int, int, int, tuple[int, ...]]]] = {}
        for (job_id, (prefix, plen)), e in self.tables["MyIngress.ina_chain"].entries.items():
            shift = 16 - plen
            chains.setdefault(job_id, []).append((plen, shift, prefix >> shift, e.params))
        self._chain = {j: tuple((s, k, p) for _, s, k, p in sorted(c, reverse=True)) for j, c in chains.items()}
        self._transit = frozenset(m[0] for m in self.tables["MyIngress.ina_transit"].entries)
        self._chain_hits = {}
        self._copies = {}

    def _chain_lookup(self, job_id: int, slot: int, cache: bool) -> tuple[int, ...] | None:
        """table ina_chain for (job_id, slot): the longest prefix's set_chain params, or None on a miss; kept in
        ``_chain_hits`` (by job_id << 16 | slot) until the next control-plane write when ``cache`` (a slot within
        the job's range: a frame naming any other slot is dropped, and must not grow the cache)."""
        params = None
        for shift, key, entry in self._chain.get(job_id, ()):
            if slot >> shift == key:
                params = entry
                break
        if cache:
            self._chain_hits[(job_id << 16) | slot] = params
        return params

    # --- the packet path: V1Switch(MyParser, MyVerifyChecksum, MyIngress, MyEgress, MyComputeChecksum, MyDeparser)
    def process(self, ingress_port: int, frame: bytes) -> Output:
        """One frame received on ``ingress_port`` through the whole switch: the frames it emits."""
        with self.lock:
            return self._process(ingress_port, frame)

    def process_frames(self, ingress_port: int, frames: Sequence[bytes] | np.ndarray) -> Output:
        """``process`` for each frame in turn, under one hold of the lock, the outputs concatenated: one port's
        frames as bytes, or as the rows of an (n, length) uint8 array."""
        if isinstance(frames, np.ndarray):
            blob, size = frames.tobytes(), frames.shape[1]
            frames = [blob[o : o + size] for o in range(0, len(blob), size)]
        out: Output = []
        with self.lock:
            for frame in frames:
                out += self._process(ingress_port, frame)
        return out

    def _process(self, ingress_port: int, frame: bytes) -> Output:
        # MyParser, the common case at once: a whole INA packet from a data port goes start -> parse_ethernet ->
        # parse_ipv4 -> parse_udp -> parse_ina -> accept with no parser error (_parse reaches the same states).
        if ingress_port != wire.CPU_PORT and len(frame) >= _INA_END:
            h = _INA_HEADERS.unpack_from(frame)
            if h[0] == TYPE_IPV4 and h[1] & 0x0F == 5 and h[3] == PROTO_UDP and h[4] == wire.INA_UDP_PORT:
                if not _ipv4_checksum_ok(frame[_O_IP:_O_UDP]):  # MyVerifyChecksum
                    self.counters["MyIngress.ina_drops"][DropReason.MALFORMED] += 1
                    return []
                return self._ina(ingress_port, frame, h)
        return self._ingress(ingress_port, frame, *self._parse(ingress_port, frame))

    @staticmethod
    def _parse(ingress_port: int, frame: bytes) -> tuple[int, int | None, bool, bool, bool, bool]:
        """MyParser and MyVerifyChecksum: (offset of the Ethernet header, packet_out.egress_port or None,
        parser_error, checksum_error, hdr.ipv4.isValid(), hdr.ina.isValid())."""
        n = len(frame)
        off, packet_out_port = 0, None
        if ingress_port == wire.CPU_PORT:  # state parse_packet_out
            if n < 2:
                return 0, None, True, False, False, False
            packet_out_port, off = _U16.unpack_from(frame, 0)[0] >> 7, 2
        if n - off < wire.ETH_LEN:
            return off, packet_out_port, True, False, False, False
        if _U16.unpack_from(frame, off + 12)[0] != TYPE_IPV4:  # state parse_ethernet
            return off, packet_out_port, False, False, False, False
        if n - off < wire.ETH_LEN + wire.IPV4_LEN:  # state parse_ipv4
            return off, packet_out_port, True, False, False, False
        ip0 = off + wire.ETH_LEN
        # MyVerifyChecksum: csum16 over the 20-byte base header
        checksum_error = not _ipv4_checksum_ok(frame[ip0 : ip0 + 20])
        if frame[ip0] & 0x0F != 5 or frame[ip0 + 9] != PROTO_UDP:
            return off, packet_out_port, False, checksum_error, True, False
        if n - off < _O_INA:  # state parse_udp
            return off, packet_out_port, True, checksum_error, True, False
        if _U16.unpack_from(frame, off + _O_UDP + 2)[0] != wire.INA_UDP_PORT:
            return off, packet_out_port, False, checksum_error, True, False
        if n - off < _O_DATA:  # state parse_ina
            return off, packet_out_port, True, checksum_error, True, False
        if frame[off + _O_INA] != _QUERY and n - off < _INA_END:  # state parse_ina_data (a query is header only)
            return off, packet_out_port, True, checksum_error, True, False
        return off, packet_out_port, False, checksum_error, True, True

    def _ingress(self, ingress_port: int, frame: bytes, off: int, packet_out_port: int | None, parser_error: bool,
                 checksum_error: bool, ipv4_valid: bool, ina_valid: bool) -> Output:
        """MyIngress.apply, steps 1-3; an INA packet goes on to ``_ina``."""
        # 1. Packet-out from the controller: send as told (egress and the deparser still run).
        if packet_out_port is not None:
            return self._egress(ingress_port, packet_out_port, 0, bytearray(frame[off:]), ina_out=False, ina_mcast=False)
        # 2. Malformed frames never reach any state.
        if parser_error or checksum_error:
            self.counters["MyIngress.ina_drops"][DropReason.MALFORMED] += 1
            return []
        if not ipv4_valid:
            return []
        # 3. Not INA: IPv4 LPM forwarding.
        if not ina_valid:
            return self._ipv4_lpm(ingress_port, frame)
        return self._ina(ingress_port, frame, _INA_HEADERS.unpack_from(frame))

    def _ina(self, ingress_port: int, frame: bytes, headers: tuple) -> Output:
        """MyIngress.apply from step 3 on, for a valid INA packet (``headers``: _INA_HEADERS of the frame)."""
        _, _, total_len, _, _, udp_len, msg_type, flags, job_id, generation, slot, seq, worker_id, last = headers
        # 3. (chains) INA of a job this switch only carries: IPv4 LPM forwarding (table ina_transit).
        if job_id in self._transit:
            return self._ipv4_lpm(ingress_port, frame)
        meta = self._check(ingress_port, frame, msg_type, total_len, udp_len, job_id, generation, slot, worker_id)
        if meta is None:
            return []
        slot_abs, owner, num_workers, mcast_grp, chain = meta
        # 5. Broadcast: to every worker of the job, payload as it is.
        if msg_type == _BROADCAST:
            out = bytearray(frame)
            self._multicast_to_job(out)
            return self._replicate(mcast_grp, out, ingress_port)
        cell = (slot_abs << 1) + (last & 1)  # the copy hdr.ina.shadow names
        if msg_type == _QUERY:
            return self._query(ingress_port, frame, seq, worker_id, slot_abs, cell, owner)
        if msg_type == _RESULT:
            return self._final_sum(ingress_port, frame, flags, job_id, seq, slot_abs, cell, owner, mcast_grp)
        return self._gradient(ingress_port, frame, flags, job_id, generation, seq, worker_id, last, slot_abs, cell,
                              owner, num_workers, mcast_grp, chain)

    def _check(self, ingress_port: int, frame: bytes, msg_type: int, total_len: int, udp_len: int, job_id: int,
               generation: int, slot: int, worker_id: int) -> tuple[int, int, int, int, tuple[int, int, int, int]] | None:
        """4. INA: validate lengths, job (ina_job, ina_chain), message type, generation, worker, binding
        (ina_binding), slot. A drop is counted here and gives None; else (meta.slot_abs, meta.owner,
        meta.num_workers, meta.mcast_grp, (meta.chain, own_member_id, chain_end, next_grp))."""
        ina_drops = self.counters["MyIngress.ina_drops"]
        if msg_type == _QUERY:
            malformed = total_len != wire.INA_QUERY_IPV4_LEN or udp_len != wire.INA_QUERY_UDP_LEN
        else:
            malformed = total_len != wire.INA_IPV4_LEN or udp_len != wire.INA_UDP_LEN
        if malformed:
            ina_drops[DropReason.MALFORMED] += 1
            return None
        job = self._job.get(job_id) if job_id < wire.MAX_JOBS else None  # job ids beyond the counters; table ina_job
        if job is None:
            ina_drops[DropReason.UNKNOWN_JOB] += 1
            return None
        base_slot, num_slots, worker_mask, num_workers, mcast_grp, job_generation, owner_epoch = job
        chain = _NO_CHAIN
        if job_id in self._chain:  # table ina_chain: upstream members join the mask, final_grp replaces mcast_grp
            params = self._chain_hits.get((job_id << 16) | slot, False)
            if params is False:
                params = self._chain_lookup(job_id, slot, slot < num_slots)
            if params is not None:  # action set_chain
                own_member_id, upstream_mask, num_upstream, chain_end, next_grp, mcast_grp = params
                chain = (1, own_member_id, chain_end, next_grp)
                worker_mask |= upstream_mask
                num_workers = (num_workers + num_upstream) & 0xFF
        # 4b. Ingress binding: the sender must be where (job, member) was bound (table ina_binding); a member
        # bound by link (bind_link, chains) by its ingress port and UDP port only, on one of its two links.
        binding = self._binding.get((job_id, worker_id))  # meta.member_id = hdr.ina.worker_id
        if binding is not None:  # bind_member
            bound = ingress_port == binding[0] and frame[6:12] == binding[1] and \
                frame[_O_IP + 12 : _O_IP + 16] == binding[2] and frame[_O_UDP : _O_UDP + 2] == binding[3]
        else:
            links = self._link_binding.get((job_id, worker_id))
            bound = links is not None and (ingress_port, frame[_O_UDP : _O_UDP + 2]) in links
        slot_abs = base_slot + slot
        in_range = slot < num_slots and slot_abs < wire.NUM_SLOTS
        drop_reason = 0
        if msg_type != _GRADIENT and msg_type != _BROADCAST and not (msg_type == _RESULT and chain[0]) and \
                not (msg_type == _QUERY and not chain[0]):
            drop_reason = DropReason.BAD_MSG_TYPE
        elif generation != job_generation:
            drop_reason = DropReason.STALE_GENERATION
        elif msg_type == _RESULT:
            if worker_id != chain[1]:
                drop_reason = DropReason.NOT_RECIPIENT
            elif not bound:
                drop_reason = DropReason.SPOOFED  # bound under the recipient's own id: where final sums come from
            elif not in_range:
                drop_reason = DropReason.SLOT_OUT_OF_RANGE
        elif worker_mask & (1 << worker_id) & 0xFFFFFFFF == 0:  # meta.wbit: 0 for worker_id >= 32
            drop_reason = DropReason.FOREIGN_WORKER
        elif not bound:
            drop_reason = DropReason.SPOOFED
        elif (msg_type == _GRADIENT or msg_type == _QUERY) and not in_range:
            drop_reason = DropReason.SLOT_OUT_OF_RANGE
        if drop_reason:
            ina_drops[drop_reason] += 1
            self.counters["MyIngress.ina_job_drops"][job_id * wire.NUM_DROP_REASONS + drop_reason] += 1
            return None
        owner = (owner_epoch << 32) | (job_id << 16) | generation  # owner_epoch ++ job_id ++ generation
        return slot_abs, owner, num_workers, mcast_grp, chain

    def _query(self, ingress_port: int, frame: bytes, seq: int, worker_id: int, slot_abs: int, cell: int, owner: int
               ) -> Output:
        """6q. Query: the stored sum if the sender's contribution is in a complete copy, a status with HELD if in
        an incomplete one, else a status without it; only to the sender, no state changes."""
        out = bytearray(frame)
        out[_O_INA] = _STATUS
        out[_O_FLAGS] = 0
        if self.ina_owner[slot_abs] == owner and self.ina_seq[cell] == seq and self.ina_bitmap[cell] & (1 << worker_id):
            if self.ina_count[cell] == 0:
                o = cell * _CELL_BYTES
                out[_O_DATA:_O_DATA] = self._lanes_buf[o : o + _CELL_BYTES]  # setValid, READ_LANE x LANES
                out[_O_INA] = _RESULT
                out[_O_FLAGS] = _OVERFLOW if self.ina_overflow[cell] else 0
                out[_O_IP + 2 : _O_IP + 4] = _U16.pack(wire.INA_IPV4_LEN)
                out[_O_UDP + 4 : _O_UDP + 6] = _U16.pack(wire.INA_UDP_LEN)
            else:
                out[_O_FLAGS] = _HELD
        self._reply_to_sender(out)
        return self._egress(ingress_port, ingress_port, 0, out, ina_out=True, ina_mcast=False)

    def _final_sum(self, ingress_port: int, frame: bytes, flags: int, job_id: int, seq: int, slot_abs: int, cell: int,
                   owner: int, final_grp: int) -> Output:
        """6c. Chains: the final sum reaching this switch, kept in a complete copy of the same chunk that holds the
        partial this switch sent onward, then sent to final_grp; anything else is a duplicate."""
        if (self.ina_owner[slot_abs] == owner and self.ina_bitmap[cell] != 0 and self.ina_count[cell] == 0
                and self.ina_seq[cell] == seq and self.ina_final[cell] == 0):
            o = cell * _CELL_BYTES
            self._lanes_buf[o : o + _CELL_BYTES] = frame[_O_DATA:_INA_END]  # STORE_LANE x LANES
            self.ina_final[cell] = 1
            self.ina_overflow[cell] = 1 if flags & _OVERFLOW else 0
            out = bytearray(frame)
            out[_O_FLAGS] = flags & _OVERFLOW
            self._multicast_to_job(out)
            return self._replicate(final_grp, out, ingress_port)
        self.counters["MyIngress.ina_duplicates"][job_id] += 1
        return []

    def _gradient(self, ingress_port: int, frame: bytes, flags: int, job_id: int, generation: int, seq: int,
                  worker_id: int, last: int, slot_abs: int, cell: int, owner: int, num_workers: int, mcast_grp: int,
                  chain: tuple[int, int, int, int]) -> Output:
        """6. Gradient: the loss signals' counter (6t), a slot whose owner changed (another job, or a new
        generation) reset, then the copy's state decides: a new contribution (6a) or one seen before (6b)."""
        # 6t. Loss signals (docs/protocol.md, "Loss signals"): a counted gradient of a job not on a chain checks
        # its sender's transmission counter against the one expected next (none: not yet, or of another
        # generation); in sequence, or a gap (1 .. INA_TX_LATE_HALF - 1 ahead), the next one is written now,
        # whatever the frame's fate, and the frame's fate says how the gap is reported: a dropped frame becomes
        # the gap report, a delivered one carries it to its sender (the sender's copy of a completion, or the
        # answer to a resend); a late frame (INA_TX_LATE_HALF or more ahead, i.e. behind: reordered or
        # duplicated) neither reports nor writes, and is otherwise as in sequence.
        gap = None  # (meta.gap_worker, meta.gap_slot packed), or the gap report's tx_ahead while not delivered
        tx_counted = flags & _TX_COUNTED and not chain[0]
        if tx_counted:
            reserved = last >> 1
            tx_idx = (job_id << 5) + worker_id
            tx_next = self.ina_tx_next[tx_idx]
            tx_ahead = (reserved - tx_next) & 0x7F if tx_next & 0x80 and tx_next >> 8 == generation else 0
            if tx_ahead < _TX_LATE_HALF:
                if tx_ahead:
                    gap = (worker_id, _U16.pack(wire.gap_slot(tx_ahead, reserved)), tx_ahead)
                self.ina_tx_next[tx_idx] = (generation << 8) | 0x80 | ((reserved + 1) & 0x7F)
        if self.ina_owner[slot_abs] != owner:
            self.ina_owner[slot_abs] = owner
            c0 = slot_abs << 1
            self.ina_bitmap[c0] = self.ina_bitmap[c0 + 1] = 0
            self.ina_count[c0] = self.ina_count[c0 + 1] = 0
            self.ina_overflow[c0] = self.ina_overflow[c0 + 1] = 0
            self.ina_seq[c0] = self.ina_seq[c0 + 1] = (seq - 1) & 0xFFFFFFFF
        # A worker's bit not in the copy: its contribution to the round in progress (same seq), or the start of
        # the copy's next round (newer seq, copy empty or complete). Anything else is a late packet of a round
        # the copy already finished, which the network delayed or reordered: never added.
        wbit = 1 << worker_id
        bitmap, count = self.ina_bitmap[cell], self.ina_count[cell]
        age = (seq - self.ina_seq[cell]) & 0xFFFFFFFF
        if bitmap & wbit == 0 and ((age != 0 and age < 0x80000000) if count == 0 else age == 0):
            return self._aggregate(ingress_port, frame, flags, job_id, generation, seq, wbit, cell, count,
                                   num_workers, mcast_grp, chain, tx_counted, gap)
        # 6b. Seen before: a completed copy answers its sender alone; anything else is dropped.
        self.counters["MyIngress.ina_duplicates"][job_id] += 1
        if count != 0 or age != 0 or bitmap & wbit == 0:
            return self._gap_report(frame, ingress_port, gap[2]) if gap else []
        return self._answer(ingress_port, frame, job_id, cell, chain, tx_counted, gap)

    def _aggregate(self, ingress_port: int, frame: bytes, flags: int, job_id: int, generation: int, seq: int,
                   wbit: int, cell: int, count: int, num_workers: int, mcast_grp: int, chain: tuple[int, int, int, int],
                   tx_counted: int, gap: tuple[int, bytes, int] | None) -> Output:
        """6a. A new contribution: mark it in this copy, clear it in the other (SwitchML's shadow sets), add the
        lanes (AGGREGATE_LANE x LANES); the last one completes the copy and its sum leaves."""
        self.ina_bitmap[cell] |= wbit
        self.ina_bitmap[cell ^ 1] &= ~wbit & 0xFFFFFFFF  # meta.other_cell
        first = count == 0
        overflow = 0 if first else self.ina_overflow[cell]
        if first:
            self.ina_seq[cell] = seq
            if chain[0]:
                self.ina_final[cell] = 0
        if chain[0] and flags & _OVERFLOW:
            overflow = 1  # an upstream partial that overflowed
        count = (count + 1) & 0xFF
        complete = count == num_workers
        self.ina_count[cell] = 0 if complete else count
        # AGGREGATE_LANE x LANES, all lanes at once (see the module docstring)
        o = cell * _CELL_BYTES
        if first:  # cur = 0: the sum is the value, and no lane can overflow
            total = frame[_O_DATA:_INA_END]
        else:
            cur = int.from_bytes(self._lanes_buf[o : o + _CELL_BYTES], "big")
            value = int.from_bytes(frame[_O_DATA:_INA_END], "big")
            s = ((cur & _LOWS) + (value & _LOWS)) ^ ((cur ^ value) & _SIGNS)  # int32 wraps, as bit<32> does
            if (cur ^ s) & (value ^ s) & _SIGNS:
                overflow = 1
            total = s.to_bytes(_CELL_BYTES, "big")
        self._lanes_buf[o : o + _CELL_BYTES] = total
        self.ina_overflow[cell] = overflow
        self.counters["MyIngress.ina_aggregated"][job_id] += 1
        if not complete:
            return self._gap_report(frame, ingress_port, gap[2]) if gap else []
        out = bytearray(frame)
        out[_O_DATA:_INA_END] = total
        out[_O_INA] = _RESULT
        out[_O_FLAGS] = _OVERFLOW if overflow else 0
        if chain[0] and not chain[2]:  # chains: the partial goes on; the copy waits for the final sum
            return self._send_onward(out, job_id, chain[1], chain[3], ingress_port)
        if chain[0]:
            self.ina_final[cell] = 1
        if tx_counted:
            self._stamp_prev_done(out, job_id, generation, seq)
        self._multicast_to_job(out)
        return self._replicate(mcast_grp, out, ingress_port, gap)  # MyEgress: the sender's copy carries its gap

    def _answer(self, ingress_port: int, frame: bytes, job_id: int, cell: int, chain: tuple[int, int, int, int],
                tx_counted: int, gap: tuple[int, bytes, int] | None) -> Output:
        """6b, a copy that holds the sender's contribution and is complete: READ_LANE x LANES, then the sum to
        the sender alone, or (chains) the partial onward again while the copy waits for the final sum."""
        o = cell * _CELL_BYTES
        out = bytearray(frame)
        out[_O_DATA:_INA_END] = self._lanes_buf[o : o + _CELL_BYTES]
        out[_O_INA] = _RESULT
        out[_O_FLAGS] = _OVERFLOW if self.ina_overflow[cell] else 0
        if chain[0] and self.ina_final[cell] != 1:
            out[_O_FLAGS] |= _RETRANSMIT
            return self._send_onward(out, job_id, chain[1], chain[3], ingress_port)
        if tx_counted:
            out[_O_RESERVED] &= 1  # an answer to a resend carries no PREV_DONE: reserved 0
            _carry_gap(out, gap)
        self._reply_to_sender(out)
        return self._egress(ingress_port, ingress_port, 0, out, ina_out=True, ina_mcast=False)

    # --- MyIngress actions -------------------------------------------------------------------------
    @staticmethod
    def _multicast_to_job(out: bytearray) -> None:
        """action multicast_to_job: source becomes the address the worker sent to."""
        out[6:12] = out[0:6]
        out[_O_IP + 12 : _O_IP + 16] = out[_O_IP + 16 : _O_IP + 20]
        out[_O_UDP : _O_UDP + 2] = _INA_PORT

    def _send_onward(self, out: bytearray, job_id: int, member_id: int, next_grp: int, ingress_port: int) -> Output:
        """action send_onward (chains): the copy's sum to the next hop as one contribution under member_id."""
        out[_O_INA] = _GRADIENT
        out[_O_WORKER] = member_id
        self._multicast_to_job(out)
        self.counters["MyIngress.ina_partials"][job_id] += 1
        return self._replicate(next_grp, out, ingress_port)

    def _stamp_prev_done(self, out: bytearray, job_id: int, generation: int, seq: int) -> None:
        """action stamp_prev_done: a counted completion's result names the job's previous completion (ina_last_done,
        if of this generation): reserved = its seq's low 7 bits and PREV_DONE, or reserved 0 if there was none; then
        this completion becomes the previous one."""
        last_done = self.ina_last_done[job_id]
        if last_done & 0x80 and last_done >> 8 == generation:
            out[_O_FLAGS] |= _PREV_DONE
            out[_O_RESERVED] = ((last_done & 0x7F) << 1) | (out[_O_RESERVED] & 1)
        else:
            out[_O_RESERVED] &= 1
        self.ina_last_done[job_id] = (generation << 8) | 0x80 | (seq & 0x7F)

    def _gap_report(self, frame: bytes, ingress_port: int, tx_ahead: int) -> Output:
        """action gap_report: a dropped counted frame that revealed a gap becomes the gap report to its sender: a
        header-only STATUS with GAP, slot = the frames lost (tx_ahead: reserved - expected, mod 128), reserved its
        own counter."""
        out = bytearray(frame)
        del out[_O_DATA:_INA_END]  # hdr.ina_data.setInvalid()
        out[_O_INA] = _STATUS
        out[_O_FLAGS] = _GAP
        out[_O_SLOT : _O_SLOT + 2] = _U16.pack(tx_ahead)
        out[_O_IP + 2 : _O_IP + 4] = _U16.pack(wire.INA_QUERY_IPV4_LEN)
        out[_O_UDP + 4 : _O_UDP + 6] = _U16.pack(wire.INA_QUERY_UDP_LEN)
        self._reply_to_sender(out)
        return self._egress(ingress_port, ingress_port, 0, out, ina_out=True, ina_mcast=False)

    @staticmethod
    def _reply_to_sender(out: bytearray) -> None:
        """action reply_to_sender: swap addresses, answer from the INA port to the sender's port."""
        out[0:6], out[6:12] = out[6:12], out[0:6]
        ip = _O_IP + 12
        out[ip : ip + 4], out[ip + 4 : ip + 8] = out[ip + 4 : ip + 8], out[ip : ip + 4]
        out[_O_UDP + 2 : _O_UDP + 4] = out[_O_UDP : _O_UDP + 2]
        out[_O_UDP : _O_UDP + 2] = _INA_PORT

    def _ipv4_lpm(self, ingress_port: int, frame: bytes) -> Output:
        """table ipv4_lpm, then the traffic manager and egress for a unicast packet."""
        dst = int.from_bytes(frame[_O_IP + 16 : _O_IP + 20], "big")
        entry = self._lpm.lookup_lpm(dst)
        if entry is None:
            action, params = self._lpm.default
            self.counters["MyIngress.ina_drops"][DropReason.NO_ROUTE] += 1  # !ipv4_lpm.apply().hit
        else:
            action, params = entry.action, entry.params
        out = bytearray(frame)
        egress_spec = 0  # BMv2: unset egress_spec is port 0
        if action == "MyIngress.ipv4_forward":
            dmac, port = params
            out[6:12] = out[0:6]
            out[0:6] = dmac.to_bytes(6, "big")
            out[_O_IP + 8] = (out[_O_IP + 8] - 1) & 0xFF
            egress_spec = port
        elif action == "MyIngress.send_to_cpu":
            egress_spec = wire.CPU_PORT
        elif action == "MyIngress.drop":
            return []
        return self._egress(ingress_port, egress_spec, 0, out, ina_out=False, ina_mcast=False)

    # --- traffic manager ---------------------------------------------------------------------------
    def _replicate(self, group: int, out: bytearray, ingress_port: int, gap: tuple | None = None) -> Output:
        """Replicas of an INA packet (multicast_to_job): MyEgress with ina_mcast = ina_out = 1 for each; ``gap``:
        (meta.gap_worker, meta.gap_slot, ...) of a completion that revealed a gap, whose sender's copy carries it.

        The same steps as ``_egress`` for every replica, with what all replicas share done once: the UDP
        checksum and the IPv4 checksum field are zeroed, the bytes set_worker_addr leaves alone are cut once,
        and the IPv4 checksum starts from the header's value without its destination address (the header's
        integer value is that plus the address, see ``_csum16_folded``).
        """
        if group == 0:  # no multicast group: BMv2 sends to egress_spec, which is unset (port 0)
            return self._egress(ingress_port, 0, 0, out, ina_out=True, ina_mcast=True, gap=gap)
        emitted: Output = []
        job_id = (out[_O_JOB] << 8) | out[_O_JOB + 1]
        copies = self._copies.get((group, job_id))
        if copies is None:  # each replica's ina_worker entry (table ina_worker, by job and egress_rid)
            copies = self._copies[(group, job_id)] = tuple(
                (port, self._worker.get((job_id, rid), False)) for port, rid in self.multicast_groups.get(group, ()))
        if not copies:
            return emitted
        out[_O_UDP + 6 : _O_UDP + 8] = b"\x00\x00"  # UDP checksum 0: the payload changed
        out[_O_IP + 10 : _O_IP + 12] = b"\x00\x00"  # MyComputeChecksum fills it per replica
        results = self.counters["MyEgress.ina_results"] if out[_O_INA] == _RESULT else None
        default_drop = self._worker_default_drop
        pack = _U16.pack
        # Pieces of every rewritten replica: mac | a | ip checksum | b | dst ip | c | dst port | d | worker_id | e
        a, b, c = bytes(out[6 : _O_IP + 10]), bytes(out[_O_IP + 12 : _O_IP + 16]), bytes(out[_O_UDP : _O_UDP + 2])
        d, e = bytes(out[_O_UDP + 4 : _O_WORKER]), bytes(out[_O_WORKER + 1 :])
        x_base = int.from_bytes(out[_O_IP : _O_IP + 16], "big") << 32  # the header's value with dst address 0
        for port, addr in copies:
            if addr is None:  # an entry whose action is drop
                continue
            if addr is False:  # a miss: the default action
                if default_drop:
                    continue
                r = bytearray(out)
                if results is not None:
                    results[job_id] += 1
                r[_O_IP + 10 : _O_IP + 12] = pack(0xFFFF - _csum16_folded(r[_O_IP : _O_IP + 20]))
            else:  # action set_worker_addr
                if results is not None:
                    results[job_id] += 1
                mac, ip, udp_port, worker_id, ip_value = addr
                x = x_base + ip_value
                folded = x % 0xFFFF or (0xFFFF if x else 0)
                r = b"".join((mac, a, pack(0xFFFF - folded), b, ip, c, udp_port, d, worker_id, e))
                if gap is not None and worker_id[0] == gap[0]:
                    r = bytearray(r)
                    _carry_gap(r, gap)
            if port == wire.CPU_PORT:  # packet_in header: ingress_port:9, _pad:7
                r = pack((ingress_port & 0x1FF) << 7) + r
            emitted.append((port, bytes(r)))
        return emitted

    # --- MyEgress.apply, MyComputeChecksum, MyDeparser ---------------------------------------------
    def _egress(
        self, ingress_port: int, egress_port: int, egress_rid: int, out: bytearray, *, ina_out: bool, ina_mcast: bool,
        gap: tuple | None = None,
    ) -> Output:
        if egress_port == DROP_PORT:
            return []
        if ina_mcast:
            job_id = _U16.unpack_from(out, _O_JOB)[0]
            addr = self._worker.get((job_id, egress_rid), False)  # table ina_worker
            if addr is False:
                if self._worker_default_drop:
                    return []
            elif addr is None:  # an entry whose action is drop
                return []
            else:  # action set_worker_addr
                out[0:6], out[_O_IP + 16 : _O_IP + 20], out[_O_UDP + 2 : _O_UDP + 4] = addr[:3]
                out[_O_WORKER] = egress_rid & 0xFF  # hdr.ina.worker_id
                _carry_gap(out, gap)  # the sender's copy carries its gap
        if ina_out:
            out[_O_UDP + 6 : _O_UDP + 8] = b"\x00\x00"  # UDP checksum 0: the payload changed
            if out[_O_INA] == _RESULT:
                self.counters["MyEgress.ina_results"][_U16.unpack_from(out, _O_JOB)[0]] += 1
        # MyComputeChecksum: update_checksum over the base IPv4 header.
        if len(out) >= _O_UDP and out[12] == 0x08 and out[13] == 0x00:  # etherType TYPE_IPV4
            out[_O_IP + 10 : _O_IP + 12] = b"\x00\x00"
            out[_O_IP + 10 : _O_IP + 12] = _U16.pack(0xFFFF - _csum16_folded(out[_O_IP : _O_IP + 20]))
        if egress_port == wire.CPU_PORT:  # packet_in header: ingress_port:9, _pad:7
            out[0:0] = _U16.pack((ingress_port & 0x1FF) << 7)
        return [(egress_port, bytes(out))]
