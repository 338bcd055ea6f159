"""bench/slot_turnaround.py: a slot's turnaround split into the switch's residence, the agents' reaction and skew."""
from __future__ import annotations

import importlib.util
import socket
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("slot_turnaround", ROOT / "bench" / "slot_turnaround.py")
st = importlib.util.module_from_spec(_spec)
sys.modules["slot_turnaround"] = st  # dataclasses look their module up
_spec.loader.exec_module(st)

HOSTS = ("10.0.1.1", "10.0.1.2")
SWITCH = "10.0.0.254"


def _frame(t: float, outgoing: bool, src: str, dst: str, msg: int, job: int, seq: int) -> bytes:
    sll2 = struct.pack(">HHIHBB8s", 0x0800, 0, 3, 1, 4 if outgoing else 0, 6, b"\0" * 8)
    ina = struct.pack(">BBHHHIB", msg, 0, job, 1, seq % 2, seq, 0) + b"\0" * 129
    udp = struct.pack(">HHHH", 47000, 47000, 8 + len(ina), 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp) + len(ina), 0, 0, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    data = sll2 + ip + udp + ina
    sec = int(t)
    return struct.pack("<IIII", sec, round((t - sec) * 1e9), len(data), len(data)) + data


def _pcap(path: Path, frames: list[bytes]) -> None:
    path.write_bytes(struct.pack("<IHHiIII", st.PCAP_NANO, 2, 4, 0, 0, 80, st.LINKTYPE_SLL2) + b"".join(frames))


def test_residence_reaction_skew_and_cycle_of_every_chunk(tmp_path) -> None:
    """One job, 2 workers, 1 slot, 20 chunks: gradients in at 0.1 / 0.3 ms, the result out 10.5 ms after the last."""
    frames, t = [], 100.0
    for seq in range(20):
        frames += [_frame(t + 0.0001, False, HOSTS[0], SWITCH, 1, 7, seq),
                   _frame(t + 0.0003, False, HOSTS[1], SWITCH, 1, 7, seq)]
        out = t + 0.0003 + 0.0105
        frames += [_frame(out, True, SWITCH, h, 2, 7, seq) for h in HOSTS]
        t = out
    path = tmp_path / "cap.pcap"
    _pcap(path, frames)
    jobs = st.split_jobs(st.read_frames(str(path)))
    assert [j.key for j in jobs] == [(0, 7)] and jobs[0].workers == 2
    got = st.turnaround(jobs[0], slots=1)
    assert len(got["residence"]) == 20 and all(x == pytest.approx(0.0105, abs=2e-9) for x in got["residence"])
    assert all(x == pytest.approx(0.0002, abs=2e-9) for x in got["skew"])
    assert sorted(round(x * 1e6) for x in got["reaction"]) == [100] * 19 + [300] * 19
    assert all(x == pytest.approx(0.0003, abs=2e-9) for x in got["slowest"]) and len(got["slowest"]) == 19
    assert all(x == pytest.approx(0.0108, abs=2e-9) for x in got["cycle"]) and len(got["cycle"]) == 38


def test_a_new_testbed_starts_a_new_job_and_bad_input_is_one_line(tmp_path, capsys) -> None:
    frames = [_frame(1.0, False, HOSTS[0], SWITCH, 1, 1, 0), _frame(5.0, False, HOSTS[0], SWITCH, 1, 1, 0)]
    path = tmp_path / "two.pcap"
    _pcap(path, frames)
    assert [j.key for j in st.split_jobs(st.read_frames(str(path)))] == [(0, 1), (1, 1)]
    (tmp_path / "bad.pcap").write_bytes(b"not a capture at all, longer than 24 bytes")
    assert st.main([str(tmp_path / "bad.pcap"), "--slots", "1"]) == 2
    assert st.main([str(path), "--slots", "0"]) == 2
    assert st.main([str(path), "--slots", "1"]) == 1  # no job of 4 workers
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("slot_turnaround: ") for line in err)
