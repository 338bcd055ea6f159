"""A job's switch entries for tests, written the way the controller writes them (``inaproto/job_entries.py``),
into any target with the control methods of ``tests.targets.Target`` (the model, a P4Runtime client)."""
from __future__ import annotations

from inaproto.job_entries import WorkerAddress, job_entries
from tests.support.frames import Worker

__all__ = ["install_job"]


def install_job(
    target, job_id: int, workers: list[Worker], base: int, num_slots: int, generation: int = 0, mcast_grp: int | None = None
) -> int:
    """The table entries and multicast group the controller writes for one job; returns the group id."""
    entries = job_entries(job_id, [WorkerAddress(w.wid, w.port, w.mac, w.ip, w.udp_port) for w in workers],
                          base_slot=base, num_slots=num_slots, generation=generation, mcast_grp=mcast_grp)
    entries.insert_into(target)
    return entries.group.group_id
