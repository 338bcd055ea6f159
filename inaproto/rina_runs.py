"""Runs: how two Rina host members' copies carry INA payloads between them, one header for many payloads.

A hop between two host members never touches an INA switch's pipeline (the leaf without INA routes it as plain
IPv4 to the neighbour copy's UDP port), so its datagrams need not be INA frames. A *run* is one datagram:

    run header (12 B) | count x (slot (2 B) | seq offset (2 B) | ina_data_t (128 B))

The run header is the ``ina_t`` fields every payload of the run shares: msg_type, flags, job_id, generation
(bytes 0-5 of ``ina_t``), worker_id and the reserved/shadow byte (``ina_t`` bytes 12-13), and the first
payload's seq (4 B). Each entry gives its payload's slot and its seq as an offset (0..65535) from that seq,
then the lanes. Up to ``RUN_PAYLOADS`` (11) entries fit a 1500-byte MTU: 1408 payload bytes in 1506 on the
wire (0.935, about a TCP ring's 0.936 with its ACKs), against 0.876 for 10 whole INA payloads back to back and
0.696 for single INA frames. A datagram of exactly one INA payload (142 B, which no run's length equals) is a
single INA payload: a copy told to send no runs (``bundle_frames`` 1) sends those. docs/protocol.md, "Runs
between host members".
"""
from __future__ import annotations

import numpy as np

from inaproto import wire

__all__ = ["RUN_ENTRY_LEN", "RUN_HEADER_LEN", "RUN_PAYLOADS", "RUN_SHARE", "decode", "encode"]

MTU = 1500
RUN_HEADER_LEN = 12
RUN_ENTRY_LEN = 4 + wire.INA_DATA_LEN  # slot, seq offset, lanes
RUN_PAYLOADS = (MTU - wire.IPV4_LEN - wire.UDP_LEN - RUN_HEADER_LEN) // RUN_ENTRY_LEN  # 11
RUN_SHARE = RUN_PAYLOADS * wire.INA_DATA_LEN / (wire.INA_OFFSET + RUN_HEADER_LEN + RUN_PAYLOADS * RUN_ENTRY_LEN)

_P = wire.INA_PAYLOAD_LEN
_H = wire.INA_HEADER_LEN
_SLOT = wire.INA_FIELD_OFFSETS["slot"]
_SEQ = wire.INA_FIELD_OFFSETS["seq"]
_WORKER = wire.INA_FIELD_OFFSETS["worker_id"]
assert (_SLOT, _SEQ, _WORKER, _H) == (6, 8, 12, 14)  # the layout above
_SHARED = np.array([0, 1, 2, 3, 4, 5, _WORKER, _WORKER + 1])  # ina_t bytes every payload of a run shares
_MAX_OFFSET = 0xFFFF


def encode(payloads: np.ndarray, most: int = RUN_PAYLOADS) -> tuple[bytes, int, list[bytes]]:
    """Runs for ``payloads`` (rows of whole INA payloads, uint8, ``(k, 142)``), at most ``most`` per run.

    Payloads sharing the run header's fields are grouped (in their order) and cut into runs of ``most``, a run
    also ending where a seq falls outside its first seq's 16-bit offset range. Returns the full runs back to
    back (every one ``RUN_HEADER_LEN + most * RUN_ENTRY_LEN`` bytes: one GSO send), their number, and the
    shorter runs, one datagram each."""
    if not 1 <= most <= RUN_PAYLOADS:
        raise ValueError(f"a run holds 1..{RUN_PAYLOADS} payloads, got {most}")
    k = len(payloads)
    if k == 0:
        return b"", 0, []
    keys = np.ascontiguousarray(payloads[:, _SHARED]).view(">u8").ravel()
    seqs = np.ascontiguousarray(payloads[:, _SEQ : _SEQ + 4]).view(">u4").ravel().astype(np.int64)
    full: list[bytes] = []
    rest: list[bytes] = []
    if len(np.unique(keys)) == 1:
        groups = [np.arange(k)]
    else:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        groups = [np.flatnonzero(inverse == g) for g in np.argsort(first)]
    for idx in groups:
        start = 0
        while start < len(idx):
            ahead = seqs[idx[start : start + most]]
            offsets = (ahead - ahead[0]) & 0xFFFFFFFF
            out = np.flatnonzero(offsets > _MAX_OFFSET)
            end = start + (int(out[0]) if len(out) else len(ahead))
            run = _run(payloads, idx[start:end], offsets[: end - start])
            (full if end - start == most else rest).append(run)
            start = end
    return b"".join(full), len(full), rest


def _run(payloads: np.ndarray, idx: np.ndarray, offsets: np.ndarray) -> bytes:
    first = payloads[idx[0]]
    head = first[_SHARED].tobytes() + first[_SEQ : _SEQ + 4].tobytes()
    body = np.empty((len(idx), RUN_ENTRY_LEN), np.uint8)
    body[:, 0:2] = payloads[idx, _SLOT : _SLOT + 2]
    body[:, 2:4] = offsets.astype(">u2").view(np.uint8).reshape(-1, 2)
    body[:, 4:] = payloads[idx, _H:]
    return head + body.tobytes()


def decode(datagram: memoryview | bytes) -> np.ndarray | None:
    """The INA payloads (rows, uint8, ``(count, 142)``) of one datagram from a neighbour's copy: a run, or a single
    INA payload; None if it is neither (the copy drops it; end-to-end recovery resends what it held)."""
    n = len(datagram)
    if n == _P:
        return np.frombuffer(datagram, np.uint8).reshape(1, _P)
    count, extra = divmod(n - RUN_HEADER_LEN, RUN_ENTRY_LEN)
    if n <= RUN_HEADER_LEN or extra or count > RUN_PAYLOADS:
        return None
    raw = np.frombuffer(datagram, np.uint8)
    head, body = raw[:RUN_HEADER_LEN], raw[RUN_HEADER_LEN:].reshape(count, RUN_ENTRY_LEN)
    rows = np.empty((count, _P), np.uint8)
    rows[:, _SHARED] = head[:8]
    rows[:, _SLOT : _SLOT + 2] = body[:, 0:2]
    seq0 = int.from_bytes(head[8:12].tobytes(), "big")
    seqs = (seq0 + body[:, 2:4].copy().view(">u2").ravel().astype(np.int64)) & 0xFFFFFFFF
    rows[:, _SEQ : _SEQ + 4] = seqs.astype(">u4").view(np.uint8).reshape(-1, 4)
    rows[:, _H:] = body[:, 4:]
    return rows
