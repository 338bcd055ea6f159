"""The ring's step streams: one op's steps as the bytes a member sends right and receives from the left.

Each step is a header (magic, 16-byte tag, length) and the chunk's bytes. The stream is pipelined by
pieces: each chunk is cut into pieces (``piece_bounds``), and piece j of step s+1 is ready to leave as
soon as piece j of step s has arrived and been added, so a step need not wait for the whole step before
it. Pieces are local to a member (they decide when it adds and sends on), never on the wire.
``host_agent.ring`` runs these streams over TCP or queues; docs/agent.md, "Ring".
"""
from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_PIECES", "PIECE_BYTES", "PieceStream", "RingStep", "chunk_bounds", "describe_tag", "frame_mismatch",
           "piece_bounds", "step_tag"]

# Every chunk message: magic, 16-byte tag (call, step, dtype, length), payload bytes.
_FRAME = struct.Struct("!4s16sQ")
_FRAME_MAGIC = b"RNGc"
_TAG = struct.Struct("!IH2sQ")  # a step's tag: call, step, dtype code, length

# Pieces: a chunk of B bytes is cut into min(MAX_PIECES, B // PIECE_BYTES) pieces (at least one). 4 KiB is
# about 3 TCP segments, 16 ms at 2 Mbit/s: small enough that the path's store-and-forward latency hides
# behind the rest of the step, large enough that Python handles few of them at high rates.
PIECE_BYTES = 4096
MAX_PIECES = 64


@dataclass(frozen=True)
class RingStep:
    """One ring step: ``send`` goes right while ``recv`` fills from the left; then ``reduce += recv`` if given.

    ``tag`` (16 bytes) heads the step's message; a message whose tag or length differs from what is
    expected raises RingError, so that workers disagreeing on the call never mix data.
    """

    send: np.ndarray
    recv: np.ndarray
    reduce: np.ndarray | None
    tag: bytes


def chunk_bounds(length: int, parts: int) -> tuple[int, ...]:
    """``parts + 1`` offsets cutting ``length`` elements into near-equal chunks (first ones longer)."""
    if length < 0 or parts < 1:
        raise ValueError(f"need length >= 0 and parts >= 1, got {length}, {parts}")
    q, r = divmod(length, parts)
    out, acc = [0], 0
    for i in range(parts):
        acc += q + (1 if i < r else 0)
        out.append(acc)
    return tuple(out)


