"""The generation barrier (SyncGeneration): after a generation change every worker of the job reports its first
missing chunk; once all have, every one of them resumes at the minimum (docs/agent.md, "Generations").

The barrier of each job is kept until the job changes generation again; its resume chunk is persisted, so
that a restarted controller answers late reporters the same way.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from controller.errors import Refusal
from controller.store import Job
from inaproto.job_entries import split_generation

__all__ = ["GenerationBarriers"]

log = logging.getLogger("controller.core")


@dataclass
class _Barrier:
    generation: int
    reports: dict[int, int] = field(default_factory=dict)  # worker_id -> first missing chunk
    resume: int | None = None


class GenerationBarriers:
    """The barriers of all jobs. Every method is called with ``cv``'s lock held (the controller's lock)."""

    def __init__(self, cv: threading.Condition) -> None:
        self._cv = cv
        self._by_job: dict[int, _Barrier] = {}

    def restore(self, job_id: int, generation: int, resume: int) -> None:
        """A barrier completed before a restart (from the database)."""
        self._by_job[job_id] = _Barrier(generation, resume=resume)

    def discard(self, job_id: int) -> None:
        self._by_job.pop(job_id, None)

    def sync(
        self,
        job: Job,
        worker_id: int,
        generation: int,
        first_missing: int,
        *,
        deadline: float,
        wait: float,
        current: Callable[[int], Job | None],
        running: Callable[[], bool],
        save: Callable[[int, int, int], None],
    ) -> int:
        """Report ``worker_id``'s first missing chunk for ``generation`` (the job's current one) and wait, until
        ``deadline`` (time.monotonic), for every worker's report; returns the resume chunk.

        ``current(job_id)`` is the job now (None once released), ``running()`` whether the controller still
        serves, ``save(job_id, generation, resume)`` persists the result before anyone sees it.
        """
        job_id = job.job_id
        b = self._by_job.get(job_id)
        if b is None or b.generation != generation:
            b = self._by_job[job_id] = _Barrier(generation)
        if b.resume is None:
            b.reports[worker_id] = first_missing
            if set(b.reports) >= set(job.worker_ids):
                resume = min(b.reports.values())
                save(job_id, generation, resume)
                b.resume = resume
                log.info("job %d: generation %d resumes at chunk %d", job_id, generation, b.resume)
                self._cv.notify_all()
        while b.resume is None:
            cur = current(job_id)
            if not running():
                raise Refusal(grpc.StatusCode.UNAVAILABLE, "controller is shutting down")
            if cur is None:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} was released")
            if split_generation(cur.generation)[0] != generation:
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"job {job_id}: generation {generation} was replaced by {split_generation(cur.generation)[0]} while waiting",
                )
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(cur.worker_ids) - set(b.reports))
                raise Refusal(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"job {job_id}: workers {missing} did not report for generation {generation} within {wait:g} s",
                )
            self._cv.wait(left)
        return b.resume
