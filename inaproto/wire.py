"""The INA wire format: the one Python definition of the header in p4src/ina.p4.

Layout (docs/protocol.md describes every byte):

    Ethernet | IPv4 (no options) | UDP (dport or sport INA_UDP_PORT) | ina_t (14 B) | ina_data_t (LANES x int32)

``INA_HEADER_FIELDS`` mirrors ``header ina_t`` field for field; a test reads p4src/ina.p4 and checks every
name and width. Everything else derives from it: the struct codec ``HEADER`` and the numpy record
``PAYLOAD_DTYPE`` here (agents, the switch model, benches), the byte offsets of its fields, the lengths the
switch checks, and the scapy layer in ``inaproto.scapy_layer`` (tests and tools only: no daemon imports
scapy).
"""
from __future__ import annotations

import enum
import itertools
import struct
from typing import NamedTuple

import numpy as np

INA_UDP_PORT = 47000
LANES = 32  # int32 lanes per packet; why 32: docs/protocol.md
MAX_WORKERS = 32  # width of the per-slot worker bitmap
NUM_SLOTS = 1024  # aggregator slots in the switch pool (each has two shadow copies)
MAX_JOBS = 256  # job ids are 0..MAX_JOBS-1 (they index the per-job counters)
CPU_PORT = 255

# header ina_t, in wire order: (field name, width in bits)
INA_HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("msg_type", 8),
    ("flags", 8),
    ("job_id", 16),
    ("generation", 16),
    ("slot", 16),
    ("seq", 32),
    ("worker_id", 8),
    ("reserved", 7),
    ("shadow", 1),
)
# header ina_data_t: lane00 .. lane31, each bit<32>, two's complement int32 on the wire
INA_DATA_FIELDS: tuple[tuple[str, int], ...] = tuple((f"lane{i:02d}", 32) for i in range(LANES))

INA_HEADER_LEN = sum(width for _, width in INA_HEADER_FIELDS) // 8
INA_DATA_LEN = LANES * 4
INA_PAYLOAD_LEN = INA_HEADER_LEN + INA_DATA_LEN  # UDP payload
ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8
INA_UDP_LEN = UDP_LEN + INA_PAYLOAD_LEN  # value of udp.length
INA_IPV4_LEN = IPV4_LEN + INA_UDP_LEN  # value of ipv4.totalLen
INA_OFFSET = ETH_LEN + IPV4_LEN + UDP_LEN  # where ina_t starts in a frame
INA_FRAME_LEN = INA_OFFSET + INA_PAYLOAD_LEN
# A query and its status answer are ina_t alone (no ina_data_t).
INA_QUERY_UDP_LEN = UDP_LEN + INA_HEADER_LEN
INA_QUERY_IPV4_LEN = IPV4_LEN + INA_QUERY_UDP_LEN
INA_QUERY_FRAME_LEN = INA_OFFSET + INA_HEADER_LEN


class MsgType(enum.IntEnum):
    GRADIENT = 1  # worker -> switch: a contribution to a slot
    RESULT = 2  # switch -> worker: the completed sum of a slot
    BROADCAST = 3  # worker -> switch -> every worker of the job, payload unchanged (Rina's rack result)
    QUERY = 4  # worker -> switch, header only: is my contribution to chunk seq in its slot copy? (single switch)
    STATUS = 5  # switch -> that worker, header only: the answer to a query (Flags.HELD: yes, the copy waits)


class Flags(enum.IntFlag):
    NONE = 0
    RETRANSMIT = 0x01  # set by a worker on a resent gradient (informational; the switch needs no flag)
    OVERFLOW = 0x02  # set by the switch in a result when any lane overflowed int32 during the sum
    HELD = 0x04  # set by the switch in a status: the sender's contribution is in the incomplete copy
    # Loss signals (docs/protocol.md, "Loss signals"), for jobs not on chains:
    TX_COUNTED = 0x08  # set by a worker on a gradient: reserved = its transmission counter to the job, mod 128
    GAP = 0x10  # set by the switch in a status (a gap report): slot = frames lost just before the one in reserved
    PREV_DONE = 0x20  # set by the switch in a multicast result: reserved = seq & 0x7F of the job's previous one


TX_COUNTER_MOD = 128  # the transmission counter travels in the 7-bit reserved field
# A counted frame (counter - expected) mod TX_COUNTER_MOD = 1 .. TX_LATE_HALF - 1 ahead reveals a gap of that many
# frames; TX_LATE_HALF or more ahead is behind the expected one: a late frame (reordered or duplicated), no gap
# (the P4's INA_TX_LATE_HALF; half the counter space, as TCP's sequence arithmetic).
TX_LATE_HALF = TX_COUNTER_MOD // 2


def gap_slot(lost: int, counter: int) -> int:
    """The ``slot`` of a result that carries ``Flags.GAP`` to its sender: frames lost << 7 | the counter of the frame
    that revealed them (the P4's meta.gap_slot)."""
    return (lost << 7) | counter


def split_gap_slot(slot: int) -> tuple[int, int]:
    """(frames lost, revealing counter) from a ``gap_slot``."""
    return slot >> 7, slot & (TX_COUNTER_MOD - 1)


