"""The batch path on chain traffic (softswitch/pipeline_chains.py) gives exactly what ``process`` gives frame after
frame: bytes out in order, every register (ina_final included) and every counter."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inaproto import wire
from inaproto.job_entries import ChainHop, ChainLink, ChainPartition, WorkerAddress, chain_entries, job_entries
from softswitch import pipeline_batch, pipeline_chains
from softswitch.pipeline import InaPipeline

JOB, PLAIN_JOB = 5, 6  # a chain job, and a plain one whose slots overlap it (owner resets both ways)
MEMBER = 20  # this switch is member 21 of a three-member Rina ring; 20 is its predecessor, 22 its successor
SWITCH_MAC, SWITCH_IP = bytes.fromhex("0200000000fe"), bytes([10, 0, 0, 254])
LOCAL = {2: 1, 3: 2}  # local worker id -> its port
PLAIN = {0: 3, 1: 4}
UPSTREAM_PORT, NEXT_PORT = 10, 9


def _hop(member: int, port: int) -> ChainHop:
    return ChainHop(member, port, f"02:00:00:00:ee:{member:02x}", f"10.0.254.{member}", wire.INA_UDP_PORT)


def _worker(wid: int, port: int) -> WorkerAddress:
    return WorkerAddress(wid, port, bytes.fromhex(f"0200000001{wid + 1:02x}"), bytes([10, 0, 1, wid + 1]), 40000 + wid)


def _pipeline() -> InaPipeline:
    """Member 21 of the ring: slot 0's chain passes through it, slot 1's ends here, slot 2's starts here; slot 3
    has no chain entry (plain INA); the plain job holds slots 2-5 of the pool (its 0-3)."""
    p = InaPipeline()
    job = job_entries(JOB, [_worker(w, port) for w, port in LOCAL.items()], base_slot=0, num_slots=4, generation=1)
    job.insert_into(p)
    parts = [ChainPartition(0, 16, (MEMBER,), False), ChainPartition(1, 16, (MEMBER,), True, (_hop(22, NEXT_PORT),)),
             ChainPartition(2, 16, (), False)]
    chain_entries(job, MEMBER + 1, _hop(22, NEXT_PORT), parts,
                  {MEMBER: ChainLink(UPSTREAM_PORT), MEMBER + 1: ChainLink(UPSTREAM_PORT)}).insert_into(p)
    job_entries(PLAIN_JOB, [_worker(w, port) for w, port in PLAIN.items()], base_slot=2, num_slots=4,
                generation=0, mcast_grp=9).insert_into(p)
    return p


def _frame(sender: str, slot: int, seq: int, shadow: int, lanes: list[int], flags: int, generation_off: int,
           corrupt: str, reserved: int = 0) -> tuple[int, bytes]:
    """(ingress port, frame): a local worker's gradient, the predecessor's partial, a final sum or answer to this
    member, a plain job's gradient, or a foreign or malformed packet."""
    msg_type, job, gen = wire.MsgType.GRADIENT, JOB, 1
    if sender.startswith("local"):
        wid = 2 + int(sender[-1])
        port, mac, ip, sport = LOCAL[wid], bytes.fromhex(f"0200000001{wid + 1:02x}"), bytes([10, 0, 1, wid + 1]), 40000 + wid
    elif sender.startswith("plain"):
        wid, job, gen = int(sender[-1]), PLAIN_JOB, 0
        port, mac, ip, sport = PLAIN[wid], bytes.fromhex(f"0200000001{wid + 1:02x}"), bytes([10, 0, 1, wid + 1]), 40000 + wid
    else:
        wid = MEMBER if sender == "partial" else MEMBER + 1
        msg_type = wire.MsgType.GRADIENT if sender == "partial" else wire.MsgType.RESULT
        port = UPSTREAM_PORT if sender in ("partial", "final") else NEXT_PORT
        mac, ip, sport = bytes.fromhex("0200000000ee"), bytes([10, 0, 254, wid]), wire.INA_UDP_PORT
    if corrupt == "foreign":
        wid = 7
    elif corrupt == "broadcast":
        msg_type = wire.MsgType.BROADCAST
    header = wire.InaHeader(msg_type, flags, job, gen + generation_off, slot, seq, wid, shadow, reserved)
    frame = bytearray(wire.udp_frame(mac, SWITCH_MAC, ip, SWITCH_IP, sport, wire.INA_UDP_PORT,
                                     wire.encode_payload(header, np.array(lanes))))
    if corrupt == "checksum":
        frame[24] ^= 0xFF
    elif corrupt == "port":
        port = 4 if port != 4 else 3
    return port, bytes(frame)


