"""Persistence of the controller's state in SQLite (WAL): jobs, their grants, the policy, id counters.

Every change of allocation is one transaction (:meth:`Store.save`), committed with ``synchronous=FULL``,
so a ``kill -9`` at any moment leaves either the state before or the state after it. Heartbeat times are
not stored: after a restart every job gets a fresh heartbeat deadline.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from controller.errors import ControllerError
from controller.policies import SlotRange
from inaproto import admission_pb2 as pb

__all__ = ["Job", "Store", "StoreError"]

SCHEMA_VERSION = 2  # 2: jobs.secret_hash

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id        INTEGER PRIMARY KEY,
    seq           INTEGER NOT NULL,      -- admission order
    request       BLOB    NOT NULL,      -- RegisterJobRequest, serialized
    placement     TEXT    NOT NULL,      -- JSON [[worker_id, switch, port], ...]
    registered_at REAL    NOT NULL,
    generation    INTEGER NOT NULL,
    backend       TEXT    NOT NULL,
    reason        TEXT    NOT NULL,
    secret_hash   TEXT    NOT NULL DEFAULT ''  -- controller/auth.py hash_secret of the job's secret
);
CREATE TABLE IF NOT EXISTS grants (
    job_id INTEGER NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    switch TEXT    NOT NULL,
    base   INTEGER NOT NULL,
    size   INTEGER NOT NULL,             -- 0: no slots on this switch
    PRIMARY KEY (job_id, switch)
);
CREATE TABLE IF NOT EXISTS barriers (    -- the last completed SyncGeneration barrier of each job
    job_id     INTEGER PRIMARY KEY REFERENCES jobs(job_id) ON DELETE CASCADE,
    generation INTEGER NOT NULL,
    resume     INTEGER NOT NULL
);
"""


class StoreError(ControllerError, RuntimeError):
    """The database cannot be opened or is not a controller database."""


@dataclass(frozen=True)
class Job:
    """One admitted job, as the controller holds and persists it. Changes make a new Job (``replace``)."""

    job_id: int
    seq: int
    request: pb.RegisterJobRequest
    placement: tuple[tuple[int, str, int], ...]  # (worker_id, switch, port)
    registered_at: float
    generation: int
    backend: str = "ring"
    reason: str = ""
    ranges: tuple[tuple[str, SlotRange | None], ...] = ()  # per INA switch the job has workers under
    secret_hash: str = field(default="", repr=False)  # salted hash of the job's secret ("" = admin only)

    @property
    def worker_ids(self) -> list[int]:
        return [w for w, _, _ in self.placement]

    def switches(self) -> list[str]:
        """Switches the job's workers sit under, in order of first appearance."""
        out: list[str] = []
        for _, sw, _ in self.placement:
            if sw not in out:
                out.append(sw)
        return out

    def workers_on(self, switch: str) -> list[tuple[int, int]]:
        """(worker_id, port) of the job's workers under `switch`."""
        return [(w, p) for w, sw, p in self.placement if sw == switch]

    def range_on(self, switch: str) -> SlotRange | None:
        return dict(self.ranges).get(switch)

    def with_ranges(self, ranges: dict[str, SlotRange | None], **changes) -> Job:
        return replace(self, ranges=tuple(sorted(ranges.items())), **changes)


class Store:
    """The controller's SQLite database. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            version = self.get_meta("schema_version")
            if version is None:
                self._set_meta_now({"schema_version": str(SCHEMA_VERSION)})
            elif int(version) == 1:  # before tenants: its jobs answer only the admin credential
                self._db.execute("ALTER TABLE jobs ADD COLUMN secret_hash TEXT NOT NULL DEFAULT ''")
                self._set_meta_now({"schema_version": str(SCHEMA_VERSION)})
            elif int(version) != SCHEMA_VERSION:
                raise StoreError(f"{self.path}: schema version {version}, this controller uses {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- meta ---------------------------------------------------------------------------------------
    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def _set_meta_now(self, meta: dict[str, str]) -> None:
        self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", list(meta.items()))

    # --- jobs ---------------------------------------------------------------------------------------
    def load_jobs(self) -> list[Job]:
        """Every stored job, in admission order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, seq, request, placement, registered_at, generation, backend, reason, secret_hash"
                " FROM jobs ORDER BY seq"
            ).fetchall()
            grants = self._db.execute("SELECT job_id, switch, base, size FROM grants").fetchall()
        by_job: dict[int, dict[str, SlotRange | None]] = {}
        for job_id, switch, base, size in grants:
            by_job.setdefault(job_id, {})[switch] = SlotRange(base, size) if size > 0 else None
        jobs = []
        for job_id, seq, request, placement, registered_at, generation, backend, reason, secret_hash in rows:
            req = pb.RegisterJobRequest()
            req.ParseFromString(request)
            jobs.append(
                Job(
                    job_id=job_id,
                    seq=seq,
                    request=req,
                    placement=tuple((int(w), str(s), int(p)) for w, s, p in json.loads(placement)),
                    registered_at=registered_at,
                    generation=generation,
                    backend=backend,
                    reason=reason,
                    ranges=tuple(sorted(by_job.get(job_id, {}).items())),
                    secret_hash=secret_hash,
                )
            )
        return jobs

    def load_barriers(self) -> dict[int, tuple[int, int]]:
        """job_id -> (generation, resume chunk) of each job's last completed barrier."""
        with self._lock:
            return {j: (g, r) for j, g, r in self._db.execute("SELECT job_id, generation, resume FROM barriers")}

    def save_barrier(self, job_id: int, generation: int, resume: int) -> None:
        """Remember a completed barrier, so that a worker whose answer a crash lost gets it after a restart."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO barriers (job_id, generation, resume) VALUES (?, ?, ?)", (job_id, generation, resume))

    def save(self, jobs: Iterable[Job] = (), deleted: Iterable[int] = (), meta: dict[str, str] | None = None) -> None:
        """Write changed jobs, delete released ones and update meta keys, all in one transaction."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                for job_id in deleted:
                    db.execute("DELETE FROM barriers WHERE job_id = ?", (job_id,))
                    db.execute("DELETE FROM grants WHERE job_id = ?", (job_id,))
                    db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
                for j in jobs:
                    db.execute(
                        "INSERT INTO jobs (job_id, seq, request, placement, registered_at, generation, backend, reason,"
                        " secret_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET"
                        " seq = excluded.seq, request = excluded.request, placement = excluded.placement,"
                        " registered_at = excluded.registered_at, generation = excluded.generation,"
                        " backend = excluded.backend, reason = excluded.reason, secret_hash = excluded.secret_hash",
                        (
                            j.job_id,
                            j.seq,
                            j.request.SerializeToString(deterministic=True),
                            json.dumps([list(p) for p in j.placement]),
                            j.registered_at,
                            j.generation,
                            j.backend,
                            j.reason,
                            j.secret_hash,
                        ),
                    )
                    db.execute("DELETE FROM grants WHERE job_id = ?", (j.job_id,))
                    db.executemany(
                        "INSERT INTO grants (job_id, switch, base, size) VALUES (?, ?, ?, ?)",
                        [(j.job_id, sw, r.base if r else 0, r.size if r else 0) for sw, r in j.ranges],
                    )
                if meta:
                    self._set_meta_now(meta)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
