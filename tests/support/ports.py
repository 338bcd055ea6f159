"""A free TCP port on 127.0.0.1 (for a process told its address before it starts)."""
from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; a process started soon after can bind it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
