"""Runs: how two Rina host members' copies carry INA payloads between them, one header for many payloads.

A hop between two host members never touches an INA switch's pipeline (the leaf without INA routes it as plain
IPv4 to the neighbour copy's UDP port), so its datagrams need not be INA frames. A *run* is one datagram:

    job_id (2) | generation (2) | seq0 (4) | V (1, 2 as sent) | V x variant (4) | count x entry (4 + 128)
    variant: msg_type (1) | flags (1) | worker_id (1) | reserved bits of ina_t byte 13, shadow bit 0 (1)
    entry:   variant index (6 bits) | slot (10 bits) || shadow (1 bit) | seq - seq0 (15 bits) || ina_data_t (128)

Every payload of a run shares job_id and generation; the variants (at most ``MAX_VARIANTS``, 2: a copy's
partials and the final sums it passes on) hold the rest of ``ina_t`` but slot, seq and shadow, which each entry
carries. A slot of a job's range is below ``wire.NUM_SLOTS`` (1024: 10 bits); a payload whose slot or seq
offset does not fit is sent as a single INA payload instead. Up to ``RUN_PAYLOADS`` (11) entries fit a
1500-byte MTU: 1408 payload bytes in at most 1511 on the wire (0.932, about a TCP ring's 0.936 with its ACKs),
against 0.876 for 10 whole INA payloads back to back and 0.696 for single INA frames. A datagram of exactly
one INA payload (142 B, which no run's length equals) is a single INA payload. docs/protocol.md, "Runs between
host members".
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

from inaproto import wire

__all__ = ["MAX_VARIANTS", "RUN_ENTRY_LEN", "RUN_FRAME_LEN", "RUN_PAYLOADS", "RUN_SHARE", "decode", "encode", "run_header_len"]

MTU = 1500
MAX_VARIANTS = 2
RUN_ENTRY_LEN = 4 + wire.INA_DATA_LEN  # variant and slot, shadow and seq offset, lanes
_FIXED = 9  # job_id, generation, seq0, V


def run_header_len(variants: int) -> int:
    """Bytes before the first entry of a run with ``variants`` variants."""
    return _FIXED + 4 * variants


_ROOM = MTU - wire.IPV4_LEN - wire.UDP_LEN
RUN_PAYLOADS = (_ROOM - run_header_len(MAX_VARIANTS)) // RUN_ENTRY_LEN  # 11
RUN_FRAME_LEN = wire.INA_OFFSET + run_header_len(MAX_VARIANTS) + RUN_PAYLOADS * RUN_ENTRY_LEN  # a full run's frame: 1511
RUN_SHARE = RUN_PAYLOADS * wire.INA_DATA_LEN / RUN_FRAME_LEN

_P = wire.INA_PAYLOAD_LEN
_H = wire.INA_HEADER_LEN
_INA_T = wire.HEADER  # ina_t: msg_type flags job_id generation slot seq worker_id byte 13
_START = struct.Struct(">HHIB")  # job_id generation seq0 V
_ENTRY = struct.Struct(">HH")  # variant index and slot, shadow and seq offset
assert _START.size == _FIXED and _ENTRY.size + wire.INA_DATA_LEN == RUN_ENTRY_LEN
assert wire.INA_HEADER_FIELDS[4:6] == (("slot", 16), ("seq", 32))  # the layout above
_SLOT_BITS, _OFFSET_BITS = 10, 15
assert wire.NUM_SLOTS <= 1 << _SLOT_BITS and MAX_VARIANTS <= 1 << (16 - _SLOT_BITS)
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_MAX_OFFSET = (1 << _OFFSET_BITS) - 1


def encode(payloads: Sequence[bytes], most: int = RUN_PAYLOADS) -> tuple[bytes, int, list[bytes]]:
    """Datagrams for ``payloads`` (whole INA payloads, 142 bytes each): runs of at most ``most``.

    Consecutive payloads go into one run while they share job and generation, bring at most ``MAX_VARIANTS``
    variants, and their seqs lie within 2^15 above the run's smallest; a payload that fits no run (a slot of
    1024 or more) goes alone as a single INA payload. Returns the full runs of ``most`` payloads back to back
    (one size: one GSO send), their number, and every other datagram. Plain Python on purpose: a copy's
    wake-up carries a handful of payloads, where numpy's per-call overhead costs more than the bytes."""
    if not 1 <= most <= RUN_PAYLOADS:
        raise ValueError(f"a run holds 1..{RUN_PAYLOADS} payloads, got {most}")
    k = len(payloads)
    fields = [_INA_T.unpack_from(p) for p in payloads]
    full: list[bytes] = []
    rest: list[bytes] = []
    i = 0
    while i < k:
        mt, fl, job, gen, slot, seq, worker, b13 = fields[i]
        if slot > _SLOT_MASK:
            rest.append(bytes(payloads[i]))
            i += 1
            continue
        variants = [(mt, fl, worker, b13 & 0xFE)]
        lo = hi = seq
        members = [(0, slot, b13 & 1, seq, i)]
        j = i + 1
        while j < k and j - i < most:
            mt, fl, job2, gen2, slot, seq, worker, b13 = fields[j]
            if job2 != job or gen2 != gen or slot > _SLOT_MASK or max(hi, seq) - min(lo, seq) > _MAX_OFFSET:
                break
            v = (mt, fl, worker, b13 & 0xFE)
            if v in variants:
                index = variants.index(v)
            elif len(variants) < MAX_VARIANTS:
                index = len(variants)
                variants.append(v)
            else:
                break
            members.append((index, slot, b13 & 1, seq, j))
            lo, hi, j = min(lo, seq), max(hi, seq), j + 1
        variants += variants[:1] * (MAX_VARIANTS - len(variants))  # always MAX_VARIANTS: one length per count
        parts = [_START.pack(job, gen, lo, MAX_VARIANTS), bytes(x for v in variants for x in v)]
        for index, slot, shadow, seq, m in members:
            parts.append(_ENTRY.pack(index << _SLOT_BITS | slot, shadow << _OFFSET_BITS | (seq - lo)))
            parts.append(payloads[m][_H:])
        (full if j - i == most else rest).append(b"".join(parts))
        i = j
    return b"".join(full), len(full), rest


def decode(datagram: memoryview | bytes) -> bytes | None:
    """The INA payloads (142 bytes each, back to back) of one datagram from a neighbour's copy: a run, or a single
    INA payload; None if it is neither (the copy drops it; end-to-end recovery resends what it held)."""
    n = len(datagram)
    if n == _P:
        return bytes(datagram)
    if n <= _FIXED:
        return None
    job, gen, seq0, v = _START.unpack_from(datagram)
    start = run_header_len(v)
    count, extra = divmod(n - start, RUN_ENTRY_LEN)
    if not 1 <= v <= MAX_VARIANTS or extra or not 1 <= count <= RUN_PAYLOADS:
        return None
    table = [tuple(datagram[_FIXED + 4 * t : _FIXED + 4 * t + 4]) for t in range(v)]
    parts = []
    for off in range(start, n, RUN_ENTRY_LEN):
        first, second = _ENTRY.unpack_from(datagram, off)
        index = first >> _SLOT_BITS
        if index >= v:
            return None
        mt, fl, worker, b13 = table[index]
        parts.append(_INA_T.pack(mt, fl, job, gen, first & _SLOT_MASK, (seq0 + (second & _MAX_OFFSET)) & 0xFFFFFFFF,
                                 worker, b13 | second >> _OFFSET_BITS))
        parts.append(datagram[off + _ENTRY.size : off + RUN_ENTRY_LEN])
    return b"".join(parts)
