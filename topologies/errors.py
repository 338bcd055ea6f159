"""The testbed's error family: every error ``topologies`` raises for the user derives from TopologiesError.

    PlanError            a topology that cannot be addressed (topologies.plan)
    SwitchStartupError   a switch process that did not come up (topologies.nodes)
    ExperimentError      an experiment that cannot run as configured (here: the runner and the testbed use it)
    AgentFailure         a job's agents failed or timed out (topologies.experiments.testbed)
"""
from __future__ import annotations

__all__ = ["ExperimentError", "TopologiesError"]


class TopologiesError(Exception):
    """Base of the testbed's errors (topologies, Mininet nodes, experiments); the message is one line for the user."""


class ExperimentError(TopologiesError, RuntimeError):
    """An experiment cannot run as configured (missing tool, bad option); one line for the user."""
