"""softswitch/ring_io.py on a veth pair: frames in order, as one array when they share a length, ring wrap-around."""
from __future__ import annotations

import numpy as np
import pytest

from softswitch.port_socket import open_port_socket
from softswitch.ring_io import SMALL_BATCH, PacketRing, RingUnavailable
from topologies.netns import Network, sweep_stale, wait_until

ETHERTYPE = b"\x88\xb5"  # local experimental: nothing else on the link uses it


def _frame(i: int, size: int = 184) -> bytes:
    return bytes([2, 0, 0, 0, i >> 8, i & 0xFF]) + b"\x02" * 6 + ETHERTYPE + bytes([i & 0xFF]) * (size - 14)


@pytest.fixture
def pair(request):
    sweep_stale()
    with Network("ring") as net:
        a, b = net.add_namespace("a"), net.add_namespace("b")
        request.node.ring_namespace = a
        net.add_veth(a, "ra0", b, "rb0")
        with a.entered():
            ring_sock, _ = open_port_socket("ra0")
        with b.entered():
            peer, _ = open_port_socket("rb0")
        try:
            ring = PacketRing(ring_sock)
        except RingUnavailable as e:
            ring_sock.close()
            peer.close()
            pytest.skip(f"this kernel gives no PACKET_MMAP rings: {e}")
        try:
            yield ring, peer
        finally:
            ring.close()
            ring_sock.close()
            peer.close()


def _receive_all(ring: PacketRing, count: int) -> list:
    batches = []

    def enough() -> bool:
        got = ring.receive_batch(512)
        if len(got):
            batches.append(got)
        return sum(map(len, batches)) >= count

    wait_until(enough, 5, message=f"{count} frames through the receive ring")
    return batches


def test_equal_length_frames_come_as_one_array_in_order_across_the_ring_end(pair):
    ring, peer = pair
    sent = [_frame(i) for i in range(ring._rx_frames + 300)]  # past the end of the receive ring
    got: list[bytes] = []
    arrays = 0
    for start in range(0, len(sent), 400):
        for f in sent[start : start + 400]:
            peer.send(f)
        for batch in _receive_all(ring, len(sent[start : start + 400])):
            if isinstance(batch, np.ndarray):
                assert batch.shape[1] == 184
                arrays += 1
            else:  # a few frames at a time are read one by one
                assert len(batch) < SMALL_BATCH
            got += [bytes(row) for row in batch]
    assert got == sent
    assert arrays >= len(sent) // 512


def test_a_few_frames_are_read_at_once_as_bytes(pair):
    ring, peer = pair
    sent = [_frame(i) for i in range(3)]
    for f in sent:
        peer.send(f)
    got = [f for batch in _receive_all(ring, len(sent)) for f in batch]
    assert got == sent and all(isinstance(f, bytes) for f in got)


def test_frames_of_different_lengths_come_as_a_list_in_order(pair):
    ring, peer = pair
    sent = [_frame(i, 60 + i) for i in range(20)]
    for f in sent:
        peer.send(f)
    got = [f for batch in _receive_all(ring, len(sent)) for f in (batch if isinstance(batch, list) else
                                                                   [r.tobytes() for r in batch])]
    assert got == sent


def test_send_rows_and_send_deliver_in_order_across_the_ring_end(pair):
    ring, peer = pair
    rows = np.frombuffer(b"".join(_frame(i) for i in range(100)), np.uint8).reshape(100, -1)
    expected = []
    for _ in range(12):  # 1,200 frames through a 1,024-slot ring
        ring.send_rows(rows)
        ring.flush()
        expected += [r.tobytes() for r in rows]
    ring.send(_frame(7, 90))
    ring.flush()
    expected.append(_frame(7, 90))
    got: list[bytes] = []
    peer.settimeout(5)
    while len(got) < len(expected):
        f = peer.recv(4096)
        if f[12:14] == ETHERTYPE:
            got.append(f)
    assert got == expected


def test_frames_after_a_qdisc_drop_still_leave(pair, request):
    """A full qdisc makes a flush fail (ENOBUFS) part-way: the unsent frames are dropped and counted, and the
    next frames leave at once (the ring stays in step with the kernel's transmit head)."""
    ring, peer = pair
    ns = request.node.ring_namespace
    ns.run(["tc", "qdisc", "add", "dev", "ra0", "root", "tbf", "rate", "1mbit", "burst", "1600", "limit", "1600"])
    rows = np.frombuffer(b"".join(_frame(i) for i in range(200)), np.uint8).reshape(200, -1)
    with pytest.raises(OSError):
        ring.send_rows(rows)
        ring.flush()
    assert 0 < ring.tx_dropped < 200
    ns.run(["tc", "qdisc", "del", "dev", "ra0", "root"])
    after = [_frame(1000 + i, 100) for i in range(5)]
    for f in after:
        ring.send(f)
    ring.flush()
    got: list[bytes] = []
    peer.settimeout(5)
    while len(got) < len(after):
        f = peer.recv(4096)
        if len(f) == 100 and f[12:14] == ETHERTYPE:
            got.append(f)
    assert got == after
