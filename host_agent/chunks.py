"""Where a call's chunks sit in the job's stream, this worker's contributions, and the results received so far."""
from __future__ import annotations

import numpy as np

from host_agent.fixedpoint import join_split
from inaproto import wire

__all__ = ["Call", "Segment"]

LANES = wire.LANES
CHUNK_BYTES = wire.INA_DATA_LEN


class Segment:
    """Consecutive chunks [a, a+K) of one call with this worker's contributions and the results so far."""

    __slots__ = ("K", "a", "contrib", "flag", "res32", "resr", "src")

    def __init__(self, a: int, contrib: np.ndarray) -> None:
        self.a = a
        self.K = contrib.shape[0]
        self.contrib = contrib
        self.res32 = bytearray(self.K * CHUNK_BYTES)  # big-endian int32 results from the switch
        self.resr: np.ndarray | None = None  # results from a ring (int32 or int64)
        self.src = bytearray(self.K)  # 0 missing, 1 in res32, 2 in resr
        self.flag = bytearray(self.K)  # 1: the result may be inexact (overflow): recover

    def first_missing(self, start: int = 0) -> int:
        return self.src.find(0, start)

    def reset_from(self, i: int) -> None:
        n = self.K - i
        if n > 0:
            self.src[i:] = bytes(n)
            self.flag[i:] = bytes(n)

    def put_ring(self, i0: int, values: np.ndarray) -> None:
        """Ring results for chunks [i0, i0 + len(values)), the rest of the segment from where a ring phase began
        (exact: never flagged).

        The ring's results stay int32 while every block is (a block redone in int64 widens them)."""
        i1 = i0 + values.shape[0]
        if self.resr is None:
            if i0 == 0 and i1 == self.K:
                self.resr = values
            else:
                self.resr = np.zeros((self.K, LANES), dtype=values.dtype)
        elif values.dtype == np.int64 and self.resr.dtype != np.int64:
            self.resr = self.resr.astype(np.int64)
        if self.resr is not values:
            self.resr[i0:i1] = values
        self.src[i0:i1] = b"\x02" * (i1 - i0)
        self.flag[i0:i1] = bytes(i1 - i0)

    def values(self) -> np.ndarray:
        """The results, int32 where every one fits, else int64."""
        if self.resr is not None and self.src.count(2) == self.K:
            return self.resr
        out = np.frombuffer(self.res32, dtype=wire.LANES_DTYPE).reshape(self.K, LANES)
        if self.resr is None:
            return out.astype(np.int32)
        out = out.astype(np.int64)
        from_ring = np.frombuffer(self.src, dtype=np.uint8) == 2
        out[from_ring] = self.resr[from_ring]
        return out


class Call:
    """One all-reduce call: its retained contributions and where its chunks sit in the stream."""

    __slots__ = ("F", "M", "index", "main", "main_seg", "rec_seg", "returned", "start")

    def __init__(self, index: int, main: np.ndarray) -> None:
        self.index = index
        self.main = main
        self.M = main.shape[0]
        self.start: int | None = None
        self.main_seg: Segment | None = None
        self.F: np.ndarray | None = None  # indices of overflowed main chunks, once every main result is in
        self.rec_seg: Segment | None = None
        self.returned = False

    @property
    def end(self) -> int | None:
        if self.start is None or self.F is None:
            return None
        return self.start + self.M + 2 * int(self.F.size)

    def unplace(self) -> None:
        self.start = None
        self.main_seg = None
        self.F = None
        self.rec_seg = None

    def values(self) -> np.ndarray:
        out = self.main_seg.values()
        if self.F is not None and self.F.size:
            out = out.astype(np.int64)
            out[self.F] = join_split(self.rec_seg.values())
        return out
