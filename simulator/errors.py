"""The simulator's error family: every error ``simulator`` raises derives from SimulatorError.

    CalibrationError   a calibration file that cannot be used (simulator.calibration)
    TraceError         a trace that cannot be used (simulator.trace)
    InvariantError     an impossible state: a bug, never bad input (simulator.engine)
"""
from __future__ import annotations

__all__ = ["SimulatorError"]


class SimulatorError(Exception):
    """Base of the simulator's errors."""
