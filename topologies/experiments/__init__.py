"""The experiments ``ina-exp`` runs: a registry from names to experiment classes.

    from topologies.experiments import EXPERIMENTS, get_experiment
    exp_cls = get_experiment("allreduce")       # or an alias: "exp1"

Each experiment is a small class in its own module (``allreduce``, ``hetero``, ``multijob``, ``loss``)
registered with :func:`register`; its configuration is a frozen dataclass written into the results.
``topologies/runner.py`` is the command line; docs/experiments.md describes every experiment.
"""
from __future__ import annotations

import importlib

from topologies.experiments.base import Experiment

__all__ = ["ALIASES", "EXPERIMENTS", "Experiment", "get_experiment", "register"]

EXPERIMENTS: dict[str, type[Experiment]] = {}
ALIASES: dict[str, str] = {}
_MODULES = ("allreduce", "hetero", "multijob", "loss", "rina", "tree")  # registry order = `ina-exp list` and `run all` order
_loaded = False


def register(cls: type[Experiment]) -> type[Experiment]:
    """Class decorator: make ``cls`` runnable as ``ina-exp run <cls.name>`` (and its ``aliases``)."""
    if cls.name in EXPERIMENTS:
        raise ValueError(f"experiment {cls.name!r} registered twice")
    EXPERIMENTS[cls.name] = cls
    for alias in cls.aliases:
        ALIASES[alias] = cls.name
    return cls


def load_all() -> dict[str, type[Experiment]]:
    """Import every experiment module (they register themselves)."""
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(f"topologies.experiments.{mod}")
        _loaded = True
        order = {f"topologies.experiments.{m}": i for i, m in enumerate(_MODULES)}
        ordered = sorted(EXPERIMENTS.items(), key=lambda kv: order.get(kv[1].__module__, len(order)))
        EXPERIMENTS.clear()
        EXPERIMENTS.update(ordered)
    return EXPERIMENTS


def get_experiment(name: str) -> type[Experiment]:
    """The experiment class for a name or alias; KeyError with the valid names otherwise."""
    load_all()
    key = ALIASES.get(name, name)
    if key not in EXPERIMENTS:
        valid = ", ".join(list(EXPERIMENTS) + sorted(ALIASES))
        raise KeyError(f"unknown experiment {name!r} (valid: {valid}, all)")
    return EXPERIMENTS[key]
