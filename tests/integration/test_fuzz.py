"""10,000 fuzzed and malformed frames into a running ina-switch between rounds of a live job.

The switch is a real ``ina-switch`` process in its own namespace (tests/integration/switch_process.py). A live
job (3 workers, ports 1-3) runs rounds of 8 slots; between rounds, frames derived from a second job's valid
traffic (ports 4-6) and from forged senders (ports 7-9) are mutated - truncated, bits flipped in every
header, wrong lengths, spoofed ids, rewritten into other protocols - and sent from every port. Asserted:
the switch stays up, every live round's sums are exact, and the counters add up: every fuzzed frame is
aggregated, a duplicate, a drop counted by reason, routed (out of port 10), or a broadcast, except frames
whose etherType the corruption changed (not IPv4: dropped uncounted, by design, and classified here).
The figures are written to $INA_FUZZ_REPORT (JSON) when set.
"""
from __future__ import annotations

import json
import os
import random
from collections import Counter

import numpy as np
import pytest

from inaproto import wire
from inaproto.wire import DropReason
from tests.support.entries import install_job
from tests.support.frames import SWITCH_IP, Worker, gradient, make_workers

LIVE, FUZZ = 3, 4  # job ids
LIVE_SLOTS, FUZZ_SLOTS = 8, 8
ROUNDS, PER_ROUND, BURST = 10, 1000, 100  # 10 x 1000 = 10,000 fuzzed frames, sent 100 at a time
ROUTE_PORT = 10
ROUTE_MAC = 0x0200000000AA
HEADERS = {"ethernet": (0, 14), "ipv4": (14, 34), "udp": (34, 42), "ina": (42, 56)}
MUTATIONS = ("truncate", "flip_ethernet", "flip_ipv4", "flip_udp", "flip_ina", "flip_lanes", "wrong_length",
             "spoof_id", "reroute", "append")


def _ipv4_checksum(frame: bytearray) -> None:
    frame[24:26] = b"\x00\x00"
    frame[24:26] = wire.ipv4_checksum(bytes(frame[14:34])).to_bytes(2, "big")


def _flip(frame: bytearray, lo: int, hi: int, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 3)):
        bit = rng.randrange((hi - lo) * 8)
        frame[lo + bit // 8] ^= 0x80 >> (bit % 8)


class Fuzzer:
    """Frames from the fuzz job's workers and from forged senders, each mutated one way."""

    def __init__(self, seed: int, live: list[Worker], fuzz: list[Worker]) -> None:
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.live, self.fuzz = live, fuzz
        self.kinds: Counter[str] = Counter()

    def _base(self) -> tuple[int, bytes]:
        """A valid frame of the fuzz job (gradient or broadcast) from its bound port."""
        w = self.rng.choice(self.fuzz)
        msg = wire.MsgType.BROADCAST if self.rng.random() < 0.1 else wire.MsgType.GRADIENT
        lanes = self.np_rng.integers(-1000, 1000, wire.LANES)
        seq = self.rng.randrange(4)
        return w.port, gradient(w, FUZZ, self.rng.randrange(FUZZ_SLOTS), lanes, seq=seq, shadow=seq & 1, generation=7,
                                msg_type=msg)

    def frame(self) -> tuple[int, bytes, str]:
        rng = self.rng
        kind = MUTATIONS[sum(self.kinds.values()) % len(MUTATIONS)]  # every mutation equally often
        self.kinds[kind] += 1
        port, base = self._base()
        f = bytearray(base)
        if kind == "truncate":  # Linux sends nothing shorter than an Ethernet header
            f = f[: rng.randrange(wire.ETH_LEN, len(f))]
        elif kind.startswith("flip_") and kind != "flip_lanes":
            _flip(f, *HEADERS[kind[5:]], rng)
        elif kind == "flip_lanes":
            _flip(f, 56, len(f), rng)
        elif kind == "wrong_length":
            if rng.random() < 0.5:
                f[16:18] = rng.choice([0, 20, 169, 171, 1500, rng.randrange(65536)]).to_bytes(2, "big")  # totalLen
                _ipv4_checksum(f)
            else:
                f[38:40] = rng.choice([0, 8, 149, 151, rng.randrange(65536)]).to_bytes(2, "big")  # udp length
        elif kind == "spoof_id":  # a live worker's id (and maybe its addresses) from somewhere else
            victim = rng.choice(self.live)
            liar = Worker(victim.wid, rng.choice([1, 2, 3, 7, 8, 9]))
            forged = gradient(victim if rng.random() < 0.5 else liar, LIVE, rng.randrange(LIVE_SLOTS),
                              self.np_rng.integers(-1000, 1000, wire.LANES), seq=rng.randrange(1 << 32), generation=5)
            f = bytearray(forged)
            candidates = [p for p in (1, 2, 3, 7, 8, 9) if p != victim.port]
            port = rng.choice(candidates)
        elif kind == "reroute":  # still IPv4 but no longer INA: another protocol, UDP port or address
            choice = rng.randrange(3)
            if choice == 0:
                f[23] = rng.choice([1, 6, 47])  # protocol
            elif choice == 1:
                f[36:38] = rng.randrange(1, 47000).to_bytes(2, "big")  # UDP dstPort
            else:
                f[36:38] = b"\x00\x35"
                f[30:34] = bytes([192, 0, 2, rng.randrange(256)])  # no route there
            _ipv4_checksum(f)
        elif kind == "append":  # trailing bytes after a valid packet (Ethernet padding): still INA
            f += bytes(rng.randrange(1, 64))
        if rng.random() < 0.2 and kind not in ("spoof_id",):
            port = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9])  # from a port the sender is not bound to
        return port, bytes(f), kind


