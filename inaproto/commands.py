"""The project's commands and the checkout they come from, as absolute paths for child processes.

Every process the testbed starts (switch, controller, agents, ``inactl``, ``ina-exp``) is started by absolute
path: the console script beside the running interpreter (the virtual environment's ``bin/``), else
``python -m module`` with that interpreter. Nothing depends on PATH, an activated virtual environment or the
current folder, so ``sudo``, a Mininet host's shell and a run folder as working directory all behave alike.
"""
from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

__all__ = ["REPO", "Command", "command_argv", "repo_path"]

REPO = Path(__file__).resolve().parents[1]
"""The checkout (the folder holding ``p4src/``); defaults such as ``build/ina.json`` resolve against it."""


class Command(StrEnum):
    """A console script of ``pyproject.toml``; its value is the script's name."""

    SWITCH = "ina-switch"
    CONTROLLER = "ina-controller"
    CTL = "inactl"
    AGENT = "ina-agent"
    EXP = "ina-exp"
    SIM = "ina-sim"

    @property
    def module(self) -> str:
        """The module whose ``main`` the script runs (for ``python -m``)."""
        return _MODULES[self]


_MODULES = {
    Command.SWITCH: "softswitch.cli",
    Command.CONTROLLER: "controller.daemon",
    Command.CTL: "controller.cli",
    Command.AGENT: "host_agent.cli",
    Command.EXP: "topologies.runner",
    Command.SIM: "simulator.cli",
}


def command_argv(command: Command | str) -> list[str]:
    """The absolute argv prefix that runs ``command`` with this interpreter's installation."""
    command = Command(command)
    beside = Path(sys.executable).parent / command.value
    if beside.exists():
        return [str(beside.absolute())]
    return [str(Path(sys.executable).absolute()), "-m", command.module]


def repo_path(path: str | Path) -> Path:
    """``path`` made absolute: as it is if absolute, else relative to the checkout (not the current folder)."""
    path = Path(path)
    return path if path.is_absolute() else REPO / path
