"""The committed admission stubs are exactly what `make proto` generates from inaproto/admission.proto.

Like the P4Info test, this holds a generated file against its source. The generator's output depends on its
version, so the versions the committed stubs were made with are recorded here; on a machine with other
versions (or without protoc, its gRPC plugin or make) the test says which and skips.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from inaproto import admission_pb2, admission_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
STUBS = ("inaproto/admission_pb2.py", "inaproto/admission_pb2_grpc.py")
# What generated the committed stubs: Debian 12's protobuf-compiler and protobuf-compiler-grpc.
PROTOC_VERSION = "libprotoc 3.21.12"
GRPC_PLUGIN_PACKAGE, GRPC_PLUGIN_VERSION = "protobuf-compiler-grpc", "1.51.1-3+b1"


def _output(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _generator_mismatch() -> str | None:
    """Why this machine cannot reproduce the committed stubs, or None when it can."""
    for tool in ("make", "protoc", "grpc_python_plugin"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    protoc = _output(["protoc", "--version"])
    if protoc != PROTOC_VERSION:
        return f"protoc is {protoc!r}, the stubs were generated with {PROTOC_VERSION!r}"
    # grpc_python_plugin has no --version; its Debian package says which it is.
    plugin = _output(["dpkg-query", "-W", "-f", "${Version}", GRPC_PLUGIN_PACKAGE])
    if plugin != GRPC_PLUGIN_VERSION:
        return f"grpc_python_plugin ({GRPC_PLUGIN_PACKAGE}) is {plugin!r}, the stubs were generated with {GRPC_PLUGIN_VERSION!r}"
    return None


def test_committed_stubs_are_what_make_proto_generates(tmp_path: Path):
    mismatch = _generator_mismatch()
    if mismatch:
        pytest.skip(f"cannot regenerate the admission stubs here: {mismatch}")
    subprocess.run(["make", "-s", "-C", str(ROOT), "proto", f"PROTO_OUT={tmp_path}"], check=True, capture_output=True, timeout=60)
    for stub in STUBS:
        assert (tmp_path / stub).read_text() == (ROOT / stub).read_text(), f"{stub} differs from `make proto`; run it and commit"


def test_grpc_stub_imports_its_messages_by_package():
    assert admission_pb2_grpc.inaproto_dot_admission__pb2 is admission_pb2
    assert admission_pb2.DESCRIPTOR.package == "ina.admission.v1"
