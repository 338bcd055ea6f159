"""The whole configuration of every daemon an experiment ran, as results.json records it (its ``daemons`` key).

A figure is traceable to the configuration that made it: each testbed (``topologies.experiments.testbed``) writes every daemon's configuration
(``softswitch.config.SwitchConfig``, ``controller.config.ControllerConfig``, ``host_agent.options.AgentOptions``)
as the TOML file the daemon reads (``<run dir>/config/``), and records the same value here, as
``inaproto.config.as_dict`` gives it, so that ``inaproto.config.load(Cls, None, recorded)`` gives it back::

    "daemons": {
      "runs": {                                        # one per testbed, by its folder under runs/
        "01-n2-star": {
          "switches": {"s1": {...}},                   # SwitchConfig, per switch
          "controller": [{"starts": [1], "config": {...}}],           # ControllerConfig, per distinct start
          "agents": [{"workers": {"ar-n2-ina": [0, 1]}, "config": {...}}]  # AgentOptions, the workers it covers
        }
      },
      "ina-sim": {"pool8-first-fit": {...}}            # SimConfig of each simulated trace (experiment 3), by sim/ folder
    }

A controller restarted with the same configuration, and agents with identical configurations (the workers of a job,
the jobs of a testbed), are recorded once with the starts, jobs and worker ids they cover.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from inaproto.config import as_dict, to_toml

__all__ = ["DaemonRecord", "write_config"]


def write_config(config: Any, path: Path, what: str) -> Path:
    """``config`` as the TOML file ``--config`` reads (``inaproto.config.to_toml``), under a first line saying
    ``what`` it configures; its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {what}\n{to_toml(config)}")
    return path


class DaemonRecord:
    """Every daemon one testbed ran, its whole configuration each (:meth:`as_dict` is what results.json holds)."""

    def __init__(self) -> None:
        self.switches: dict[str, dict] = {}
        self.controller: list[dict] = []
        self.agents: list[dict] = []

    def add_switch(self, name: str, config: Any) -> None:
        self.switches[name] = as_dict(config)

    def add_controller(self, start: int, config: Any) -> None:
        """The controller's ``start``-th start (1, 2, ...) with ``config``."""
        entry = self._entry(self.controller, as_dict(config), {"starts": []})
        if start not in entry["starts"]:
            entry["starts"].append(start)

    def add_agents(self, job: str, workers: Iterable[int], config: Any) -> None:
        """The agents of ``workers`` (worker ids) of ``job``, all started with ``config``."""
        covered = self._entry(self.agents, as_dict(config), {"workers": {}})["workers"].setdefault(job, [])
        covered[:] = sorted({*covered, *workers})

    def as_dict(self) -> dict[str, Any]:
        return {"switches": self.switches, "controller": self.controller, "agents": self.agents}

    @staticmethod
    def _entry(entries: list[dict], config: dict, new: dict) -> dict:
        """The entry of ``entries`` holding ``config``, made (``new`` plus the config) if there is none."""
        for entry in entries:
            if entry["config"] == config:
                return entry
        entries.append({**new, "config": config})
        return entries[-1]
