"""The controller's error family: every error the controller package raises derives from ControllerError."""
from __future__ import annotations

import grpc

__all__ = ["ControllerError", "Refusal"]


class ControllerError(Exception):
    """Base of the controller's errors (refusals, P4Runtime failures, database, topology and schema errors)."""


class Refusal(ControllerError):
    """A request the controller refuses: a gRPC status code and one readable line."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
