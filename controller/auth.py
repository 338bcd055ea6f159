"""Who may do what at the admission service: job secrets (stored as salted hashes), the admin credential,
and the TLS configuration of the service and of the P4Runtime connections (docs/security.md).

A caller is whoever presents a credential (gRPC metadata ``ina-credential``, see inaproto/credentials.py):
the admin credential allows everything; any other credential is a tenant's, which owns the jobs it
registered (the job stores only ``salt$hmac-sha256(salt, secret)``, compared in constant time). Checks
raise :class:`~controller.errors.Refusal` with UNAUTHENTICATED (no credential) or PERMISSION_DENIED.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import grpc

from controller.errors import Refusal
from inaproto.config import setting
from inaproto.credentials import METADATA_KEY, new_secret, read_credential_file

__all__ = [
    "ADMIN_FILE_SUFFIX", "Authority", "Caller", "ServerTls", "SwitchTls", "admin_credential_path",
    "caller_credential", "hash_secret", "secret_matches",
]

log = logging.getLogger(__name__)

ADMIN_FILE_SUFFIX = ".admin"  # the admin credential sits beside the database: ina-controller.db.admin
_SALT_BYTES = 16


def hash_secret(secret: str) -> str:
    """What a job stores of its secret: ``salt$hex(hmac-sha256(salt, secret))``."""
    salt = secrets.token_bytes(_SALT_BYTES)
    return f"{salt.hex()}${hmac.new(salt, secret.encode(), hashlib.sha256).hexdigest()}"


def secret_matches(stored: str, secret: str) -> bool:
    """True if ``secret`` is the one ``stored`` was made from (constant-time compare)."""
    salt_hex, sep, digest = stored.partition("$")
    if not sep or not secret:
        return False
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    return hmac.compare_digest(hmac.new(salt, secret.encode(), hashlib.sha256).hexdigest(), digest)


def admin_credential_path(db_path: str | Path) -> Path:
    return Path(str(db_path) + ADMIN_FILE_SUFFIX)


def caller_credential(context: grpc.ServicerContext) -> str:
    """The credential a call carries ("" if none)."""
    for key, value in context.invocation_metadata() or ():
        if key == METADATA_KEY:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


@dataclass(frozen=True)
class Caller:
    """Who made a call: ``credential`` as presented ("" = none); ``admin`` if it is the admin credential."""

    credential: str = ""
    admin: bool = False

    def require(self) -> None:
        if not self.credential:
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          f"no credential: send the job's secret (or the admin credential) in metadata {METADATA_KEY!r}")

    def require_admin(self, what: str) -> None:
        self.require()
        if not self.admin:
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, f"{what} needs the admin credential")

    def may_use(self, secret_hash: str) -> bool:
        """True if this caller may act on a job that stores ``secret_hash``."""
        return self.admin or secret_matches(secret_hash, self.credential)

    def check_job(self, job_id: int, secret_hash: str) -> None:
        self.require()
        if not self.may_use(secret_hash):
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED, f"job {job_id}: the credential is not this job's")


TRUSTED = Caller("in-process", admin=True)  # calls made by the controller itself or by in-process tests


class Authority:
    """The admin credential of one controller: read from ``path``, or made there (mode 0600) on first start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            mode = self.path.stat().st_mode & 0o777
            if mode & 0o077:
                log.warning("%s is readable by others (mode %o): chmod 600 it", self.path, mode)
            admin = read_credential_file(self.path)
        else:
            admin = new_secret()
            with os.fdopen(fd, "w") as fh:
                fh.write(admin + "\n")
            log.info("admin credential written to %s (mode 600)", self.path)
        self._admin_hash = hash_secret(admin)

    def caller(self, credential: str) -> Caller:
        return Caller(credential, admin=bool(credential) and secret_matches(self._admin_hash, credential))


def _readable(*paths: str) -> None:
    for path in paths:
        if path and not Path(path).is_file():
            raise ValueError(f"{path}: no such file")


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


@dataclass(frozen=True)
class ServerTls:
    """TLS of the admission service: its certificate and key; with ``client_ca``, clients must present a
    certificate signed by it."""

    cert: str = setting("", "the service's certificate (PEM file)")
    key: str = setting("", "its private key (PEM file)")
    client_ca: str = setting("", "require client certificates signed by this CA (PEM file; empty: none required)")

    def __post_init__(self) -> None:
        if not self.cert or not self.key:
            raise ValueError("TLS of the admission service needs both cert and key")
        _readable(self.cert, self.key, self.client_ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))], root_certificates=_read(self.client_ca),
            require_client_auth=bool(self.client_ca),
        )


@dataclass(frozen=True)
class SwitchTls:
    """TLS of the controller's P4Runtime connections: the switches' CA, and a client certificate and key
    for switches that require one (BMv2 ``--grpc-server-with-client-auth``). ``server_name`` overrides the
    name checked in the switch's certificate (default: the host of its address)."""

    ca: str = setting("", "the switches' CA certificate (PEM file)")
    cert: str = setting("", "client certificate for switches that require one (PEM file)")
    key: str = setting("", "its private key (PEM file)")
    server_name: str = setting("", "name checked in the switches' certificates (empty: the host of each address)")

    def __post_init__(self) -> None:
        if not self.ca:
            raise ValueError("P4Runtime over TLS needs the switches' CA certificate (ca)")
        if bool(self.cert) != bool(self.key):
            raise ValueError("the client certificate and its key go together (cert and key)")
        _readable(self.ca, self.cert, self.key)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(_read(self.ca), _read(self.key), _read(self.cert))

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
