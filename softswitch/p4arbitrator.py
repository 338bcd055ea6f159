"""Primary election among a device's StreamChannel clients, as p4lang/PI does it for the default role.

The highest election id among open streams is primary; every client hears (``MasterArbitrationUpdate``) when
the primary changes. Write and SetForwardingPipelineConfig must carry the primary's election id.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2

from softswitch.p4failure import Code, fail

__all__ = ["CLOSE", "MAX_CONNECTIONS", "Abort", "Arbitrator", "Connection", "election_id_str", "u128"]

logger = logging.getLogger("ina.p4runtime")

MAX_CONNECTIONS = 16  # stream clients per device, as PI
CLOSE = object()  # stream outbox sentinel: end the RPC with OK


@dataclass
class Abort:
    """An outbox item that ends the stream with a status code."""

    code: grpc.StatusCode
    message: str


class Connection:
    """One StreamChannel: its election id once it has sent an arbitration update, and its outgoing messages."""

    def __init__(self, peer: str):
        self.peer = peer
        self.election_id: int | None = None
        self.device_id: int | None = None
        self.outbox: queue.Queue = queue.Queue()


def u128(msg: p4runtime_pb2.Uint128) -> int:
    return (msg.high << 64) | msg.low


def election_id_str(eid: int) -> str:
    return f"({eid >> 64}, {eid & ((1 << 64) - 1)})"


class Arbitrator:
    """Primary election for the default role, as PI does it: the highest election id among open streams."""

    def __init__(self, device_id: int):
        self.device_id = device_id
        self.lock = threading.Lock()
        self.connections: list[Connection] = []  # sorted by election id, highest first

    def primary(self) -> Connection | None:
        return self.connections[0] if self.connections else None

    def _sort(self) -> None:
        self.connections.sort(key=lambda c: c.election_id, reverse=True)

    def _notify(self, conn: Connection) -> None:
        primary = self.connections[0]
        msg = p4runtime_pb2.StreamMessageResponse()
        arb = msg.arbitration
        arb.device_id = self.device_id
        arb.election_id.high, arb.election_id.low = primary.election_id >> 64, primary.election_id & ((1 << 64) - 1)
        if conn is primary:
            arb.status.code, arb.status.message = code_pb2.OK, "Is primary"
        else:
            arb.status.code, arb.status.message = code_pb2.ALREADY_EXISTS, "Is backup"
        conn.outbox.put(msg)

    def _notify_all(self) -> None:
        for c in self.connections:
            self._notify(c)

    def update(self, conn: Connection, election_id: int) -> None:
        """First or later arbitration update of ``conn``; raises P4RuntimeFailure to end the stream."""
        with self.lock:
            if any(c is not conn and c.election_id == election_id for c in self.connections):
                raise fail(Code.INVALID_ARGUMENT, f"Election id {election_id_str(election_id)} already exists")
            was_primary = self.primary() is conn
            if conn.election_id is None:
                if len(self.connections) >= MAX_CONNECTIONS:
                    raise fail(Code.RESOURCE_EXHAUSTED, f"Too many connections (at most {MAX_CONNECTIONS})")
                conn.election_id = election_id
                self.connections.append(conn)
            else:
                conn.election_id = election_id
            self._sort()
            is_primary = self.primary() is conn
            if is_primary != was_primary:
                logger.info("P4Runtime: primary is now %s with election id %s", conn.peer, election_id_str(election_id))
                self._notify_all()
            else:
                self._notify(conn)

    def remove(self, conn: Connection) -> None:
        with self.lock:
            if conn not in self.connections:
                return
            was_primary = self.primary() is conn
            self.connections.remove(conn)
            logger.info("P4Runtime: stream of %s closed", conn.peer)
            if was_primary and self.connections:
                logger.info("P4Runtime: primary is now %s with election id %s",
                            self.connections[0].peer, election_id_str(self.connections[0].election_id))
                self._notify_all()

    def check_primary(self, request) -> None:
        """PI's rule for Write and SetForwardingPipelineConfig: with no stream open, only a request without an
        election id is accepted; otherwise its election id must be the primary's."""
        has = request.HasField("election_id")
        eid = u128(request.election_id)
        with self.lock:
            primary = self.primary()
            if primary is None:
                if has:
                    raise fail(Code.PERMISSION_DENIED,
                                f"Not primary: election id {election_id_str(eid)} given but no client holds a stream")
            elif primary.election_id != eid:
                raise fail(Code.PERMISSION_DENIED,
                            f"Not primary: election id {election_id_str(eid)}, the primary's is {election_id_str(primary.election_id)}")


