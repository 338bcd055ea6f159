"""The names controller, agents, simulator and experiments share: all-reduce backends and job states.

Three sets of backends, each named for what it is:

- ``Backend``: how a job's all-reduce runs under one generation. The controller grants one
  (``JobGrant.backend``), every worker derives a plan of that kind (``host_agent.grant.Plan.kind``),
  experiments compare them.
- ``BackendChoice``: what a job asks its agents for (``--backend``, ``JobSpec.backend``): a ``Backend``, or
  ``auto`` for whatever the grant offers (docs/agent.md, "Backends").
- ``SimBackend``: what serves one step of a simulated job: a ``Backend``, or ``local`` for a job of one
  worker (no all-reduce).

All are ``StrEnum``: their members are the strings the admission protocol, the database, the job files
and the reports carry, so they compare equal to them.
"""
from __future__ import annotations

import enum

__all__ = ["Backend", "BackendChoice", "JobState", "SimBackend"]


class Backend(enum.StrEnum):
    INA = "ina"  # one switch holds every worker; its results are final
    RING = "ring"  # a TCP ring of all workers, no switch
    RINA = "rina"  # racks aggregate in their switches, a ring joins the racks' representatives
    TREE = "tree"  # racks aggregate in their ToRs, the ToRs' partials in a root switch; results final at every ToR


class BackendChoice(enum.StrEnum):
    AUTO = "auto"
    INA = "ina"
    RING = "ring"
    RINA = "rina"


class SimBackend(enum.StrEnum):
    LOCAL = "local"
    INA = "ina"
    RINA = "rina"
    TREE = "tree"  # ina-sim: two-level tree, the racks' ToRs and the spine aggregate
    RING = "ring"


class JobState(enum.StrEnum):
    """``JobInfo.state``."""

    RUNNING = "running"  # the job holds slots somewhere
    WAITING = "waiting"  # no slots: the job runs over the ring until it gets some
    RELEASED = "released"
