"""INA frames for tests, built in one place.

Two encoders, each for a reason. :func:`gradient` builds with scapy (``inaproto/scapy_layer.py``), apart from
the codec the daemons use, for the packet-level suite, whose expected frames are scapy's too. :func:`ina_frame`
builds with ``inaproto/wire.py`` exactly as agents send (UDP checksum 0), fast enough for hypothesis' thousands
of frames; :func:`grant_gradient` is a worker's gradient addressed from its grant.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import raw

from inaproto import admission_pb2 as pb
from inaproto import wire
from inaproto.scapy_layer import INA
from topologies.loopback import HostAddr

__all__ = [
    "SWITCH_IP",
    "SWITCH_MAC",
    "Worker",
    "dissect",
    "gradient",
    "grant_gradient",
    "ina_frame",
    "make_workers",
    "parse_result",
    "random_lanes",
]

SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"


@dataclass(frozen=True)
class Worker:
    """Worker ``wid`` on switch port ``port``, with addresses derived from its id."""

    wid: int
    port: int

    @property
    def mac(self) -> str:
        return f"02:00:00:00:{self.wid // 256:02x}:{self.wid % 256 + 1:02x}"

    @property
    def ip(self) -> str:
        return f"10.0.{1 + self.wid // 200}.{self.wid % 200 + 1}"

    @property
    def udp_port(self) -> int:
        return 40000 + self.wid


def make_workers(k: int, first_port: int = 1) -> list[Worker]:
    return [Worker(wid=i, port=first_port + i) for i in range(k)]


def gradient(
    worker: Worker,
    job_id: int,
    slot: int,
    lanes,
    *,
    seq: int = 0,
    shadow: int = 0,
    generation: int = 0,
    msg_type: int = wire.MsgType.GRADIENT,
    flags: int = 0,
    reserved: int = 0,
) -> bytes:
    """A worker's INA frame to the switch, built with scapy."""
    return raw(
        Ether(src=worker.mac, dst=SWITCH_MAC)
        / IP(src=worker.ip, dst=SWITCH_IP)
        / UDP(sport=worker.udp_port, dport=wire.INA_UDP_PORT)
        / INA(
            msg_type=msg_type, flags=flags, job_id=job_id, generation=generation, slot=slot, seq=seq,
            worker_id=worker.wid, reserved=reserved, shadow=shadow, lanes=[int(v) for v in lanes],
        )
    )


def dissect(frame: bytes) -> Ether:
    return Ether(frame)


def _mac(mac: str | bytes) -> bytes:
    return bytes.fromhex(mac.replace(":", "")) if isinstance(mac, str) else mac


def _ip(ip: str | bytes) -> bytes:
    return ipaddress.IPv4Address(ip).packed if isinstance(ip, str) else ip


def ina_frame(header: wire.InaHeader, lanes, *, src_mac: str | bytes, src_ip: str | bytes, sport: int,
              dst_mac: str | bytes = SWITCH_MAC, dst_ip: str | bytes = SWITCH_IP, dport: int = wire.INA_UDP_PORT) -> bytes:
    """An INA frame as agents send it (``wire.udp_frame``: UDP checksum 0); addresses as text or bytes."""
    payload = wire.encode_payload(header, np.asarray(lanes, dtype=np.int64).astype(np.int32))
    return wire.udp_frame(_mac(src_mac), _mac(dst_mac), _ip(src_ip), _ip(dst_ip), sport, dport, payload)


def grant_gradient(
    host: HostAddr, grant: pb.JobGrant, worker_id: int, slot: int, lanes, *, seq: int = 0, shadow: int = 0,
    generation: int | None = None, switch: int = 0,
) -> bytes:
    """A worker's INA gradient to its switch in ``grant`` (the grant's ``switches[switch]``), as agents send it."""
    sg = grant.switches[switch]
    header = wire.InaHeader(
        wire.MsgType.GRADIENT, 0, grant.job_id, grant.generation if generation is None else generation,
        slot, seq, worker_id, shadow,
    )
    return ina_frame(header, lanes, src_mac=host.mac, src_ip=host.ip, sport=host.udp_port, dst_mac=sg.switch_mac,
                     dst_ip=sg.switch_ip)


def parse_result(frame: bytes) -> tuple[wire.InaHeader, np.ndarray, str, int]:
    """(header, lanes, destination ip, destination udp port) of a frame the switch sent."""
    header, lanes = wire.decode_payload(frame, wire.INA_OFFSET)
    ip = str(ipaddress.IPv4Address(frame[wire.ETH_LEN + 16 : wire.ETH_LEN + 20]))
    port = int.from_bytes(frame[wire.ETH_LEN + 22 : wire.ETH_LEN + 24], "big")
    return header, lanes, ip, port


def random_lanes(rng: np.random.Generator, low: int = -(2**20), high: int = 2**20) -> np.ndarray:
    """One frame's int32 lanes drawn from [low, high): small enough that a few workers' sums cannot overflow."""
    return rng.integers(low, high, size=wire.LANES, dtype=np.int64).astype(np.int32)
