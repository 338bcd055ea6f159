"""A minimal P4Runtime client that installs a topology's IPv4 routes (``MyIngress.ipv4_lpm``).

Until the controller (``controller/``) programs switches itself, tests and the experiment runner use this
to make a freshly started switch forward non-INA traffic: connect, become primary, push the pipeline if
the switch has none, write the routes of the topology's plan (tutorials' ``sX-runtime.json`` works too).
Plain p4runtime protobufs over grpcio; no process-global state.

    python -m topologies.runtime 127.0.0.1:9559 1 run/s1-runtime.json [--p4info p4src/ina.p4info.txt]
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import queue
import sys
import threading
from pathlib import Path
from typing import Iterable, Sequence

import grpc
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from topologies.plan import FORWARD_ACTION, LPM_TABLE, Route

__all__ = ["P4RuntimeClient", "P4RuntimeError", "load_p4info", "routes_from_runtime_json", "main"]

DEFAULT_P4INFO = Path(__file__).resolve().parents[1] / "p4src" / "ina.p4info.txt"


class P4RuntimeError(RuntimeError):
    """A failed P4Runtime call: the gRPC status code and details, and what was being done."""

    def __init__(self, what: str, error: grpc.RpcError | None = None, detail: str = "") -> None:
        self.code = error.code() if error is not None else None
        self.details = error.details() if error is not None else detail
        name = self.code.name if self.code is not None else "FAILED"
        super().__init__(f"{what}: {name}: {self.details}")


def load_p4info(path: str | Path) -> p4info_pb2.P4Info:
    """Read a P4Info text file."""
    return text_format.Parse(Path(path).read_text(), p4info_pb2.P4Info())


def _canonical(value: int, bitwidth: int) -> bytes:
    """P4Runtime's canonical byte string: big-endian, no leading zero bytes (at least one byte)."""
    if value < 0 or value >= 1 << bitwidth:
        raise ValueError(f"{value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _mac(text: str) -> int:
    return int(text.replace(":", "").replace("-", ""), 16)


class P4RuntimeClient:
    """One P4Runtime session with one device: arbitration, pipeline, table writes.

    Use as a context manager; ``election_id`` is ``(high, low)``.
    """

    def __init__(self, address: str, device_id: int, *, election_id: tuple[int, int] = (0, 1), timeout: float = 10.0) -> None:
        self.address = address
        self.device_id = device_id
        self.election_id = p4runtime_pb2.Uint128(high=election_id[0], low=election_id[1])
        self.timeout = timeout
        self.channel: grpc.Channel | None = None
        self.stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self.p4info: p4info_pb2.P4Info | None = None
        self._requests: queue.Queue = queue.Queue()
        self._responses: queue.Queue = queue.Queue()
        self._reader: threading.Thread | None = None
        self._stream = None

    # --- session ---------------------------------------------------------------------------------------
    def __enter__(self) -> "P4RuntimeClient":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the channel and the stream, and become primary for this device."""
        self.channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError as exc:
            self.close()
            raise P4RuntimeError(f"connect {self.address}", detail=f"no P4Runtime server answered within {self.timeout} s") from exc
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._stream = self.stub.StreamChannel(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read_stream, name=f"p4rt-{self.address}", daemon=True)
        self._reader.start()
        self._requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=p4runtime_pb2.MasterArbitrationUpdate(
            device_id=self.device_id, election_id=self.election_id)))
        try:
            reply = self._responses.get(timeout=self.timeout)
        except queue.Empty as exc:
            self.close()
            raise P4RuntimeError(f"arbitration with {self.address}", detail="no answer") from exc
        if isinstance(reply, grpc.RpcError):
            self.close()
            raise P4RuntimeError(f"arbitration with {self.address} (device {self.device_id})", reply)
        if reply.WhichOneof("update") == "arbitration" and reply.arbitration.status.code != 0:
            self.close()
            raise P4RuntimeError(
                f"arbitration with {self.address}", detail=f"not primary (another client has a higher election id): "
                f"{reply.arbitration.status.message}")

    def _read_stream(self) -> None:
        try:
            for message in self._stream:
                self._responses.put(message)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self._responses.put(exc)

    def close(self) -> None:
        self._requests.put(None)
        if self._stream is not None:
            self._stream.cancel()
        if self.channel is not None:
            self.channel.close()
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        self.channel = self.stub = self._stream = self._reader = None

    # --- pipeline ----------------------------------------------------------------------------------------
    def get_p4info(self) -> p4info_pb2.P4Info | None:
        """The P4Info the device runs, or None if it has no pipeline yet."""
        assert self.stub is not None
        try:
            reply = self.stub.GetForwardingPipelineConfig(
                p4runtime_pb2.GetForwardingPipelineConfigRequest(
                    device_id=self.device_id,
                    response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE),
                timeout=self.timeout)
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                return None
            raise P4RuntimeError("GetForwardingPipelineConfig", exc) from exc
        return reply.config.p4info if reply.config.p4info.tables else None

    def set_pipeline(self, p4info: p4info_pb2.P4Info, device_config: bytes = b"") -> None:
        assert self.stub is not None
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=self.election_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
            config=p4runtime_pb2.ForwardingPipelineConfig(p4info=p4info, p4_device_config=device_config))
        try:
            self.stub.SetForwardingPipelineConfig(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise P4RuntimeError(f"SetForwardingPipelineConfig on {self.address}", exc) from exc
        self.p4info = p4info

    def ensure_pipeline(self, p4info_path: str | Path | None = None, device_config_path: str | Path | None = None) -> None:
        """Use the device's pipeline if it has one; else push ``p4info_path`` (and the BMv2 JSON, if given)."""
        running = self.get_p4info()
        if running is not None:
            self.p4info = running
            return
        p4info = load_p4info(p4info_path or DEFAULT_P4INFO)
        config = Path(device_config_path).read_bytes() if device_config_path else b""
        self.set_pipeline(p4info, config)

    # --- tables ------------------------------------------------------------------------------------------
    def _ids(self) -> tuple[p4info_pb2.Table, p4info_pb2.Action]:
        if self.p4info is None:
            raise P4RuntimeError("install routes", detail="no P4Info: call ensure_pipeline() first")
        table = next((t for t in self.p4info.tables if t.preamble.name == LPM_TABLE), None)
        action = next((a for a in self.p4info.actions if a.preamble.name == FORWARD_ACTION), None)
        if table is None or action is None:
            raise P4RuntimeError("install routes", detail=f"the P4Info has no {LPM_TABLE} / {FORWARD_ACTION}")
        return table, action

    def route_entry(self, route: Route) -> p4runtime_pb2.TableEntry:
        table, action = self._ids()
        net = route.network
        field = table.match_fields[0]
        params = {p.name: p for p in action.params}
        return p4runtime_pb2.TableEntry(
            table_id=table.preamble.id,
            match=[p4runtime_pb2.FieldMatch(field_id=field.id, lpm=p4runtime_pb2.FieldMatch.LPM(
                value=_canonical(int(net.network_address), field.bitwidth), prefix_len=net.prefixlen))],
            action=p4runtime_pb2.TableAction(action=p4runtime_pb2.Action(action_id=action.preamble.id, params=[
                p4runtime_pb2.Action.Param(param_id=params["dstAddr"].id, value=_canonical(_mac(route.mac), params["dstAddr"].bitwidth)),
                p4runtime_pb2.Action.Param(param_id=params["port"].id, value=_canonical(route.port, params["port"].bitwidth)),
            ])),
        )

    def write(self, updates: Sequence[p4runtime_pb2.Update]) -> None:
        assert self.stub is not None
        request = p4runtime_pb2.WriteRequest(device_id=self.device_id, election_id=self.election_id, updates=list(updates))
        self.stub.Write(request, timeout=self.timeout)

    def install_routes(self, routes: Iterable[Route]) -> int:
        """Insert every route (modify the ones already there); returns how many were written."""
        entries = [self.route_entry(r) for r in routes]
        if not entries:
            return 0
        try:
            self.write([p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT, entity=p4runtime_pb2.Entity(table_entry=e))
                        for e in entries])
            return len(entries)
        except grpc.RpcError:
            pass  # some already exist (a second install): one by one, modifying those
        for entry in entries:
            update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT, entity=p4runtime_pb2.Entity(table_entry=entry))
            try:
                self.write([update])
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNKNOWN):
                    raise P4RuntimeError(f"insert route into {LPM_TABLE} on {self.address}", exc) from exc
                update.type = p4runtime_pb2.Update.MODIFY
                try:
                    self.write([update])
                except grpc.RpcError as exc2:
                    raise P4RuntimeError(f"write route into {LPM_TABLE} on {self.address}", exc2) from exc2
        return len(entries)

    def read_routes(self) -> list[Route]:
        """The routes in the device's ``ipv4_lpm`` table."""
        assert self.stub is not None
        table, action = self._ids()
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=[
            p4runtime_pb2.Entity(table_entry=p4runtime_pb2.TableEntry(table_id=table.preamble.id))])
        names = {p.id: p.name for p in action.params}
        routes = []
        try:
            for reply in self.stub.Read(request, timeout=self.timeout):
                for entity in reply.entities:
                    e = entity.table_entry
                    lpm = e.match[0].lpm
                    params = {names[p.param_id]: int.from_bytes(p.value, "big") for p in e.action.action.params}
                    ip = ipaddress.IPv4Address(int.from_bytes(lpm.value, "big"))
                    mac = ":".join(f"{b:02x}" for b in params["dstAddr"].to_bytes(6, "big"))
                    routes.append(Route(f"{ip}/{lpm.prefix_len}", mac, params["port"]))
        except grpc.RpcError as exc:
            raise P4RuntimeError(f"read {LPM_TABLE} on {self.address}", exc) from exc
        return routes


