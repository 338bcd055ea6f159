"""The switch's error family: every error ``softswitch`` raises derives from SoftSwitchError.

    DataPlaneError  a port that cannot be opened or used (softswitch.port_socket)
    ProgramError    a program (BMv2 JSON) the pipeline model does not implement (softswitch.p4program)

A control-plane write the model refuses is the model's own ``p4src.tables.PipelineError``.
"""
from __future__ import annotations

__all__ = ["SoftSwitchError"]


class SoftSwitchError(Exception):
    """Base of the software switch's errors."""
