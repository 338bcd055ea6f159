"""Generation wrap: the wire generation is 16 bits and repeats after 65,535 reallocations of a job; the slot
owner tag (owner_epoch ++ job ++ generation) does not, so a slot never resumes another generation's state."""
from __future__ import annotations

import pytest

from inaproto import wire
from inaproto.job_entries import GENERATIONS, WorkerAddress, job_entries, split_generation
from inaproto.scapy_layer import INA
from inaproto.wire import DropReason
from tests.support.frames import dissect, gradient, make_workers

JOB = 9


def _program(target, workers, serial: int, *, insert: bool = False) -> int:
    """The job's entries for generation serial ``serial`` (as the controller writes them); returns the wire
    generation."""
    generation, epoch = split_generation(serial)
    entries = job_entries(JOB, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in workers],
                          base_slot=5, num_slots=1, generation=generation, owner_epoch=epoch)
    if insert:
        entries.insert_into(target)
    else:
        target.modify_entry(entries.job.table, entries.job.match, entries.job.action, entries.job.params)
    return generation


def test_split_generation_wraps_into_the_epoch():
    assert [split_generation(s) for s in (1, 2, GENERATIONS, GENERATIONS + 1, 2 * GENERATIONS + 1)] == [
        (1, 0), (2, 0), (65535, 0), (1, 1), (1, 2)]


def test_same_wire_generation_one_wrap_later_starts_clean(target):
    """Generation serial g leaves worker 0's contribution in the slot; 65,535 reallocations later the job has
    the same wire generation again (serial g + 65535). The slot is reset, not resumed: worker 1's and worker 0's
    new contributions sum exactly, without the stale 1000."""
    workers = make_workers(2)
    serial = GENERATIONS - 1  # just below the wrap
    gen = _program(target, workers, serial, insert=True)
    target.send(1, gradient(workers[0], JOB, 0, [1000] * wire.LANES, seq=10, generation=gen))
    assert target.receive(expect=0, timeout=0.05) == []
    later = _program(target, workers, serial + GENERATIONS)
    assert later == gen
    target.send(2, gradient(workers[1], JOB, 0, [2] * wire.LANES, seq=10, generation=gen))
    assert target.receive(expect=0, timeout=0.05) == [], "worker 1 must not complete the stale round"
    target.send(1, gradient(workers[0], JOB, 0, [1] * wire.LANES, seq=10, generation=gen))
    out = target.receive(expect=2)
    assert sorted(p for p, _ in out) == [1, 2]
    assert all(dissect(f)[INA].lanes == [3] * wire.LANES and dissect(f)[INA].generation == gen for _, f in out)


@pytest.mark.parametrize("start", [GENERATIONS - 2, 2 * GENERATIONS - 1])
def test_driven_across_the_wrap(target, start):
    """Serials from just below a wrap to past it: every generation's round is exact, an older generation's
    packet is dropped as STALE_GENERATION, and each new generation resets the slot (a half-finished round of
    the previous one never leaks)."""
    workers = make_workers(2)
    _program(target, workers, start, insert=True)
    previous = None
    for k, serial in enumerate(range(start, start + 5)):
        gen = _program(target, workers, serial)
        if previous is not None:
            target.send(2, gradient(workers[1], JOB, 0, [77] * wire.LANES, seq=k, generation=previous))
            assert target.receive(expect=0, timeout=0.05) == []
        target.send(1, gradient(workers[0], JOB, 0, [k] * wire.LANES, seq=k, generation=gen))
        target.send(2, gradient(workers[1], JOB, 0, [10 * k] * wire.LANES, seq=k, generation=gen))
        out = target.receive(expect=2)
        assert sorted(p for p, _ in out) == [1, 2]
        assert all(dissect(f)[INA].lanes == [11 * k] * wire.LANES for _, f in out), f"serial {serial}"
        # leave worker 0's next chunk half done: the next generation must not see it
        target.send(1, gradient(workers[0], JOB, 0, [500] * wire.LANES, seq=k + 100, generation=gen))
        assert target.receive(expect=0, timeout=0.05) == []
        previous = gen
    assert target.read_counter("MyIngress.ina_job_drops", JOB * wire.NUM_DROP_REASONS + DropReason.STALE_GENERATION) == 4