def _counters(target) -> dict[str, list[int]]:
    return {
        "drops": [target.read_counter("MyIngress.ina_drops", r) for r in range(wire.NUM_DROP_REASONS)],
        "live_drops": [target.read_counter("MyIngress.ina_job_drops", LIVE * wire.NUM_DROP_REASONS + r)
                       for r in range(wire.NUM_DROP_REASONS)],
        "aggregated": [target.read_counter("MyIngress.ina_aggregated", j) for j in (LIVE, FUZZ)],
        "duplicates": [target.read_counter("MyIngress.ina_duplicates", j) for j in (LIVE, FUZZ)],
    }


def _live_round(target, live: list[Worker], seq: int, rng: np.random.Generator) -> None:
    """One round of the live job: every worker into every slot; every worker gets every exact sum."""
    data = rng.integers(-(2**24), 2**24, size=(len(live), LIVE_SLOTS, wire.LANES)).astype(np.int32)
    for i, w in enumerate(live):
        for s in range(LIVE_SLOTS):
            target.send(w.port, gradient(w, LIVE, s, data[i, s], seq=seq, shadow=seq & 1, generation=5))
    out = [(p, f) for p, f in target.receive(expect=len(live) * LIVE_SLOTS)
           if len(f) >= wire.INA_FRAME_LEN and int.from_bytes(f[wire.INA_OFFSET + 2 : wire.INA_OFFSET + 4], "big") == LIVE]
    expected = data.astype(np.int64).sum(axis=0)
    got: dict[tuple[int, int], np.ndarray] = {}
    for port, frame in out:
        header, lanes = wire.decode_payload(frame, wire.INA_OFFSET)
        assert header.msg_type == wire.MsgType.RESULT and header.seq == seq
        got[(port, header.slot)] = lanes
    assert set(got) == {(w.port, s) for w in live for s in range(LIVE_SLOTS)}
    for (port, slot), lanes in got.items():
        assert np.array_equal(lanes.astype(np.int64), expected[slot]), f"slot {slot} to port {port}"


@pytest.fixture
def switch(tmp_path):
    from tests.integration.switch_process import SwitchProcesses

    processes = SwitchProcesses("ina-switch", tmp_path)
    try:
        t = processes.target()
        try:
            yield t
        finally:
            t.close()
    finally:
        processes.close()


