"""Fixed-point codec of the agent: float32 gradients <-> int32 lanes, chunks, and the overflow split.

The switch adds int32 lanes, so every backend of the agent reduces the same integers:
``q = clip(rint(x * scale), INT32_MIN, INT32_MAX)`` per worker, an exact integer sum over workers, and
``float32(sum / scale)`` at the end (computed in float64, rounded once). Whatever backend carried a
chunk, every worker gets the same bits. See docs/agent.md ("Fixed point").
"""
from __future__ import annotations

import numpy as np

from inaproto import wire

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "SPLIT_BITS",
    "chunk_count",
    "dequantize",
    "join_split",
    "quantize",
    "quantize_chunks",
    "split_chunks",
    "to_chunks",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
SPLIT_BITS = 16  # overflow recovery sends q as hi * 2**16 + lo: neither part can overflow a 32-worker sum


def chunk_count(elements: int, lanes: int = wire.LANES) -> int:
    """Chunks (packets) an all-reduce of ``elements`` values takes: ceil(elements / lanes)."""
    if elements < 0:
        raise ValueError(f"elements must be >= 0, got {elements}")
    return -(-elements // lanes)


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """int32 fixed point of ``x``: rint(x * scale), saturated to the int32 range (NaN becomes 0).

    The product is formed in float64, so the only rounding is the final rint.
    """
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.rint(np.asarray(x, dtype=np.float64) * float(scale))
    np.nan_to_num(y, copy=False, nan=0.0, posinf=INT32_MAX, neginf=INT32_MIN)
    np.clip(y, INT32_MIN, INT32_MAX, out=y)
    return y.astype(np.int32)


def _power_of_two(scale: float) -> bool:
    m, _ = np.frexp(scale)
    return bool(m == 0.5) and 2.0**-60 <= scale <= 2.0**60


_F32_BELOW_2_31 = np.float32(2147483520.0)  # the largest float32 below 2**31


def quantize_chunks(x: np.ndarray, scale: float, lanes: int = wire.LANES) -> np.ndarray:
    """``to_chunks(quantize(x, scale))`` in fewer passes: a (chunks, lanes) int32 matrix, last chunk zero-padded.

    With a power-of-two scale, a float32 input is multiplied in float32 (exact: only the exponent
    changes) and rounded there; any value out of range (or NaN) falls back to ``quantize``.
    """
    flat = np.asarray(x).reshape(-1)
    out = np.zeros((chunk_count(flat.size, lanes), lanes), dtype=np.int32)
    dest = out.reshape(-1)[: flat.size]
    if flat.size and flat.dtype == np.float32 and _power_of_two(scale):
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN take the slow path below
            y = np.multiply(flat, np.float32(scale))
            np.rint(y, out=y)
            lo, hi = y.min(), y.max()
        if lo >= -2147483648.0 and hi <= _F32_BELOW_2_31:  # False for NaN
            dest[:] = y
            return out
    dest[:] = quantize(flat, scale)
    return out


def dequantize(total: np.ndarray, scale: float) -> np.ndarray:
    """float32(total / scale) of exact integer sums, rounded once.

    A power-of-two scale divides exactly, so converting the integer to float32 (one rounding) and
    scaling gives the same bits as dividing in float64 and rounding; other scales go through float64.
    """
    t = np.asarray(total)
    if _power_of_two(scale):
        return t.astype(np.float32) * np.float32(1.0 / scale)
    return (t.astype(np.float64) / float(scale)).astype(np.float32)


def to_chunks(q: np.ndarray, lanes: int = wire.LANES) -> np.ndarray:
    """A flat int32 array as a (chunks, lanes) matrix, the last chunk zero-padded."""
    flat = np.asarray(q, dtype=np.int32).reshape(-1)
    m = chunk_count(flat.size, lanes)
    out = np.zeros((m, lanes), dtype=np.int32)
    out.reshape(-1)[: flat.size] = flat
    return out


def split_chunks(q: np.ndarray) -> np.ndarray:
    """Each chunk row q as two rows (hi, lo) with q == hi * 2**16 + lo, hi in [-2**15, 2**15), lo in [0, 2**16).

    Summed over at most 32 workers, hi stays within +-2**20 and lo below 2**21: no int32 overflow is
    possible, in any order of addition. Rows come out interleaved: hi(c0), lo(c0), hi(c1), lo(c1) ...
    """
    q = np.asarray(q, dtype=np.int32)
    out = np.empty((2 * q.shape[0], q.shape[1]), dtype=np.int32)
    out[0::2] = q >> SPLIT_BITS
    out[1::2] = q & ((1 << SPLIT_BITS) - 1)
    return out


def join_split(sums: np.ndarray) -> np.ndarray:
    """The exact int64 sums of the chunks that ``split_chunks`` split, from the sums of its rows."""
    s = np.asarray(sums, dtype=np.int64)
    return (s[0::2] << SPLIT_BITS) + s[1::2]
