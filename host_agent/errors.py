"""The agent's error family: every failure an all-reduce or a call to the controller reports derives from AgentError."""
from __future__ import annotations

import grpc

__all__ = ["AdmissionError", "AgentError", "AgentTimeout", "JobReleased", "StaleGeneration"]


class AgentError(RuntimeError):
    """The all-reduce cannot complete (peer failure, controller error, protocol violation)."""


class AgentTimeout(AgentError, TimeoutError):
    """No progress for the operation timeout."""


class JobReleased(AgentError):
    """The controller released the job (or it timed out there): no further all-reduce is possible."""


class StaleGeneration(AgentError):
    """SyncGeneration was refused because the job has moved to a newer generation (FAILED_PRECONDITION)."""


class AdmissionError(AgentError):
    """A call to the controller failed; ``code`` is the gRPC status code (None if not from gRPC)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, details: str = ""):
        super().__init__(message)
        self.code = code
        self.details = details


class Interrupted(Exception):
    """Internal to the stream: a newer generation is pending; stop and resynchronise (never leaves ChunkStream)."""
