"""The switch's error family: every error ``softswitch`` raises derives from SoftSwitchError.

    PipelineError   a control-plane write the pipeline model refuses (softswitch.tables)
    DataPlaneError  a port that cannot be opened or used (softswitch.port_socket)
    ProgramError    a program (BMv2 JSON) the pipeline model does not implement (softswitch.cli)
"""
from __future__ import annotations

__all__ = ["SoftSwitchError"]


class SoftSwitchError(Exception):
    """Base of the software switch's errors."""
