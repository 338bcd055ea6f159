"""The INA window's send loop against the switch's model in this process (no sockets, no threads): which frames a
worker sends when the switch's loss signals name its losses and when its socket refuses a send (docs/agent.md,
"Loss signals"). A peer's gradient follows each of the worker's first frames of a chunk, so the worker's frames
reach a copy that waits for the peer (a gap is reported at once) and every chunk completes."""
from __future__ import annotations

import socket
from collections import Counter, deque
from collections.abc import Callable

import numpy as np
import pytest

from host_agent.chunks import Segment
from host_agent.grant import Rack
from host_agent.ina_window import TX_MOD, InaSender
from host_agent.options import StreamOptions
from host_agent.stats import StreamStats
from inaproto import wire
from tests.support.entries import install_job
from tests.support.frames import SWITCH_IP, SWITCH_MAC, Worker, make_workers
from tests.targets import ModelTarget

JOB, GEN = 6, 2
ME, PEER = make_workers(2)
PAYLOAD = wire.INA_PAYLOAD_LEN
COUNTED = int(wire.Flags.TX_COUNTED)


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _ip(text: str) -> bytes:
    return bytes(int(x) for x in text.split("."))


class _Net:
    """A ``DatagramIo`` for one worker, wired to the switch's model with a peer.

    Args:
        slots: the job's slots.
        lost: (seq, transmission of that chunk, 1 = the first) of the worker's frames lost on the way.
        refuse: given a run's (seq, flags) in order, how many at its end the socket refuses (never sent).
    """

    read_room = 2048

    def __init__(self, slots: int, lost: set[tuple[int, int]] = frozenset(),
                 refuse: Callable[[list[tuple[int, int]]], int] | None = None) -> None:
        self.target = ModelTarget()
        install_job(self.target, JOB, [ME, PEER], base=0, num_slots=slots, generation=GEN)
        self.lost, self.refuse = set(lost), refuse
        self.inbox: deque[bytes] = deque()
        self.arrived: list[tuple[int, int, int | None]] = []  # (msg_type, seq, counter or None) at the switch
        self.counters: list[int] = []  # the counter of every counted frame that left the socket, in order
        self.tries: Counter[int] = Counter()  # frames of each seq that left the socket
        self.refused = 0
        self.peer_done: set[int] = set()
        self.peer_tx = 0
        self.unsent = 0

    def send_run(self, buf: memoryview, size: int, count: int, addr, *, in_order: bool = False) -> int:
        frames = [bytes(buf[j * size : (j + 1) * size]) for j in range(count)]
        refused = self.refuse([(wire.unpack_header(f).seq, f[1]) for f in frames]) if self.refuse else 0
        self.refused += refused
        self.unsent = refused if in_order else 0
        for f in frames[: count - refused]:
            self._send(f)
        return 1

    def _send(self, payload: bytes) -> None:
        h = wire.unpack_header(payload)
        self.tries[h.seq] += 1
        if h.flags & COUNTED:
            self.counters.append(h.reserved)
        if (h.seq, self.tries[h.seq]) not in self.lost:
            self.arrived.append((h.msg_type, h.seq, h.reserved if h.flags & COUNTED else None))
            self._into_switch(ME, payload)
        if h.msg_type == wire.MsgType.GRADIENT and h.seq not in self.peer_done:  # the peer's gradient follows
            self.peer_done.add(h.seq)
            peer = bytearray(payload)
            peer[12] = PEER.wid
            peer[1] = COUNTED
            peer[13] = ((self.peer_tx % TX_MOD) << 1) | (peer[13] & 1)
            peer[wire.INA_HEADER_LEN :] = np.ones(wire.LANES, dtype=">i4").tobytes()
            self.peer_tx += 1
            self._into_switch(PEER, bytes(peer))

    def _into_switch(self, w: Worker, payload: bytes) -> None:
        frame = wire.udp_frame(_mac(w.mac), _mac(SWITCH_MAC), _ip(w.ip), _ip(SWITCH_IP), w.udp_port,
                               wire.INA_UDP_PORT, payload)
        for port, out in self.target.pipeline.process(w.port, frame):
            if port == ME.port:
                self.inbox.append(bytes(out[wire.INA_OFFSET :]))

    def drain(self, view: memoryview, on_run) -> int:
        off = 0
        while self.inbox and off + self.read_room <= len(view):
            d = self.inbox.popleft()
            view[off : off + len(d)] = d
            off += on_run(off, len(d), 1)
        return off


class _Poll:
    def poll(self, ms: float) -> list:
        return []


def _run(net: _Net, slots: int, K: int, **opts) -> tuple[InaSender, Segment, np.ndarray]:
    """Chunks 0..K-1 through one window of a sender whose I/O is ``net``; returns the sender, the segment and the
    contributions."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unused:  # the sender's own socket: net stands in for it
        sender = InaSender(unused, StreamOptions(op_timeout=10.0, **opts), StreamStats(), job_id=JOB,
                           worker_id=ME.wid, name="w")
    sender.io, sender.poll = net, _Poll()
    contrib = np.arange(K * wire.LANES, dtype=np.int32).reshape(K, wire.LANES)
    seg = Segment(0, contrib)
    rack = Rack("s1", (SWITCH_IP, wire.INA_UDP_PORT), slots, (ME.wid, PEER.wid))
    try:
        sender.run(seg, 0, rack, generation=GEN, base=0, check=lambda: None)
    finally:
        sender.close()
    return sender, seg, contrib


def _exact(seg: Segment, contrib: np.ndarray) -> bool:
    got = np.frombuffer(bytes(seg.res32), dtype=">i4").reshape(contrib.shape)
    return bool((got == contrib + 1).all()) and all(seg.src)


@pytest.mark.local  # a socket pair stands for the switch
def test_a_chunk_the_switch_reports_lost_gets_its_payload_again() -> None:
    net = _Net(16, lost={(5, 1)})
    sender, seg, contrib = _run(net, 16, 40)
    assert _exact(seg, contrib)
    assert sender.stats.gap_reports >= 1 and sender.stats.signal_resends >= 1
    assert [m for m, s, _ in net.arrived if s == 5] == [wire.MsgType.GRADIENT]  # its resend: the payload


@pytest.mark.local  # a socket pair stands for the switch
def test_a_refused_counted_send_gives_its_counters_back_and_its_chunks_go_next_turn() -> None:
    """The socket refuses the last 70 frames of the first run (a full buffer) and later the resend of a lost chunk:
    the switch sees every frame that reached it numbered in sequence (no gap, no "late" run of 64 or more), and every
    chunk still gets its exact result."""
    refusals = {"run": 1, "resend": 1}

    def refuse(run: list[tuple[int, int]]) -> int:
        if len(run) >= 100 and refusals["run"]:
            refusals["run"] -= 1
            return 70
        if len(run) == 1 and run[0][1] & int(wire.Flags.RETRANSMIT) and refusals["resend"]:
            refusals["resend"] -= 1
            return 1
        return 0

    net = _Net(128, lost={(150, 1)}, refuse=refuse)
    sender, seg, contrib = _run(net, 128, 300, initial_window=100)
    assert _exact(seg, contrib)
    assert net.refused == 71 and refusals == {"run": 0, "resend": 0}
    # every frame that left the socket took the next counter, the one lost on the way included; refused ones took none
    assert net.counters == [k % TX_MOD for k in range(len(net.counters))] and sender.txn == len(net.counters)
    assert sender.stats.gap_reports == 1  # the lost frame alone
