"""The program's committed P4Info (``p4src/ina.p4info.txt``): what the controller writes by and the switch checks.

``make p4`` compares it with what p4c derives from ``ina.p4`` (``p4src.p4source`` does the same without p4c).
"""
from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

__all__ = ["P4INFO_PATH", "load_p4info"]

P4INFO_PATH = Path(__file__).resolve().parent / "ina.p4info.txt"


def load_p4info(path: Path | str = P4INFO_PATH) -> p4info_pb2.P4Info:
    """A P4Info in text format (by default the committed one, which every pushed P4Info is held against)."""
    return text_format.Parse(Path(path).read_text(), p4info_pb2.P4Info())
