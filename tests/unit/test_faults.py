"""Fault injection of ina-switch (softswitch/faults.py): seeded, within rates, INA packets only."""
from __future__ import annotations

import pytest

from inaproto import wire
from softswitch.faults import FaultConfig, FaultInjector, FaultSpec, build_config, is_ina, parse_probability
from tests.support.frames import ina_frame


def _ina_frame(seq: int, *, from_switch: bool = False) -> bytes:
    sport, dport = (wire.INA_UDP_PORT, 40000) if from_switch else (40000, wire.INA_UDP_PORT)
    return ina_frame(wire.InaHeader(wire.MsgType.GRADIENT, 0, 1, 0, seq % 16, seq, 0, 0), [], src_mac=b"\x02" * 6,
                     src_ip="10.0.1.1", sport=sport, dst_mac=b"\x04" * 6, dst_ip="10.0.0.254", dport=dport)


def _other_frame(seq: int) -> bytes:
    return wire.udp_frame(b"\x02" * 6, b"\x04" * 6, b"\x0a\x00\x01\x01", b"\x0a\x00\x00\xfe", 5000, 6000, seq.to_bytes(4, "big"))


def _run(injector: FaultInjector, frames, port: int = 1, direction: str = "in") -> list[bytes]:
    out = []
    apply = injector.ingress if direction == "in" else injector.egress
    for i, f in enumerate(frames):
        out += apply(port, f, now=i * 1e-3)
    return out


def test_same_seed_same_fate_other_seed_other_fate():
    frames = [_ina_frame(i) for i in range(2000)]
    cfg = FaultConfig(FaultSpec(drop=0.1, dup=0.1, reorder=0.1), seed=42)
    a = _run(FaultInjector(cfg), frames)
    b = _run(FaultInjector(cfg), frames)
    c = _run(FaultInjector(FaultConfig(cfg.default, seed=43)), frames)
    assert a == b
    assert a != c


def test_a_link_fate_does_not_depend_on_other_links():
    cfg = FaultConfig(FaultSpec(drop=0.3), seed=1)
    frames = [_ina_frame(i) for i in range(500)]
    alone = _run(FaultInjector(cfg), frames, port=1)
    mixed = FaultInjector(cfg)
    out1 = []
    for i, f in enumerate(frames):
        out1 += mixed.ingress(1, f, i * 1e-3)
        mixed.ingress(2, _ina_frame(10_000 + i), i * 1e-3)  # another link's traffic in between
        mixed.egress(1, _ina_frame(20_000 + i, from_switch=True), i * 1e-3)  # and the other direction
    assert out1 == alone


@pytest.mark.parametrize("kind", ["drop", "dup", "reorder"])
@pytest.mark.parametrize("p", [0.05, 0.3])
def test_rates_within_tolerance(kind, p):
    n = 20_000
    injector = FaultInjector(FaultConfig(FaultSpec(**{kind: p}), seed=5))
    out = _run(injector, [_ina_frame(i) for i in range(n)])
    stats = injector.stats["in"]
    counted = {"drop": stats.dropped, "dup": stats.duplicated, "reorder": stats.reordered}[kind]
    assert abs(counted / n - p) < 0.015, (kind, counted / n)
    if kind == "drop":
        assert len(out) == n - stats.dropped
    elif kind == "dup":
        assert len(out) == n + stats.duplicated
    else:
        assert len(out) + (1 if injector.holding else 0) == n  # everything delivered, one may still be held


def test_reorder_swaps_with_the_next_packet_of_the_link():
    injector = FaultInjector(FaultConfig(FaultSpec(reorder=1.0), seed=0))
    a, b = _ina_frame(1), _ina_frame(2)
    assert injector.ingress(1, a, 0.0) == []  # held back
    assert injector.holding
    assert injector.ingress(1, b, 0.001) == [a]  # a leaves once the next packet came; b is held in its turn
    assert injector.due(0.0) == []
    released = injector.due(1.0)  # b's delay has passed
    assert released == [("in", 1, b)]
    assert not injector.holding


def test_reorder_order_with_partial_probability():
    injector = FaultInjector(FaultConfig(FaultSpec(reorder=0.5), seed=3, reorder_delay=10.0))
    frames = [_ina_frame(i) for i in range(200)]
    out = _run(injector, frames) + [f for _, _, f in injector.due(1e9)]
    assert sorted(out) == sorted(frames)  # nothing lost, nothing added
    assert out != frames  # but not in order
    seqs = [wire.unpack_header(f, wire.INA_OFFSET).seq for f in out]
    assert max(abs(s - i) for i, s in enumerate(seqs)) <= 2  # a held packet only waits for the next one


def test_only_ina_packets_are_affected():
    injector = FaultInjector(FaultConfig(FaultSpec(drop=1.0, dup=1.0, reorder=1.0), seed=0))
    others = [_other_frame(i) for i in range(100)] + [b"\x00" * 10, b"", bytes(60)]
    assert _run(injector, others) == others
    assert _run(injector, others, direction="out") == others
    assert injector.stats["in"].seen == 0 and injector.stats["out"].seen == 0
    assert _run(injector, [_ina_frame(1)]) == []
    assert _run(injector, [_ina_frame(2, from_switch=True)], direction="out") == []


def test_is_ina():
    assert is_ina(_ina_frame(1)) and is_ina(_ina_frame(1, from_switch=True))
    assert not is_ina(_other_frame(1))
    assert not is_ina(_ina_frame(1)[:40])
    arp = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(28)
    assert not is_ina(arp)
    tcp = bytearray(_ina_frame(1))
    tcp[23] = 6
    assert not is_ina(bytes(tcp))


def test_ports_and_direction_restrict_faults():
    cfg = build_config(drop=["1"], ports=[2], direction="out")
    injector = FaultInjector(cfg)
    f, r = _ina_frame(1), _ina_frame(1, from_switch=True)
    assert injector.ingress(2, f, 0) == [f]  # direction "out": frames received pass
    assert injector.egress(1, r, 0) == [r]  # port 1 is not a fault port
    assert injector.egress(2, r, 0) == []


def test_per_port_probabilities_override_the_global_ones():
    cfg = build_config(drop=["0", "3:1"], dup=["1"])
    assert cfg.spec_for(1) == FaultSpec(drop=0.0, dup=1.0)
    assert cfg.spec_for(3) == FaultSpec(drop=1.0, dup=1.0)
    injector = FaultInjector(cfg)
    f = _ina_frame(1)
    assert injector.ingress(1, f, 0) == [f, f]
    assert injector.ingress(3, f, 0) == []


def test_inactive_config():
    assert not FaultConfig().active
    assert FaultConfig().spec_for(1) is None
    assert build_config(drop=["0"]).active is False


@pytest.mark.parametrize("text, expected", [("0.5", (None, 0.5)), ("3:0.25", (3, 0.25)), ("0", (None, 0.0)), ("1", (None, 1.0))])
def test_parse_probability(text, expected):
    assert parse_probability(text) == expected


@pytest.mark.parametrize("text", ["1.5", "-0.1", "x", "a:0.1", "2:", "600:0.1", ""])
def test_parse_probability_rejects(text):
    with pytest.raises(ValueError):
        parse_probability(text)


def test_config_validates():
    with pytest.raises(ValueError):
        FaultSpec(drop=2.0)
    with pytest.raises(ValueError):
        FaultConfig(direction="sideways")