_LANE = st.one_of(st.integers(-100, 100), st.sampled_from([2**31 - 1, -(2**31), 2**30]))
_FRAME = st.builds(
    _frame,
    sender=st.sampled_from(["local0", "local1", "partial", "final", "answer", "plain0", "plain1"]),
    slot=st.integers(0, 4),  # slot 4 is out of range
    seq=st.integers(0, 3),
    shadow=st.integers(0, 1),
    lanes=st.lists(_LANE, min_size=wire.LANES, max_size=wire.LANES),
    flags=st.sampled_from([0, 0, int(wire.Flags.OVERFLOW), int(wire.Flags.RETRANSMIT)] + [int(wire.Flags.TX_COUNTED)] * 2),
    generation_off=st.sampled_from([0] * 10 + [1]),
    corrupt=st.sampled_from([""] * 16 + ["checksum", "foreign", "broadcast", "port"]),
    reserved=st.integers(0, 3),  # loss signals: counted frames of a slot without a chain entry, gaps and not
)


def _state(p: InaPipeline):
    regs = p.register_snapshot()
    return regs[:-1], p.ina_lanes.tobytes(), {k: list(v) for k, v in p.counters.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=st.lists(st.lists(_FRAME, min_size=1, max_size=20), min_size=1, max_size=8),
       one_port=st.booleans(), rows=st.booleans())
def test_chain_batch_equals_one_frame_at_a_time(batches, one_port, rows):
    one, batch = _pipeline(), _pipeline()
    for frames in batches:
        if one_port:  # one ingress port per batch, as a copy's batch per source
            frames = [(frames[0][0], f) for _, f in frames]
        expected = [out for port, f in frames for out in one.process(port, f)]
        ports = np.array([port for port, _ in frames], np.int64)
        data = [f for _, f in frames]
        arg = np.frombuffer(b"".join(data), np.uint8).reshape(len(data), -1) if rows else data
        with batch.lock:
            got = pipeline_batch.process_batch(batch, int(ports[0]) if one_port else ports, arg, vector_min=1,
                                               chain_vector_min=1)
        assert got == expected
        assert _state(batch) == _state(one)


def test_rounds_through_the_chain_are_vectorised_and_exact():
    """Whole rounds (local gradients, the predecessor's partials, the final sums, retransmissions onto copies
    already sent onward or holding the final sum) as batches with every slot once: all on arrays, same bytes."""
    rng = np.random.default_rng(7)
    one, batch = _pipeline(), _pipeline()
    pipeline_chains.STATS.clear()
    rounds = []
    for seq in range(1, 5):
        lanes = lambda: rng.integers(-(2**20), 2**20, wire.LANES).tolist()
        rounds.append([_frame("local0", s, seq, seq & 1, lanes(), 0, 0, "") for s in (0, 1, 2)])
        rounds.append([_frame("local1", s, seq, seq & 1, lanes(), 0, 0, "") for s in (0, 1, 2)])
        rounds.append([_frame("partial", s, seq, seq & 1, lanes(), 0, 0, "") for s in (0, 1)])
        rounds.append([_frame("final", 0, seq, seq & 1, lanes(), 0, 0, ""), _frame("local0", 1, seq, seq & 1, lanes(), 1, 0, ""),
                       _frame("local1", 2, seq, seq & 1, lanes(), 1, 0, "")])  # the final sum; two resends
    vectorised = 0
    for frames in rounds:
        expected = [out for port, f in frames for out in one.process(port, f)]
        before = pipeline_chains.STATS["vector"]
        with batch.lock:
            got = pipeline_batch.process_batch(batch, np.array([p for p, _ in frames]), [f for _, f in frames],
                                               vector_min=1, chain_vector_min=1)
        vectorised += pipeline_chains.STATS["vector"] - before
        assert got == expected
        assert _state(batch) == _state(one)
    assert vectorised == sum(map(len, rounds))
    assert one.counter("MyIngress.ina_partials")[JOB] > 0 and one.counter("MyEgress.ina_results")[JOB] > 0


def test_the_chain_lookup_cache_holds_the_jobs_slots_only_and_a_write_clears_it():
    p = _pipeline()
    lanes = [1] * wire.LANES
    for slot in (0, 3, 4, 999):  # 4 and 999 lie beyond the job's 4 slots: dropped, and never cached
        p.process(*_frame("local0", slot, 0, 0, lanes, 0, 0, ""))
    assert sorted(k & 0xFFFF for k in p._chain_hits) == [0, 3] and p._chain_hits[(JOB << 16) | 3] is None
    job_entries(PLAIN_JOB + 1, [_worker(9, 5)], base_slot=8, num_slots=1, generation=0, mcast_grp=10).insert_into(p)
    assert p._chain_hits == {}  # every control-plane write rebuilds the tables' views and forgets the answers
