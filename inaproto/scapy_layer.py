"""The INA header as a scapy layer, for tests and tools only (no daemon imports scapy).

Declared from ``inaproto.wire.INA_HEADER_FIELDS`` (which mirrors p4src/ina.p4's ``header ina_t``) and bound
to UDP port ``INA_UDP_PORT`` in both directions; tests/unit/test_wire.py checks it builds the same bytes as
the struct codec and dissects them back.
"""
from __future__ import annotations

from scapy.fields import BitEnumField, BitField, FieldListField, FlagsField, SignedIntField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from inaproto.wire import INA_HEADER_FIELDS, INA_UDP_PORT, LANES, Flags, MsgType

__all__ = ["INA"]


def _scapy_fields() -> list:
    special = {
        "msg_type": lambda: BitEnumField("msg_type", MsgType.GRADIENT, 8, {m.value: m.name for m in MsgType}),
        "flags": lambda: FlagsField("flags", 0, 8, [f.name for f in Flags if f]),
    }
    fields = [special[name]() if name in special else BitField(name, 0, width) for name, width in INA_HEADER_FIELDS]
    fields.append(FieldListField("lanes", [0] * LANES, SignedIntField("", 0), count_from=lambda pkt: LANES))
    return fields


class INA(Packet):
    """In-network aggregation header followed by LANES int32 lanes (p4src/ina.p4: ina_t, ina_data_t)."""

    name = "INA"
    fields_desc = _scapy_fields()


bind_layers(UDP, INA, dport=INA_UDP_PORT)
bind_layers(UDP, INA, sport=INA_UDP_PORT)
