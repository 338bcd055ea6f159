"""Minimal pcap writer (libpcap format, Ethernet link type) for ``ina-switch --pcap``: no scapy, no copies.

The format is a 24-byte file header and a 16-byte header before each frame
(https://wiki.wireshark.org/Development/LibpcapFileFormat); BMv2 writes the same files,
``<iface>_in.pcap`` and ``<iface>_out.pcap``, one pair per interface.
"""
from __future__ import annotations

import io
import struct
import time
from typing import BinaryIO, Self

PCAP_MAGIC = 0xA1B2C3D4  # microsecond timestamps
LINKTYPE_ETHERNET = 1
SNAPLEN = 65535

_FILE_HEADER = struct.Struct("<IHHiIII")
_RECORD_HEADER = struct.Struct("<IIII")


class PcapWriter:
    """Appends frames to one pcap file; buffered, flushed by ``flush()`` and ``close()``."""

    def __init__(self, path: str, *, buffering: int = 1 << 16) -> None:
        self.path = path
        # what open(path, "wb", buffering=...) builds, owned by this writer and closed in close()
        self._file: BinaryIO | None = io.BufferedWriter(io.FileIO(path, "w"), buffer_size=buffering)
        self._file.write(_FILE_HEADER.pack(PCAP_MAGIC, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))
        self._write = self._file.write
        self._pack = _RECORD_HEADER.pack
        self.frames = 0

    def write(self, frame: bytes | bytearray | memoryview, ts: float | None = None) -> None:
        if ts is None:
            ts = time.time()
        sec = int(ts)
        n = len(frame)
        cap = min(n, SNAPLEN)
        self._write(self._pack(sec, int((ts - sec) * 1_000_000), cap, n))
        self._write(frame if cap == n else frame[:cap])
        self.frames += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
