"""The controller's refusal: one error type carrying the gRPC status code the admission service answers with."""
from __future__ import annotations

import grpc

__all__ = ["ControllerError"]


class ControllerError(Exception):
    """A request the controller refuses: a gRPC status code and one readable line."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
