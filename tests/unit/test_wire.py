"""The wire format: golden bytes, round trips, and agreement with the P4 headers."""
from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import raw

from inaproto import wire
from inaproto.scapy_layer import INA
from p4src.p4source import read_p4

GOLDEN_PAYLOAD = bytes.fromhex(
    "01 01 0007 0003 0102 deadbeef 05 01"  # GRADIENT, RETRANSMIT, job 7, gen 3, slot 258, seq, worker 5, shadow 1
) + b"".join(int(v).to_bytes(4, "big", signed=True) for v in range(-16, 16))


def test_header_matches_p4_declaration():
    p4 = read_p4()
    assert p4.headers["ina_t"] == list(wire.INA_HEADER_FIELDS)
    assert p4.headers["ina_data_t"] == list(wire.INA_DATA_FIELDS)


def test_constants_match_p4():
    p4 = read_p4()
    assert p4.ints["INA_UDP_PORT"] == wire.INA_UDP_PORT
    assert p4.ints["LANES"] == wire.LANES
    assert p4.ints["NUM_SLOTS"] == wire.NUM_SLOTS
    assert p4.ints["NUM_CELLS"] == 2 * wire.NUM_SLOTS
    assert p4.ints["NUM_LANE_CELLS"] == 2 * wire.NUM_SLOTS * wire.LANES
    assert p4.ints["MAX_JOBS"] == wire.MAX_JOBS
    assert p4.ints["NUM_DROP_REASONS"] == wire.NUM_DROP_REASONS
    assert p4.ints["NUM_JOB_DROPS"] == wire.MAX_JOBS * wire.NUM_DROP_REASONS
    assert p4.ints["CPU_PORT"] == wire.CPU_PORT
    assert p4.ints["INA_IPV4_LEN"] == wire.INA_IPV4_LEN
    assert p4.ints["INA_UDP_LEN"] == wire.INA_UDP_LEN
    assert {p4.ints[f"INA_{m.name}"] for m in wire.MsgType} == {m.value for m in wire.MsgType}
    assert all(p4.ints[f"INA_{m.name}"] == m.value for m in wire.MsgType)
    assert p4.ints["INA_FLAG_OVERFLOW"] == wire.Flags.OVERFLOW
    assert p4.ints["INA_FLAG_HELD"] == wire.Flags.HELD
    assert p4.ints["INA_FLAG_TX_COUNTED"] == wire.Flags.TX_COUNTED
    assert p4.ints["INA_FLAG_GAP"] == wire.Flags.GAP
    assert p4.ints["INA_FLAG_PREV_DONE"] == wire.Flags.PREV_DONE
    assert p4.ints["INA_TX_LATE_HALF"] == wire.TX_LATE_HALF == wire.TX_COUNTER_MOD // 2
    assert p4.ints["INA_QUERY_IPV4_LEN"] == wire.INA_QUERY_IPV4_LEN
    assert p4.ints["INA_QUERY_UDP_LEN"] == wire.INA_QUERY_UDP_LEN
    for reason in wire.DropReason:
        assert p4.ints[f"DROP_{reason.name}"] == reason.value
    assert max(wire.DropReason) < wire.NUM_DROP_REASONS
    assert wire.MAX_WORKERS == 32  # width of ina_bitmap / worker_mask


def test_lengths():
    assert wire.INA_HEADER_LEN == 14
    assert wire.INA_PAYLOAD_LEN == 142
    assert wire.INA_UDP_LEN == 150 and wire.INA_IPV4_LEN == 170 and wire.INA_FRAME_LEN == 184
    assert wire.INA_QUERY_UDP_LEN == 22 and wire.INA_QUERY_IPV4_LEN == 42 and wire.INA_QUERY_FRAME_LEN == 56


def test_struct_codec_golden_bytes():
    h = wire.InaHeader(wire.MsgType.GRADIENT, wire.Flags.RETRANSMIT, 7, 3, 258, 0xDEADBEEF, 5, 1)
    assert wire.encode_payload(h, np.arange(-16, 16, dtype=np.int32)) == GOLDEN_PAYLOAD
    got_h, lanes = wire.decode_payload(GOLDEN_PAYLOAD)
    assert got_h == h
    assert lanes.dtype == np.int32 and lanes.tolist() == list(range(-16, 16))