def piece_bounds(length: int, itemsize: int, piece_bytes: int = PIECE_BYTES) -> tuple[int, ...]:
    """Offsets cutting a chunk of ``length`` elements into the pieces a ring step is pipelined by: at most
    ``MAX_PIECES``, each at least ``piece_bytes`` (one piece where the chunk is smaller)."""
    return chunk_bounds(length, max(1, min(MAX_PIECES, length * itemsize // piece_bytes)))


def _pieces(array: np.ndarray, piece_bytes: int) -> list[tuple[int, int]]:
    bounds = piece_bounds(array.size, array.itemsize, piece_bytes)
    return list(itertools.pairwise(bounds))


def _as_bytes(a: np.ndarray) -> memoryview:
    return memoryview(a).cast("B")


class PieceStream:
    """One op's steps as the two byte streams a member sends and receives, piece by piece.

    Sends: per step a header and the ``send`` pieces; piece j of step s becomes ready when received
    piece j of step s-1 is complete (and added), and ready bytes queue in stream order (``pending``).
    Receives: per step a header, then the step's ``recv`` chunk, filled in order (``receive_buffer``
    spans the rest of the chunk, so a transport reads as much as it has at once); each piece it
    completes is added into the step's ``reduce`` before the sends it releases.
    """

    def __init__(self, steps: Sequence[RingStep], piece_bytes: int) -> None:
        self._steps = steps
        self._sends: list[tuple[int, memoryview]] = []  # (received pieces needed first, bytes), stream order
        self._piece_ends: list[list[tuple[int, int]]] = []  # per step: the recv chunk's pieces (elements)
        first = 0  # index, over the whole op, of the step before's first received piece
        for s, step in enumerate(steps):
            follows = s > 0  # sends what the step before received
            if follows and step.send.size != steps[s - 1].recv.size:
                raise ValueError(f"ring step {s} sends {step.send.size} elements, step {s - 1} received {steps[s - 1].recv.size}")
            self._sends.append((-1, memoryview(_FRAME.pack(_FRAME_MAGIC, step.tag, step.send.nbytes))))
            for j, (lo, hi) in enumerate(_pieces(step.send, piece_bytes)):
                if hi > lo:
                    self._sends.append((first + j if follows else -1, _as_bytes(step.send[lo:hi])))
            if s:
                first += len(self._piece_ends[-1])
            self._piece_ends.append(_pieces(step.recv, piece_bytes))
        self.pending: deque[memoryview] = deque()
        self._next_send = 0
        self._step = 0  # the step being received
        self._header: memoryview | None = memoryview(bytearray(_FRAME.size))  # None: in the step's chunk
        self._chunk = _as_bytes(steps[0].recv) if steps else memoryview(b"")
        self._offset = 0  # bytes of the header or chunk filled
        self._piece = 0  # the step's next piece to complete
        self._done = 0  # pieces complete over the whole op
        self._release()

    @property
    def receiving(self) -> bool:
        return self._step < len(self._steps)

    @property
    def finished(self) -> bool:
        return not self.receiving and not self.pending and self._next_send == len(self._sends)

    @property
    def receive_buffer(self) -> memoryview:
        """Where the next received bytes go: the rest of the step's header, or of its chunk."""
        return (self._header if self._header is not None else self._chunk)[self._offset :]

    def sent(self, nbytes: int) -> None:
        """``nbytes`` of ``pending`` went to the transport."""
        while nbytes:
            k = min(nbytes, self.pending[0].nbytes)
            nbytes -= k
            if k == self.pending[0].nbytes:
                self.pending.popleft()
            else:
                self.pending[0] = self.pending[0][k:]

    def received(self, nbytes: int) -> tuple[bytes, bytes, int] | None:
        """``nbytes`` were written into ``receive_buffer``; a completed header comes back as (header, tag, length) to check."""
        self._offset += nbytes
        if self._header is not None:
            if self._offset < self._header.nbytes:
                return None
            step = self._steps[self._step]
            checked = bytes(self._header), step.tag, step.recv.nbytes
            self._header, self._offset = None, 0
            self._complete_pieces()  # an empty chunk is complete at once
            return checked
        self._complete_pieces()
        return None

    def _complete_pieces(self) -> None:
        step, pieces = self._steps[self._step], self._piece_ends[self._step]
        filled = self._offset // step.recv.itemsize
        while self._piece < len(pieces) and pieces[self._piece][1] <= filled:
            lo, hi = pieces[self._piece]
            if step.reduce is not None:
                np.add(step.recv[lo:hi], step.reduce[lo:hi], out=step.reduce[lo:hi])
            self._piece += 1
            self._done += 1
        if self._piece == len(pieces):
            self._step += 1
            self._header, self._offset, self._piece = memoryview(bytearray(_FRAME.size)), 0, 0
            if self.receiving:
                self._chunk = _as_bytes(self._steps[self._step].recv)
        self._release()

    def _release(self) -> None:
        while self._next_send < len(self._sends) and self._sends[self._next_send][0] < self._done:
            self.pending.append(self._sends[self._next_send][1])
            self._next_send += 1


def frame_mismatch(header: bytes, tag: bytes, nbytes: int) -> str | None:
    """Why a step's header is not the expected one, or None."""
    magic, got_tag, got_nbytes = _FRAME.unpack(header)
    if magic == _FRAME_MAGIC and got_tag == tag and got_nbytes == nbytes:
        return None
    return (f"sent a mismatched message (tag {describe_tag(got_tag)}, {got_nbytes} bytes; expected {describe_tag(tag)}, "
            f"{nbytes} bytes): workers disagree on the array length, dtype or call order")



def step_tag(call: int, step: int, dtype: np.dtype, length: int) -> bytes:
    """The 16-byte tag of step ``step`` of call ``call`` on ``length`` elements of ``dtype``."""
    return _TAG.pack(call & 0xFFFFFFFF, step, f"{dtype.kind}{dtype.itemsize}".encode(), length)


def describe_tag(tag: bytes) -> str:
    try:
        call, step, code, length = _TAG.unpack(tag)
        return f"call {call} step {step} dtype {code.decode(errors='replace')} length {length}"
    except struct.error:
        return repr(tag)
