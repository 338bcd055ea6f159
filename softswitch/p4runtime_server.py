"""The P4Runtime service of ina-switch: ``p4.v1.P4Runtime`` over grpcio, in front of an ``InaPipeline``.

Clients (p4runtime-shell, the controller, the tests) talk to it exactly as to BMv2 ``simple_switch_grpc``:
the behaviour follows the P4Runtime 1.4 specification and, where the two differ or the spec leaves room,
p4lang/PI's server (``proto/server/pi_server.cpp``, ``proto/frontend/src/device_mgr.cpp``), which is what
BMv2 runs. docs/p4runtime.md lists what is implemented and every remaining divergence.

This module is the server (RPCs, pipeline config, packet I/O); the concerns it composes each have their own:
``softswitch.p4program`` (which P4Info and device config are this switch's program), ``softswitch.p4schema``
(ids and widths), ``softswitch.p4arbitrator`` (primary election), ``softswitch.p4entities`` (one handler
per entity kind) and ``softswitch.p4failure`` (how a request is refused).

Packet I/O: ``send_packet_in(frame)`` takes a frame the pipeline emitted on the CPU port (it starts with the
2-byte ``packet_in`` header) and streams it to the primary client; a ``PacketOut`` from the primary becomes a
frame with the 2-byte ``packet_out`` header, handed to ``packet_out`` (or run through the pipeline here when
``packet_out`` is None, see ``P4RuntimeServer``).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Self

import grpc
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from p4src.ina_model import InaPipeline
from p4src.p4info import load_p4info
from p4src.v1model import P4RUNTIME_PORT
from softswitch.p4arbitrator import CLOSE, MAX_CONNECTIONS, Abort, Arbitrator, Connection, election_id_str, u128
from softswitch.p4entities import P4Entities
from softswitch.p4failure import ERROR_SPACE, Code, P4RuntimeFailure, fail
from softswitch.p4program import device_config_mismatch, p4info_mismatch
from softswitch.p4schema import P4Schema, canonical, pack_header, to_int, unpack_header

__all__ = ["API_VERSION", "P4RuntimeServer"]

logger = logging.getLogger("ina.p4runtime")

API_VERSION = "1.4.1"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a BMv2 JSON can be large; PI's server allows this much too
READ_CHUNK = 1000  # entities per streamed ReadResponse
PACKET_IN_QUEUE_LIMIT = 10_000  # packet-ins waiting for a slow primary before new ones are dropped

SetConfig = p4runtime_pb2.SetForwardingPipelineConfigRequest
GetConfig = p4runtime_pb2.GetForwardingPipelineConfigRequest


@dataclass
class _Config:
    p4info: p4info_pb2.P4Info
    device_config: bytes
    cookie: p4runtime_pb2.ForwardingPipelineConfig.Cookie | None


class P4RuntimeServer:
    """The P4Runtime gRPC service of one ina-switch device, usable in-process.

    Args:
        pipeline: the data plane whose tables, multicast groups and counters the service reads and writes
            (under ``pipeline.lock``).
        device_id: the P4Runtime device id (``--device-id``); requests for another id get NOT_FOUND.
        address: where to listen, ``host:port``; port 0 picks a free one (``start()`` returns it).
        cpu_port: the pipeline's CPU port (``--cpu-port``, 255 for ina.p4). None: no packet-out.
        packet_out: called with each PacketOut of the primary as a frame that already carries the 2-byte
            ``packet_out`` header (egress_port:9, _pad:7), from the stream's reader thread; the data-plane
            owner feeds it to ``pipeline.process(cpu_port, frame)`` and sends the outputs. If None, the
            server does that itself: it runs ``pipeline.process(cpu_port, frame)``, streams outputs on
            ``cpu_port`` back as PacketIns (``send_packet_in``) and hands all others, as one list of
            ``(port, frame)``, to ``emit``.
        emit: receives those other outputs when ``packet_out`` is None (``None``: they are dropped and logged).
        initial_p4info: a P4Info to start with, as ``simple_switch_grpc`` started with a JSON: Write and Read
            work before any SetForwardingPipelineConfig. Must be the program's P4Info (ValueError if not).
        initial_device_config: the device config reported by GetForwardingPipelineConfig with that P4Info.
        reference_p4info: the program's P4Info every pushed P4Info is held against (default: the committed
            ``p4src/ina.p4info.txt``).

    Example::

        server = P4RuntimeServer(InaPipeline(), device_id=1, address="127.0.0.1:0", cpu_port=255)
        port = server.start()
        ...
        server.stop()
    """

    def __init__(
        self,
        pipeline: InaPipeline,
        *,
        device_id: int,
        address: str = f"127.0.0.1:{P4RUNTIME_PORT}",
        cpu_port: int | None = None,
        packet_out: Callable[[bytes], None] | None = None,
        emit: Callable[[list[tuple[int, bytes]]], None] | None = None,
        initial_p4info: p4info_pb2.P4Info | None = None,
        initial_device_config: bytes = b"",
        reference_p4info: p4info_pb2.P4Info | None = None,
        server_credentials: grpc.ServerCredentials | None = None,
    ):
        self.pipeline = pipeline
        self.device_id = device_id
        self.address = address
        self._credentials = server_credentials  # TLS (grpc.ssl_server_credentials); None: plaintext
        self.cpu_port = cpu_port
        self._packet_out_fn = packet_out
        self._emit = emit
        self.reference_p4info = reference_p4info if reference_p4info is not None else load_p4info()
        self._schema = P4Schema(self.reference_p4info)
        self._entities = P4Entities(pipeline, self._schema)
        self._arbiter = Arbitrator(device_id)
        self._write_lock = threading.Lock()  # one Write / SetForwardingPipelineConfig at a time
        self._config: _Config | None = None
        self._saved: _Config | None = None  # VERIFY_AND_SAVE, waiting for COMMIT
        self._server: grpc.Server | None = None
        self.port: int | None = None
        self.packets_in = 0  # PacketIns streamed to a primary
        self.packets_in_dropped = 0  # no primary, no config, or primary too slow
        self.packets_out = 0  # PacketOuts accepted from the primary
        if initial_p4info is not None:
            why = p4info_mismatch(self.reference_p4info, initial_p4info) or device_config_mismatch(initial_device_config)
            if why:
                raise ValueError(f"initial P4Info / device config is not the program this switch runs: {why}")
            self._config = _Config(initial_p4info, initial_device_config, None)

    @property
    def configured(self) -> bool:
        """True once a forwarding pipeline config is set (or ``initial_p4info`` was given)."""
        return self._config is not None

    # --- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> int:
        """Listen on ``address``; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("P4Runtime server already started")
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=MAX_CONNECTIONS + 8, thread_name_prefix="p4rt"),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
        )
        p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(_Service(self), server)
        try:
            if self._credentials is not None:
                port = server.add_secure_port(self.address, self._credentials)
            else:
                port = server.add_insecure_port(self.address)
        except RuntimeError as e:
            raise RuntimeError(f"P4Runtime server cannot listen on {self.address}: {e}") from None
        if port == 0:
            raise RuntimeError(f"P4Runtime server cannot listen on {self.address}")
        server.start()
        self._server, self.port = server, port
        logger.info("P4Runtime server for device %d listening on %s (port %d)", self.device_id, self.address, port)
        return port

    def stop(self, grace: float = 0.5) -> None:
        """End every stream and stop serving; waits at most ``grace`` seconds for RPCs in flight."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._arbiter.lock:
            conns = list(self._arbiter.connections)
        for c in conns:
            c.outbox.put(CLOSE)
        server.stop(grace).wait()
        logger.info("P4Runtime server for device %d stopped", self.device_id)

    def __enter__(self) -> Self:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- packet I/O ------------------------------------------------------------------------------------------
    def send_packet_in(self, frame_with_packet_in_header: bytes) -> None:
        """Stream a frame the pipeline emitted on the CPU port to the primary client as a PacketIn.

        The frame starts with the ``packet_in`` header (ingress_port:9, _pad:7), which becomes the PacketIn's
        metadata (ids from the P4Info, canonical bytestrings); the rest is the payload. Dropped (and counted
        in ``packets_in_dropped``) when no pipeline config is set, no client is primary, or the primary has
        ``PACKET_IN_QUEUE_LIMIT`` messages waiting. Thread-safe.
        """
        if self._config is None:
            self.packets_in_dropped += 1
            logger.debug("packet-in dropped: no forwarding pipeline config set")
            return
        parsed = unpack_header(self._schema.packet_in, frame_with_packet_in_header)
        if parsed is None:
            self.packets_in_dropped += 1
            logger.warning("packet-in dropped: %d-byte frame is shorter than the packet_in header",
                           len(frame_with_packet_in_header))
            return
        values, payload = parsed
        msg = p4runtime_pb2.StreamMessageResponse()
        msg.packet.payload = payload
        for f in self._schema.packet_in:
            md = msg.packet.metadata.add()
            md.metadata_id, md.value = f.id, canonical(values[f.id])
        with self._arbiter.lock:
            primary = self._arbiter.primary()
            if primary is None or primary.outbox.qsize() >= PACKET_IN_QUEUE_LIMIT:
                self.packets_in_dropped += 1
                logger.debug("packet-in dropped: %s", "no primary client" if primary is None else "primary too slow")
                return
            primary.outbox.put(msg)
            self.packets_in += 1

    def _packet_out(self, conn: Connection, packet: p4runtime_pb2.PacketOut) -> None:
        with self._arbiter.lock:
            is_primary = self._arbiter.primary() is conn
        if not is_primary:
            logger.info("packet-out from %s dropped: not the primary client", conn.peer)
            return
        if self._config is None:
            logger.info("packet-out dropped: no forwarding pipeline config set")
            return
        try:
            fields = {f.id: f for f in self._schema.packet_out}
            values: dict[int, int] = {}
            for md in packet.metadata:
                f = fields.get(md.metadata_id)
                if f is None:
                    raise fail(Code.INVALID_ARGUMENT, f"Unknown metadata id {md.metadata_id} in PacketOut message")
                values[f.id] = to_int(md.value, f.bitwidth, f"PacketOut metadata {f.name}")
            frame = pack_header(self._schema.packet_out, values) + packet.payload
            if self._packet_out_fn is None and self.cpu_port is None:
                raise fail(Code.FAILED_PRECONDITION, "this switch was started without a CPU port: no packet-out")
            try:
                self._inject(frame)
            except Exception as e:  # a data-plane failure must not end the client's stream
                logger.exception("packet-out from %s failed in the data plane", conn.peer)
                raise fail(Code.UNKNOWN, f"Unknown error when target sending packet-out: {e}") from None
            self.packets_out += 1
        except P4RuntimeFailure as f:
            logger.info("packet-out from %s refused: %s", conn.peer, f.message)
            err = p4runtime_pb2.StreamMessageResponse()
            err.error.canonical_code = f.code.value[0]
            err.error.message = f.message
            err.error.space = ERROR_SPACE
            err.error.packet_out.SetInParent()
            conn.outbox.put(err)

    def _inject(self, frame: bytes) -> None:
        """A packet-out frame (packet_out header first) into the data plane: ``packet_out``, or the pipeline here."""
        if self._packet_out_fn is not None:
            self._packet_out_fn(frame)
            return
        others = []
        for port, out in self.pipeline.process(self.cpu_port, frame):
            if port == self.cpu_port:
                self.send_packet_in(out)
            else:
                others.append((port, out))
        if not others:
            return
        if self._emit is not None:
            self._emit(others)
        else:
            logger.debug("packet-out outputs dropped (no emit callback): ports %s", [p for p, _ in others])

    # --- StreamChannel ---------------------------------------------------------------------------------------
    def stream_channel(self, requests: Iterator[p4runtime_pb2.StreamMessageRequest],
                       context) -> Iterator[p4runtime_pb2.StreamMessageResponse]:
        """The StreamChannel RPC: arbitration, packet-in/out and stream errors of one client."""
        conn = Connection(context.peer())
        context.add_callback(lambda: conn.outbox.put(CLOSE))
        reader = threading.Thread(target=self._read_stream, args=(requests, conn), name="p4rt-stream", daemon=True)
        reader.start()
        try:
            while True:
                item = conn.outbox.get()
                if item is CLOSE:
                    return
                if isinstance(item, Abort):
                    context.abort(item.code, item.message)
                yield item
        finally:
            self._arbiter.remove(conn)

    def _read_stream(self, requests: Iterator[p4runtime_pb2.StreamMessageRequest], conn: Connection) -> None:
        try:
            for req in requests:
                kind = req.WhichOneof("update")
                if kind == "arbitration":
                    try:
                        self._arbitrate(conn, req.arbitration)
                    except P4RuntimeFailure as f:
                        logger.info("P4Runtime: stream of %s refused: %s", conn.peer, f.message)
                        conn.outbox.put(Abort(f.code, f.message))
                        return
                elif kind == "packet":
                    if conn.election_id is None:
                        logger.info("packet-out from %s dropped: no arbitration update on its stream yet", conn.peer)
                    else:
                        self._packet_out(conn, req.packet)
                elif kind == "digest_ack":
                    logger.debug("digest ack from %s ignored: the program has no digests", conn.peer)
                else:
                    logger.info("stream message of type %s from %s ignored", kind, conn.peer)
        except grpc.RpcError:
            pass  # the client went away
        except Exception:  # keep the server alive whatever a stream does; say what happened
            logger.exception("P4Runtime: error on the stream of %s", conn.peer)
        finally:
            self._arbiter.remove(conn)
            conn.outbox.put(CLOSE)

    def _arbitrate(self, conn: Connection, arb: p4runtime_pb2.MasterArbitrationUpdate) -> None:
        if conn.device_id is not None and arb.device_id != conn.device_id:
            raise fail(Code.FAILED_PRECONDITION,
                        f"Invalid device id {arb.device_id}: this stream is for device {conn.device_id}")
        if arb.device_id != self.device_id:
            raise fail(Code.NOT_FOUND, f"Unknown device id {arb.device_id}: this switch is device {self.device_id}")
        if arb.HasField("role") and (arb.role.name or arb.role.id or arb.role.HasField("config")):
            raise fail(Code.UNIMPLEMENTED,
                        "Roles are not implemented: only the default role (no role) is, got "
                        f"{text_format.MessageToString(arb.role, as_one_line=True)!r}")
        conn.device_id = arb.device_id
        eid = u128(arb.election_id)
        logger.info("P4Runtime: arbitration update from %s, election id %s", conn.peer, election_id_str(eid))
        self._arbiter.update(conn, eid)

    # --- request checks --------------------------------------------------------------------------------------
    def _check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise fail(Code.NOT_FOUND, f"Unknown device id {device_id}: this switch is device {self.device_id}")

    @staticmethod
    def _check_role(request) -> None:
        if request.role or getattr(request, "role_id", 0):
            raise fail(Code.UNIMPLEMENTED,
                        f"Roles are not implemented: only the default role is, got {request.role or request.role_id!r}")

    def _require_config(self) -> _Config:
        config = self._config
        if config is None:
            raise fail(Code.FAILED_PRECONDITION, "No forwarding pipeline config set for this device")
        return config

    # --- SetForwardingPipelineConfig / GetForwardingPipelineConfig -------------------------------------------
    def set_pipeline(self, request: p4runtime_pb2.SetForwardingPipelineConfigRequest) -> None:
        """The SetForwardingPipelineConfig RPC (P4RuntimeFailure says why it is refused)."""
        self._check_device(request.device_id)
        self._check_role(request)
        self._arbiter.check_primary(request)
        action = request.action
        name = SetConfig.Action.Name(action)
        logger.info("P4Runtime SetForwardingPipelineConfig %s", name)
        if action == SetConfig.UNSPECIFIED:
            raise fail(Code.INVALID_ARGUMENT, "Invalid SetForwardingPipeline action UNSPECIFIED")
        config = None
        if action != SetConfig.COMMIT:
            if not request.HasField("config"):
                raise fail(Code.INVALID_ARGUMENT, f"{name} needs a config")
            why = p4info_mismatch(self.reference_p4info, request.config.p4info)
            if why:
                raise fail(Code.INVALID_ARGUMENT,
                            f"P4Info is not the program this switch runs (p4src/ina.p4info.txt): {why}")
            why = device_config_mismatch(request.config.p4_device_config)
            if why:
                raise fail(Code.INVALID_ARGUMENT, why)
            cookie = request.config.cookie if request.config.HasField("cookie") else None
            config = _Config(request.config.p4info, request.config.p4_device_config, cookie)
        if action == SetConfig.VERIFY:
            return
        with self._write_lock:
            if action == SetConfig.VERIFY_AND_SAVE:
                self._saved = config
                return
            if action == SetConfig.COMMIT:
                if self._saved is None:
                    raise fail(Code.FAILED_PRECONDITION, "COMMIT without a config saved by VERIFY_AND_SAVE")
                config, self._saved = self._saved, None
            if action != SetConfig.RECONCILE_AND_COMMIT:
                self._entities.reset()  # a new pipeline starts empty, as on BMv2
            self._config = config

    def get_pipeline(self, request: p4runtime_pb2.GetForwardingPipelineConfigRequest
                     ) -> p4runtime_pb2.GetForwardingPipelineConfigResponse:
        """The GetForwardingPipelineConfig RPC."""
        self._check_device(request.device_id)
        config = self._require_config()
        rep = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        rt = request.response_type
        if rt not in (GetConfig.ALL, GetConfig.COOKIE_ONLY, GetConfig.P4INFO_AND_COOKIE, GetConfig.DEVICE_CONFIG_AND_COOKIE):
            raise fail(Code.INVALID_ARGUMENT, f"Invalid response_type {rt} in GetForwardingPipelineConfigRequest")
        if rt in (GetConfig.ALL, GetConfig.P4INFO_AND_COOKIE):
            rep.config.p4info.CopyFrom(config.p4info)
        if rt in (GetConfig.ALL, GetConfig.DEVICE_CONFIG_AND_COOKIE):
            rep.config.p4_device_config = config.device_config
        if config.cookie is not None:
            rep.config.cookie.CopyFrom(config.cookie)
        return rep

    # --- Write -----------------------------------------------------------------------------------------------
    def write(self, request: p4runtime_pb2.WriteRequest, context) -> p4runtime_pb2.WriteResponse:
        """The Write RPC: every update applied in order, each refusal reported in the status details."""
        self._check_device(request.device_id)
        self._check_role(request)
        self._arbiter.check_primary(request)
        self._require_config()
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            raise fail(Code.UNIMPLEMENTED, "Support for atomic write modes has not been implemented yet")
        logger.debug("P4Runtime Write\n%s", request)
        errors: list[p4runtime_pb2.Error] = []
        with self._write_lock:
            for update in request.updates:
                err = p4runtime_pb2.Error()
                try:
                    self._entities.write(update)
                except P4RuntimeFailure as f:
                    err.canonical_code, err.message, err.space = f.code.value[0], f.message, ERROR_SPACE
                    logger.info("P4Runtime Write: update %d refused: %s: %s", len(errors), f.code.name, f.message)
                errors.append(err)
        failed = [(i, e) for i, e in enumerate(errors) if e.canonical_code != code_pb2.OK]
        if failed:
            i, first = failed[0]
            message = (f"Write failure: {len(failed)} of {len(errors)} updates failed; first at index {i}: "
                       f"{code_pb2.Code.Name(first.canonical_code)}: {first.message}")
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message=message)
            for e in errors:
                status.details.add().Pack(e)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(Code.UNKNOWN, message)
        return p4runtime_pb2.WriteResponse()

    # --- Read ------------------------------------------------------------------------------------------------
    def read(self, request: p4runtime_pb2.ReadRequest, context) -> Iterator[p4runtime_pb2.ReadResponse]:
        """The Read RPC: the entities each request entity selects, in responses of up to 1,000."""
        self._check_device(request.device_id)
        self._require_config()
        logger.debug("P4Runtime Read\n%s", request)
        response = p4runtime_pb2.ReadResponse()
        sent = False
        for entity in request.entities:
            try:
                for e in self._entities.read(entity):
                    response.entities.add().CopyFrom(e)
                    if len(response.entities) >= READ_CHUNK:
                        yield response
                        sent = True
                        response = p4runtime_pb2.ReadResponse()
            except P4RuntimeFailure as f:
                logger.info("P4Runtime Read refused: %s: %s", f.code.name, f.message)
                if len(response.entities):
                    yield response
                context.abort(f.code, f.message)
        if len(response.entities) or not sent:
            yield response


class _Service(p4runtime_pb2_grpc.P4RuntimeServicer):
    """The gRPC face of a P4RuntimeServer: every RPC maps a P4RuntimeFailure to its status code and message."""

    def __init__(self, server: P4RuntimeServer):
        self._s = server

    @staticmethod
    def _abort(context, f: P4RuntimeFailure, rpc: str):
        logger.info("P4Runtime %s refused: %s: %s", rpc, f.code.name, f.message)
        context.abort(f.code, f.message)

    def Write(self, request, context):
        try:
            return self._s.write(request, context)
        except P4RuntimeFailure as f:
            self._abort(context, f, "Write")

    def Read(self, request, context):
        try:
            yield from self._s.read(request, context)
        except P4RuntimeFailure as f:
            self._abort(context, f, "Read")

    def SetForwardingPipelineConfig(self, request, context):
        try:
            self._s.set_pipeline(request)
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        except P4RuntimeFailure as f:
            self._abort(context, f, "SetForwardingPipelineConfig")

    def GetForwardingPipelineConfig(self, request, context):
        try:
            return self._s.get_pipeline(request)
        except P4RuntimeFailure as f:
            self._abort(context, f, "GetForwardingPipelineConfig")

    def StreamChannel(self, request_iterator, context):
        yield from self._s.stream_channel(request_iterator, context)

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)
