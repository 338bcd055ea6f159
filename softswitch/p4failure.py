"""How ina-switch's P4Runtime service refuses a request: a gRPC status code and a message naming the problem.

Every part of the service (schema, arbitrator, entity codecs, server) raises :class:`P4RuntimeFailure`; the
gRPC face turns it into the RPC's status, a Write into one ``p4.v1.Error`` per update (space ``ERROR_SPACE``,
as p4lang/PI fills it for BMv2).
"""
from __future__ import annotations

import grpc
from p4.v1 import p4runtime_pb2

__all__ = ["ERROR_SPACE", "Code", "P4RuntimeFailure", "check_update_type", "fail"]

Code = grpc.StatusCode
Update = p4runtime_pb2.Update
ERROR_SPACE = "ALL-sswitch-p4org"  # p4.v1.Error.space as PI fills it for BMv2


class P4RuntimeFailure(Exception):
    """A request (or one update of a batch) refused with a gRPC status code and a message naming the problem."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def fail(code: grpc.StatusCode, message: str) -> P4RuntimeFailure:
    """The failure to raise: ``raise fail(Code.NOT_FOUND, "...")``."""
    return P4RuntimeFailure(code, message)


def check_update_type(utype: int) -> None:
    """INSERT, MODIFY or DELETE; anything else is INVALID_ARGUMENT, as PI says it."""
    if utype == Update.UNSPECIFIED:
        raise fail(Code.INVALID_ARGUMENT, "Update type is not set")
    if utype not in (Update.INSERT, Update.MODIFY, Update.DELETE):
        raise fail(Code.INVALID_ARGUMENT, f"Invalid update type {utype}")