class DropReason(enum.IntEnum):
    """Index into the ina_drops / ina_job_drops counters (the P4's DROP_* constants)."""

    MALFORMED = 1
    UNKNOWN_JOB = 2
    SLOT_OUT_OF_RANGE = 3
    FOREIGN_WORKER = 4
    STALE_GENERATION = 5
    BAD_MSG_TYPE = 6
    NO_ROUTE = 7
    SPOOFED = 8  # not from the port and addresses the controller bound to (job, member): table ina_binding
    NOT_RECIPIENT = 9  # chains: a result from a chain addressed to another member


NUM_DROP_REASONS = 16  # counters per job; reasons beyond NOT_RECIPIENT are grown into, not renumbered


class InaHeader(NamedTuple):
    msg_type: int
    flags: int
    job_id: int
    generation: int
    slot: int
    seq: int
    worker_id: int
    shadow: int
    reserved: int = 0


def _byte_fields(fields: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """(name, width in bytes) in wire order; a run of sub-byte fields becomes one byte named ``a_b``."""
    out: list[tuple[str, int]] = []
    run: list[str] = []
    bits = 0
    for name, width in fields:
        if width % 8 == 0 and not run:
            out.append((name, width // 8))
            continue
        run.append(name)
        bits += width
        if bits == 8:
            out.append(("_".join(run), 1))
            run, bits = [], 0
    if run:
        raise ValueError("header fields do not end on a byte boundary")
    return tuple(out)


INA_HEADER_BYTES = _byte_fields(INA_HEADER_FIELDS)  # ... ("worker_id", 1), ("reserved_shadow", 1)
# Byte offset of each byte-aligned field (and of the reserved:7 | shadow:1 byte) within ina_t.
INA_FIELD_OFFSETS: dict[str, int] = dict(
    zip((name for name, _ in INA_HEADER_BYTES), itertools.accumulate((size for _, size in INA_HEADER_BYTES), initial=0))
)

HEADER_FORMAT = "".join({1: "B", 2: "H", 4: "I"}[size] for _, size in INA_HEADER_BYTES)  # without byte order
HEADER = struct.Struct("!" + HEADER_FORMAT)  # ina_t: unpacks to the fields of INA_HEADER_BYTES
assert HEADER.size == INA_HEADER_LEN
LANES_DTYPE = np.dtype(">i4")  # ina_data_t: LANES int32 in network order
# One INA payload (ina_t then ina_data_t) as a numpy record: a run of packets is built in one pass.
PAYLOAD_DTYPE = np.dtype([(name, "u1" if size == 1 else f">u{size}") for name, size in INA_HEADER_BYTES]
                         + [("lanes", LANES_DTYPE, (LANES,))])
assert PAYLOAD_DTYPE.itemsize == INA_PAYLOAD_LEN


def pack_header(h: InaHeader) -> bytes:
    """ina_t as bytes (the last struct byte is reserved:7 | shadow:1)."""
    return HEADER.pack(
        h.msg_type, h.flags, h.job_id, h.generation, h.slot, h.seq, h.worker_id, ((h.reserved & 0x7F) << 1) | (h.shadow & 1)
    )


def unpack_header(buf: bytes | memoryview, offset: int = 0) -> InaHeader:
    msg_type, flags, job_id, generation, slot, seq, worker_id, last = HEADER.unpack_from(buf, offset)
    return InaHeader(msg_type, flags, job_id, generation, slot, seq, worker_id, last & 1, last >> 1)


def encode_payload(h: InaHeader, lanes: np.ndarray) -> bytes:
    """UDP payload of an INA packet: header then exactly LANES int32 values (shorter arrays are zero-padded)."""
    data = np.zeros(LANES, dtype=LANES_DTYPE)
    n = min(len(lanes), LANES)
    data[:n] = lanes[:n]
    return pack_header(h) + data.tobytes()


def decode_payload(buf: bytes | memoryview, offset: int = 0) -> tuple[InaHeader, np.ndarray]:
    """(header, int32 lanes in native order) from a UDP payload; ValueError if it is not exactly one INA payload."""
    if len(buf) - offset != INA_PAYLOAD_LEN:
        raise ValueError(f"INA payload must be {INA_PAYLOAD_LEN} bytes, got {len(buf) - offset}")
    lanes = np.frombuffer(buf, dtype=LANES_DTYPE, count=LANES, offset=offset + INA_HEADER_LEN).astype(np.int32)
    return unpack_header(buf, offset), lanes


def ipv4_checksum(header: bytes | bytearray) -> int:
    """Internet checksum of a 20-byte IPv4 header whose checksum field is zero."""
    total = sum(struct.unpack("!10H", header))
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(src_mac: bytes, dst_mac: bytes, src_ip: bytes, dst_ip: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    """Ethernet/IPv4/UDP frame (UDP checksum 0) for tools and benchmarks that write raw frames without scapy."""
    udp_len = UDP_LEN + len(payload)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, IPV4_LEN + udp_len, 0, 0x4000, 64, 17, 0, src_ip, dst_ip))
    ip[10:12] = struct.pack("!H", ipv4_checksum(ip))
    return dst_mac + src_mac + b"\x08\x00" + bytes(ip) + struct.pack("!HHHH", sport, dport, udp_len, 0) + payload
