"""Block floating point (host_agent/block_scale.py): exact sums at agreed power-of-two scales, on every backend."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from host_agent.agent import AgentOptions
from host_agent.block_scale import (
    CODE_NONFINITE,
    CODE_ZERO,
    BlockScaledReducer,
    block_shifts,
    dequantize_blocks,
    exponent_codes,
    headroom_bits,
    quantize_blocks,
)
from host_agent.stream import StreamOptions
from topologies.loopback import LoopbackCluster

QUICK = AgentOptions(stream=StreamOptions(op_timeout=20.0))


def _reference(arrays: list[np.ndarray], block: int) -> np.ndarray:
    """What every worker must get, computed here without the agent: max codes, shifts, exact int sums, one rounding."""
    n = len(arrays)
    codes = np.max(np.stack([exponent_codes(a, block) for a in arrays]), axis=0)
    shifts = block_shifts(codes, n)
    total = np.sum(np.stack([quantize_blocks(a, shifts, codes, block).astype(np.int64) for a in arrays]), axis=0)
    return dequantize_blocks(total, shifts, codes, block).reshape(np.asarray(arrays[0]).shape)


def _sequential_allreduce(arrays: list[np.ndarray], block: int) -> list[np.ndarray]:
    """Run BlockScaledReducer for n workers in one thread: each collective is computed once all n have posted."""
    n = len(arrays)

    class Agent:
        size = n

        def __init__(self, rank: int) -> None:
            self.rank = rank

        def allgather(self, a: np.ndarray) -> np.ndarray:
            return np.stack([exponent_codes(x, block) for x in arrays])  # every worker's codes (what it would post)

        def allreduce_fixed(self, q: np.ndarray) -> np.ndarray:
            codes = np.max(np.stack([exponent_codes(x, block) for x in arrays]), axis=0)
            shifts = block_shifts(codes, n)
            return np.sum(np.stack([quantize_blocks(x, shifts, codes, block).astype(np.int64) for x in arrays]), axis=0)

    return [BlockScaledReducer(Agent(r), block).allreduce(arrays[r]) for r in range(n)]


def test_codes_mark_zero_nonfinite_and_bound_the_magnitude() -> None:
    x = np.array([0, 0, 0, 0, 1.0, -0.75, 0, 0, 3.0, np.inf, 0, 0, 2.0**-140, 0, 0, 0, np.nan, 1, 2, 3], dtype=np.float32)
    codes = exponent_codes(x, 4)
    assert codes[0] == CODE_ZERO and codes[2] == CODE_NONFINITE and codes[4] == CODE_NONFINITE
    assert codes[1] == 1 + 126  # max|x| = 1 < 2**1
    assert codes[3] == -125 + 126  # subnormal: clamped to E = -125, still exact (multiples of 2**-149)
    assert exponent_codes(np.float32([3.0e38]), 4)[0] == 128 + 126
    assert exponent_codes(np.zeros(0, np.float32), 4).size == 0
    assert headroom_bits(1) == 0 and headroom_bits(2) == 1 and headroom_bits(3) == 2 and headroom_bits(32) == 5


@pytest.mark.parametrize("n", [1, 2, 3, 8, 32])
def test_sums_of_exactly_representable_values_are_exact_at_any_magnitude(n: int) -> None:
    """Tiny (subnormal), huge (near float32's max / n), mixed blocks: float32 of the real sum, rounded once."""
    rng = np.random.default_rng(n)
    block = 32
    top = np.repeat(np.array([-149, -140, -120, -60, -20, 0, 20, 60, 100, 120]), block)  # max|x| < 2**top, per block
    arrays = []
    for _ in range(n):
        mant = rng.integers(-(2**23), 2**23, size=top.size)  # 24-bit integers: exact in float32
        arrays.append(np.ldexp(mant.astype(np.float64), np.maximum(top - 23, -149)).astype(np.float32))
    results = _sequential_allreduce(arrays, block)
    exact = [sum(Fraction(float(a[i])) for a in arrays) for i in range(top.size)]
    want = np.array([float(v) for v in exact], dtype=np.float64).astype(np.float32)  # float64 of a 24+5-bit sum: exact
    for r in results:
        assert r.tobytes() == want.tobytes()
    assert np.count_nonzero(want) > 0.9 * want.size


def test_small_values_survive_beside_large_ones_in_other_blocks() -> None:
    """With one fixed scale 2**16, gradients of 1e-7 vanish; with a scale per block they come through exactly."""
    a = np.concatenate([np.full(256, 1e-7, np.float32), np.full(256, 1000.0, np.float32)])
    b = np.concatenate([np.full(256, 3e-7, np.float32), np.full(256, -250.5, np.float32)])
    out = _sequential_allreduce([a, b], 256)[0]
    assert out[:256].tolist() == [float(np.float32(Fraction(float(np.float32(1e-7))) + Fraction(float(np.float32(3e-7)))))] * 256
    assert out[256:].tolist() == [749.5] * 256


def test_zero_and_nonfinite_policy() -> None:
    """All-zero blocks give exact zeros; a NaN or inf on any worker turns that block into NaN everywhere, nothing else."""
    a = np.array([0, 0, 1, 2, 5, np.inf], dtype=np.float32)
    b = np.array([0, 0, np.nan, 2, 5, 1], dtype=np.float32)
    for out in _sequential_allreduce([a, b], 2):
        assert out[:2].tolist() == [0.0, 0.0]
        assert np.isnan(out[2:4]).all() and np.isnan(out[4:]).all()
    c = np.array([0, 0, 1, 2, 5, 6], dtype=np.float32)
    out = _sequential_allreduce([c, c], 2)[0]
    assert out.tolist() == [0, 0, 2, 4, 10, 12]


def test_sum_beyond_float32_becomes_inf_not_saturated() -> None:
    big = np.full(4, 3.0e38, np.float32)
    out = _sequential_allreduce([big, big], 4)[0]
    assert np.isposinf(out).all()


def test_shifts_that_are_not_the_maximum_are_refused() -> None:
    x = np.array([1.0, 1000.0], np.float32)
    codes = exponent_codes(np.array([1.0, 1.0], np.float32), 1)
    with pytest.raises(ValueError, match="agreed"):
        quantize_blocks(x, block_shifts(codes, 2), codes, 1)


def test_reducer_checks_its_agent() -> None:
    with pytest.raises(TypeError, match="allgather"):
        BlockScaledReducer(object())
    with pytest.raises(ValueError, match="block_elements"):
        BlockScaledReducer(type("A", (), {"allgather": print, "allreduce_fixed": print})(), 0)


def _gradients(n: int, seed: int) -> list[np.ndarray]:
    """Gradient-like data: per-layer magnitudes from 1e-9 to 1e3, some exact zeros, sizes not multiples of anything."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        parts = [rng.standard_normal(s) * 10.0**e for s, e in ((700, -9), (301, -3), (96, 0), (45, 3))]
        g = np.concatenate(parts + [np.zeros(40)]).astype(np.float32)
        out.append(g)
    return out


@pytest.mark.parametrize("racks,backend", [(["s1"] * 3, "auto"), (["s1"] * 3, "ring"), (["r1", "r1", "r2"], "auto")],
                         ids=["ina", "ring", "rina"])
def test_every_backend_gives_every_worker_the_same_bits(racks: list[str], backend: str) -> None:
    n = len(racks)
    inputs = _gradients(n, seed=len(racks) + len(backend))
    want = _reference(inputs, 256)
    with LoopbackCluster(racks, slots=16, backend=backend, options=QUICK) as cl:
        out = cl.run(lambda agent: (agent.backend, BlockScaledReducer(agent).allreduce(inputs[agent.rank])))
    # two racks: Rina on the controller's chains, every worker plain INA towards its rack's switch
    assert {o[0] for o in out} == {"ring" if backend == "ring" else "ina"}
    for _, res in out:
        assert res.tobytes() == want.tobytes()
    # and the small layer is there, unlike with the job's fixed scale 2**16 (which rounds 1e-9 to 0)
    assert np.count_nonzero(want[:700]) == 700
    rel = np.abs(want[:1142] - np.sum(inputs, axis=0)[:1142]) / np.abs(np.sum(inputs, axis=0)[:1142])
    assert float(np.median(rel)) < 1e-6