def test_fuzzed_frames_between_rounds_of_a_live_job(switch):
    report = fuzz_between_live_rounds(switch, switch.switch.process.check_alive)
    if os.environ.get("INA_FUZZ_REPORT"):
        with open(os.environ["INA_FUZZ_REPORT"], "w") as fh:
            json.dump(report, fh, indent=2)
    print(json.dumps(report))


def fuzz_between_live_rounds(target, check_alive) -> dict:
    """The scenario on any target (``check_alive()`` raises if the switch died); returns the figures."""
    live = make_workers(3)  # ports 1-3
    fuzz = [Worker(10 + i, 4 + i) for i in range(3)]  # ports 4-6, their own addresses
    install_job(target, LIVE, live, base=0, num_slots=LIVE_SLOTS, generation=5)
    install_job(target, FUZZ, [Worker(i, w.port) for i, w in enumerate(fuzz)], base=LIVE_SLOTS, num_slots=FUZZ_SLOTS,
                generation=7)
    fuzz = [Worker(i, w.port) for i, w in enumerate(fuzz)]
    target.insert_entry("MyIngress.ipv4_lpm", ((int.from_bytes(bytes([10, 0, 0, 0]), "big"), 24),),
                        "MyIngress.ipv4_forward", (ROUTE_MAC, ROUTE_PORT))
    assert SWITCH_IP.startswith("10.0.0.")
    fuzzer = Fuzzer(17, live, fuzz)
    rng = np.random.default_rng(17)
    non_ipv4 = routed = broadcasts = sent = 0
    before = _counters(target)
    for r in range(ROUNDS):
        _live_round(target, live, seq=r + 1, rng=rng)
        live_before = _counters(target)
        for _ in range(PER_ROUND // BURST):
            for _ in range(BURST):
                port, frame, _kind = fuzzer.frame()
                if frame[12:14] != b"\x08\x00":
                    non_ipv4 += 1
                target.send(port, frame)
                sent += 1
            for port, frame in target.receive():
                if port == ROUTE_PORT:
                    routed += 1
                elif (len(frame) >= wire.INA_FRAME_LEN and frame[wire.INA_OFFSET] == wire.MsgType.BROADCAST
                      and int.from_bytes(frame[wire.INA_OFFSET + 2 : wire.INA_OFFSET + 4], "big") == FUZZ):
                    broadcasts += 1
        live_after = _counters(target)
        assert live_after["aggregated"][0] == live_before["aggregated"][0], "a fuzzed frame was added to the live job"
        check_alive()
    _live_round(target, live, seq=ROUNDS + 1, rng=rng)
    after = _counters(target)

    drops = {DropReason(r).name.lower(): after["drops"][r] - before["drops"][r] for r in range(1, 9)}
    live_drops = {DropReason(r).name.lower(): after["live_drops"][r] - before["live_drops"][r] for r in range(1, 9)}
    fuzz_aggregated = after["aggregated"][1] - before["aggregated"][1]
    fuzz_duplicates = after["duplicates"][1] - before["duplicates"][1]
    live_duplicates = after["duplicates"][0] - before["duplicates"][0]
    assert broadcasts % len(fuzz) == 0
    accounted = non_ipv4 + sum(drops.values()) + fuzz_aggregated + fuzz_duplicates + live_duplicates + routed + \
        broadcasts // len(fuzz)
    report = {
        "fuzzed_frames": sent, "mutations": dict(fuzzer.kinds), "non_ipv4_uncounted": non_ipv4, "drops": drops,
        "live_job_drops": live_drops, "fuzz_job_aggregated": fuzz_aggregated, "fuzz_job_duplicates": fuzz_duplicates,
        "live_job_duplicates": live_duplicates, "routed": routed, "broadcasts": broadcasts // len(fuzz),
        "accounted": accounted, "live_rounds_exact": ROUNDS + 1,
    }
    assert sent == ROUNDS * PER_ROUND == 10_000
    assert accounted == sent, report
    assert drops["spoofed"] > 0 and live_drops["spoofed"] > 0 and drops["malformed"] > 0 and routed > 0
    assert live_duplicates == 0
    return report
