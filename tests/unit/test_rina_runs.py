"""inaproto/rina_runs.py: runs of INA payloads under one header between two host members' copies."""
from __future__ import annotations

import numpy as np
import pytest

from inaproto import wire
from inaproto.rina_runs import RUN_ENTRY_LEN, RUN_PAYLOADS, RUN_SHARE, decode, encode, run_header_len

RUN_HEADER_LEN = run_header_len(2)



def _payloads(seqs, msg_types=None, shadows=None, flags=None) -> list[bytes]:
    rng = np.random.default_rng(7)
    out = []
    for i, seq in enumerate(seqs):
        h = wire.InaHeader(msg_type=(msg_types or [1] * len(seqs))[i], flags=(flags or [0] * len(seqs))[i], job_id=3,
                           generation=9, slot=seq % 33 if seq != 40000 else 2000, seq=seq, worker_id=31, reserved=0,
                           shadow=(shadows or [0] * len(seqs))[i])
        out.append(wire.encode_payload(h, rng.integers(-2**31, 2**31, wire.LANES, dtype=np.int64).astype(np.int32)))
    return out


def _split(data: bytes) -> list[bytes]:
    p = wire.INA_PAYLOAD_LEN
    assert len(data) % p == 0
    return [data[i : i + p] for i in range(0, len(data), p)]


def _datagrams(full: bytes, whole: int, rest: list[bytes]) -> list[bytes]:
    size = len(full) // whole if whole else 0
    return [full[i * size : (i + 1) * size] for i in range(whole)] + rest


def test_a_run_fills_an_mtu_and_carries_about_a_tcp_rings_payload_share():
    assert RUN_PAYLOADS == 11 and RUN_HEADER_LEN + RUN_PAYLOADS * RUN_ENTRY_LEN + 28 <= 1500
    assert RUN_SHARE == pytest.approx(1408 / 1511)
    payloads = _payloads(range(100, 122))
    full, whole, rest = encode(payloads)
    assert whole == 2 and rest == [] and len(full) == 2 * (RUN_HEADER_LEN + 11 * RUN_ENTRY_LEN)


@pytest.mark.parametrize("most", [1, 2, 5, 11])
def test_every_payload_comes_back_bit_for_bit(most):
    """Mixed message types, shadows and flags, a seq wrap and a jump beyond 16 bits: every payload decodes to
    exactly the bytes it was encoded from, each once."""
    seqs = [2**32 - 3, 2**32 - 2, 2**32 - 1, 0, 1, 5, 70000, 70001, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 40000]
    n = len(seqs)
    payloads = _payloads(seqs, msg_types=[1 + (i % 3 == 0) for i in range(n)], shadows=[i % 2 for i in range(n)],
                         flags=[2 if i == 4 else 0 for i in range(n)])
    full, whole, rest = encode(payloads, most)
    grams = _datagrams(full, whole, rest)
    assert all(len(g) <= 1472 for g in grams)
    back = [p for g in grams for p in _split(decode(g))]
    assert sorted(back) == sorted(payloads)


def test_a_single_ina_payload_is_taken_and_anything_else_dropped():
    one = _payloads([4])
    assert decode(one[0]) == one[0]
    assert decode(b"") is None and decode(b"\0" * RUN_HEADER_LEN) is None
    assert decode(b"\0" * (RUN_HEADER_LEN + RUN_ENTRY_LEN + 1)) is None
    assert decode(b"\0" * (RUN_HEADER_LEN + (RUN_PAYLOADS + 1) * RUN_ENTRY_LEN)) is None
    with pytest.raises(ValueError):
        encode(one, RUN_PAYLOADS + 1)
