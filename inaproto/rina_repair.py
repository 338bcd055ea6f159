"""Rina's repair message (RNAK): a rack worker's acknowledgement and loss report to its representative.

Plain UDP to the representative's INA socket, outside the switch's INA port, so no switch parses it:
magic, job, generation, worker, cumulative ack (every chunk below it has its global result), then an
optional bitmap of missing chunks starting at the ack (bit i = chunk ack + i). docs/agent.md ("Rina")
describes the exchange; the agent's Rina code (host_agent/rina.py) sends and serves it.
"""
from __future__ import annotations

import struct

NACK = struct.Struct("!4sHHBxQ")  # magic, job_id, generation, worker_id, pad, cumulative ack
NACK_MAGIC = b"RNAK"
NACK_BITS = 8 * 256  # longest bitmap of missing chunks a request carries
