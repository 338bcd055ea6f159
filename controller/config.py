"""The controller's configuration: everything ``ina-controller`` runs with, one frozen dataclass.

Read from a TOML file (``ina-controller --config FILE``), single settings over it with ``--set KEY=VALUE``, the
per-run flags last (inaproto/config.py); ``ina-controller --print-config`` prints the effective configuration,
and docs/controller.md lists every setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from controller.auth import ServerTls, SwitchTls
from controller.policies import POLICIES
from inaproto.config import setting

__all__ = ["DEFAULT_LISTEN", "DEFAULT_SCALE", "P4INFO", "ControllerConfig", "LogLevel"]

DEFAULT_LISTEN = "127.0.0.1:50060"
DEFAULT_SCALE = 2.0**16  # fixed point: int32 = round(float32 * scale)
P4INFO = Path(__file__).resolve().parents[1] / "p4src" / "ina.p4info.txt"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class ControllerConfig:
    """What one controller instance runs with: its switches, its admission service, its allocation."""

    # --- the switches
    topology: Path | None = setting(None, "p4lang/tutorials topology.json: hosts, switches, links (or `switches`)")
    switches: tuple[str, ...] = setting(
        (), "switches without a topology file: name=s1,addr=127.0.0.1:9559,device_id=1[,ip=,mac=,rack=,ina=,pool=]")
    p4info_path: Path = setting(P4INFO, "P4Info of the program the switches run")
    device_config: Path | None = setting(
        None, "device config pushed with the P4Info: p4c's BMv2 JSON for simple_switch_grpc; ina-switch needs none")
    election_id: tuple[int, int] = setting((0, 10), "P4Runtime election id (high, low); a higher one takes over")
    force_push: bool = setting(False, "push the pipeline even if a switch already runs it (resets the switch)")
    connect_timeout: float = setting(10.0, "seconds to wait for each switch")
    switch_tls: SwitchTls | None = setting(None, "P4Runtime over TLS: {ca, cert, key, server_name} (none: plaintext)")
    # --- the admission service
    listen: str = setting(DEFAULT_LISTEN, "address of the admission service (port 0: any free port)")
    db_path: Path = setting(Path("ina-controller.db"), "SQLite database: jobs, grants, policy, generations")
    admin_credential: Path | None = setting(
        None, "admin credential file, made (mode 0600) if missing (none: beside the database, <db>.admin)")
    tls: ServerTls | None = setting(None, "the admission service over TLS: {cert, key, client_ca} (none: plaintext)")
    heartbeat_timeout: float = setting(15.0, "seconds without a heartbeat from any worker before a job is released (0: never)")
    sync_timeout: float = setting(30.0, "longest wait of a SyncGeneration call, in seconds")
    monitor_interval: float = setting(0.5, "seconds between heartbeat reaping and switch health checks")
    # --- allocation
    policy: str = setting("first-fit", "allocation policy of a new database (a stored one wins; `inactl policy set`)")
    rina_chains: bool = setting(
        True, "Rina jobs run as chains across their racks' switches (false: the relay Rina, a representative per rack)")
    trees: bool = setting(
        False, "jobs spanning racks aggregate in a two-level tree (ToRs, then a switch linked to all of them)")
    scale: float = setting(DEFAULT_SCALE, "fixed-point scale handed to agents: int32 = round(float32 * scale)")
    log_level: LogLevel = setting(LogLevel.INFO, "log level")

    def __post_init__(self) -> None:
        if self.topology is not None and self.switches:
            raise ValueError("give a topology or switches, not both")
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {', '.join(sorted(POLICIES))}")
        if min(self.election_id) < 0 or self.election_id == (0, 0):
            raise ValueError(f"election_id {self.election_id}: non-negative values, not 0,0")
        for name in ("connect_timeout", "sync_timeout", "monitor_interval", "scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_timeout < 0:
            raise ValueError(f"heartbeat_timeout must be >= 0, got {self.heartbeat_timeout}")