def routes_from_runtime_json(path: str | Path) -> list[Route]:
    """The ``ipv4_lpm`` routes of a tutorials-shaped ``sX-runtime.json``."""
    doc = json.loads(Path(path).read_text())
    routes = []
    for entry in doc.get("table_entries", []):
        if entry.get("table") == LPM_TABLE and entry.get("action_name") == FORWARD_ACTION and not entry.get("default_action"):
            addr, plen = entry["match"]["hdr.ipv4.dstAddr"]
            routes.append(Route(f"{addr}/{plen}", entry["action_params"]["dstAddr"], int(entry["action_params"]["port"])))
    return routes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topologies.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="the switch's gRPC address, e.g. 127.0.0.1:9559")
    parser.add_argument("device_id", type=int)
    parser.add_argument("runtime_json", help="a tutorials-shaped <switch>-runtime.json (from the run directory)")
    parser.add_argument("--p4info", default=str(DEFAULT_P4INFO))
    parser.add_argument("--device-config", help="BMv2 JSON to push when the switch has no pipeline")
    args = parser.parse_args(argv)
    try:
        routes = routes_from_runtime_json(args.runtime_json)
        with P4RuntimeClient(args.address, args.device_id) as client:
            client.ensure_pipeline(args.p4info, args.device_config)
            n = client.install_routes(routes)
    except (OSError, ValueError, KeyError, P4RuntimeError) as exc:
        print(f"topologies.runtime: {exc}", file=sys.stderr)
        return 1
    print(f"{n} routes written to device {args.device_id} at {args.address}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