def test_reserved_bits_round_trip_and_short_arrays_pad():
    h = wire.InaHeader(2, 2, 65535, 65535, 65535, 2**32 - 1, 255, 0, reserved=0x55)
    payload = wire.encode_payload(h, np.array([-1], dtype=np.int32))
    assert payload[13] == 0x55 << 1
    got, lanes = wire.decode_payload(payload)
    assert got == h and lanes.tolist() == [-1] + [0] * (wire.LANES - 1)


def test_decode_rejects_wrong_length():
    for bad in (GOLDEN_PAYLOAD[:-1], GOLDEN_PAYLOAD + b"\0"):
        try:
            wire.decode_payload(bad)
        except ValueError as e:
            assert "142" in str(e)
        else:
            raise AssertionError("accepted a payload of the wrong length")


def test_scapy_layer_builds_golden_bytes_and_dissects():
    pkt = INA(msg_type="GRADIENT", flags="RETRANSMIT", job_id=7, generation=3, slot=258, seq=0xDEADBEEF,
                   worker_id=5, shadow=1, lanes=list(range(-16, 16)))
    assert raw(pkt) == GOLDEN_PAYLOAD
    frame = raw(Ether(dst="02:00:00:00:00:fe") / IP(dst="10.0.0.254") / UDP(sport=4000, dport=wire.INA_UDP_PORT) / pkt)
    assert len(frame) == wire.INA_FRAME_LEN and frame[wire.INA_OFFSET:] == GOLDEN_PAYLOAD
    back = Ether(frame)[INA]
    assert (back.job_id, back.generation, back.slot, back.seq, back.worker_id, back.shadow) == (7, 3, 258, 0xDEADBEEF, 5, 1)
    assert back.lanes == list(range(-16, 16))
    # results come from the INA port to the worker's port: bound on sport too
    assert Ether(raw(Ether(dst="02:00:00:00:00:01") / IP() / UDP(sport=wire.INA_UDP_PORT, dport=4000) / pkt)).haslayer(INA)


def test_scapy_layer_names_every_flag_by_its_bit():
    """The loss signals' flags (docs/protocol.md, "Loss signals") in the scapy layer, with the 7-bit reserved."""
    for flag in wire.Flags:
        if flag:
            pkt = INA(flags=flag.name, reserved=0x55, shadow=1)
            assert raw(pkt)[1] == flag.value and raw(pkt)[13] == (0x55 << 1) | 1
            assert int(INA(raw(pkt)).flags) == flag.value
    both = INA(flags="TX_COUNTED+RETRANSMIT", reserved=127)
    assert wire.unpack_header(raw(both))[1:2] == (int(wire.Flags.TX_COUNTED | wire.Flags.RETRANSMIT),)
    assert wire.unpack_header(raw(both)).reserved == 127


def test_numpy_record_builds_the_same_bytes():
    rec = np.zeros(1, dtype=wire.PAYLOAD_DTYPE)
    rec["msg_type"], rec["flags"], rec["job_id"], rec["generation"] = wire.MsgType.GRADIENT, wire.Flags.RETRANSMIT, 7, 3
    rec["slot"], rec["seq"], rec["worker_id"], rec["reserved_shadow"] = 258, 0xDEADBEEF, 5, 1
    rec["lanes"] = np.arange(-16, 16, dtype=np.int32)
    assert rec.tobytes() == GOLDEN_PAYLOAD
    assert wire.HEADER.unpack_from(GOLDEN_PAYLOAD) == (1, 1, 7, 3, 258, 0xDEADBEEF, 5, 1)
    assert [wire.INA_FIELD_OFFSETS[n] for n in ("job_id", "seq", "worker_id")] == [2, 8, 12]


def test_scapy_layer_is_declared_from_the_field_list():
    assert [(f.name, f.size) for f in INA.fields_desc[:-1]] == list(wire.INA_HEADER_FIELDS)


@pytest.mark.local
def test_daemons_do_not_import_scapy():
    import subprocess
    import sys

    code = ("import sys, host_agent.agent, host_agent.cli, softswitch.cli, p4src.ina_model, controller.daemon; "
            "sys.exit('scapy' in ' '.join(sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
