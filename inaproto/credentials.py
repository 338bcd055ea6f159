"""How a client of the admission service proves who it is, the same on both sides (docs/security.md).

A credential travels in the gRPC metadata key :data:`METADATA_KEY` of every call: a job's secret (known to
the job's workers, given by whoever launches them in the job file or :data:`JOB_SECRET_ENV`, never on a
command line) or the controller's admin credential (a file the controller writes on first start). TLS is
optional: :class:`TlsFiles` names the PEM files of a client (CA to trust, and a certificate and key when
the server asks for client certificates).
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = [
    "ADMIN_CREDENTIAL_ENV", "CONTROLLER_ENV", "JOB_SECRET_ENV", "METADATA_KEY", "TLS_ENV", "TlsFiles",
    "admission_channel", "new_secret", "read_credential_file",
]

METADATA_KEY = "ina-credential"
CONTROLLER_ENV = "INA_CONTROLLER"  # the admission service's address, for inactl and the PyTorch backend "ina"
JOB_SECRET_ENV = "INA_JOB_SECRET"  # a job's secret for ina-agent when the job file has none
ADMIN_CREDENTIAL_ENV = "INA_ADMIN_CREDENTIAL_FILE"  # where inactl reads the admin credential
TLS_ENV = {"ca": "INA_TLS_CA", "cert": "INA_TLS_CERT", "key": "INA_TLS_KEY"}  # a client's TLS files


def new_secret() -> str:
    """A fresh random credential (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def read_credential_file(path: str | Path) -> str:
    """The credential in ``path`` (first line, stripped); OSError if unreadable, ValueError if empty."""
    text = Path(path).read_text().strip()
    if not text:
        raise ValueError(f"{path}: empty credential file")
    return text.splitlines()[0].strip()


@dataclass(frozen=True)
class TlsFiles:
    """A TLS client's PEM files: ``ca`` (the server's CA; required), ``cert`` and ``key`` (a client
    certificate, for servers that require one). Empty strings are unset."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("a client certificate needs both cert and key files")
        if (self.cert or self.key) and not self.ca:
            raise ValueError("a client certificate needs the CA of the server too")

    @property
    def enabled(self) -> bool:
        return bool(self.ca)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> TlsFiles:
        return cls(**{k: env.get(v, "") for k, v in TLS_ENV.items()})

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files (OSError if one cannot be read)."""
        def read(p: str) -> bytes | None:
            return Path(p).read_bytes() if p else None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


class _WithCredential(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the credential to the metadata of every call."""

    def __init__(self, credential: str) -> None:
        self.credential = credential

    def _details(self, details):
        metadata = [*(details.metadata or ()), (METADATA_KEY, self.credential)]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)


@dataclass(frozen=True)
class _Details(grpc.ClientCallDetails):
    """grpc's ClientCallDetails is abstract: a copy of one with other metadata."""

    method: str
    timeout: float | None
    metadata: object
    credentials: object
    wait_for_ready: object
    compression: object

    def __init__(self, d, metadata) -> None:
        for name in ("method", "timeout", "credentials", "wait_for_ready", "compression"):
            object.__setattr__(self, name, getattr(d, name, None))
        object.__setattr__(self, "metadata", metadata)


def admission_channel(address: str, credential: str | None = None, tls: TlsFiles | None = None,
                      options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """A channel to the admission service at ``address`` that sends ``credential`` with every call
    (none: calls go without one), over TLS when ``tls`` names a CA."""
    if tls is not None and tls.enabled:
        channel = grpc.secure_channel(address, tls.channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if credential:
        channel = grpc.intercept_channel(channel, _WithCredential(credential))
    return channel
