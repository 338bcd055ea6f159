"""The shortest round trip a job's chunk can have through its aggregation path, at the path's link rates.

Each ``SwitchGrant`` carries it (``path_rtt_floor``, seconds) for the workers aggregated on that switch; their
agents keep their RTT estimator's path round trip at or above it (``host_agent.rtt.RttEstimator.path_floor``).
On htb links the measured minimum is shorter (an idle link passes a short burst at veth speed), and a window
sized to that minimum reads a longer path's normal round trip as a queue (docs/experiments.md, "Aggregation
trees"); the controller knows every link's rate (controller/topology.py), so it sizes the floor.

The floor is one INA frame's serialization (``wire.INA_FRAME_LEN`` bytes) per link crossing of the chunk's
round trip; at each crossing the slowest link the chunk's aggregation waits for counts:

- a single switch (a star, or one rack of a Rina job: its rack switch path, chains are not sized here):
  worker -> switch (the slowest of the switch's workers' links) -> worker (the same), 2 crossings;
- a two-level tree: worker -> ToR (the slowest host link of the whole job: the root waits for every rack),
  ToR -> root (the slowest uplink of the tree), root -> ToR (this rack's uplink), ToR -> worker (the slowest
  host link of this rack), 4 crossings.

A crossing without a known rate gives 0 for the switch: no floor. A tree's root (no workers) gets 0.
"""
from __future__ import annotations

from collections.abc import Iterable

from controller.store import Job
from controller.topology import Topology
from inaproto import wire

__all__ = ["frame_seconds", "path_rtt_floors", "slowest_frame_seconds"]


def frame_seconds(mbps: float) -> float:
    """One INA frame's serialization on a link of ``mbps`` Mbit/s."""
    return wire.INA_FRAME_LEN * 8 / (mbps * 1e6)


def slowest_frame_seconds(rates: Iterable[float | None]) -> float | None:
    """One frame's serialization on the slowest of ``rates`` (Mbit/s); None if any rate is unknown or none given."""
    rates = list(rates)
    if not rates or any(r is None for r in rates):
        return None
    return frame_seconds(min(rates))


def path_rtt_floors(topology: Topology, job: Job, root: str | None = None) -> dict[str, float]:
    """Switch -> the path round-trip floor (seconds) of ``job``'s workers aggregated on it: each switch the
    job's workers sit under (``root``: the job aggregates in a tree of those switches under ``root``; None:
    each switch on its own). 0 where a crossing's rate is unknown or the switch does not run the program."""
    hosts = {sw: slowest_frame_seconds(topology.port_mbps(sw, p) for _, p in job.workers_on(sw))
             for sw in job.switches()}
    floors = {sw: 0.0 for sw in hosts}
    if root is None:
        for sw, host in hosts.items():
            if host is not None and topology.switches[sw].ina:
                floors[sw] = 2 * host
        return floors
    to_root = {sw: nbs.get(root) for sw, nbs in topology.neighbour_ports().items()}
    uplinks = {sw: slowest_frame_seconds([topology.port_mbps(sw, port)] if port is not None else [None])
               for sw in hosts for port in [to_root.get(sw)]}
    every_host, every_uplink = list(hosts.values()), list(uplinks.values())
    if None in every_host or None in every_uplink:
        return floors
    up = max(every_host) + max(every_uplink)
    for sw, host_floor in hosts.items():
        if topology.switches[sw].ina:
            floors[sw] = up + uplinks[sw] + host_floor
    return floors
