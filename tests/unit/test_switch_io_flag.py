"""``ina-switch --io``: frames by default, rings on request, anything else refused."""
from __future__ import annotations

import pytest

from softswitch.cli import UsageError, parse_args
from softswitch.dataplane import IoMode


def test_frames_by_default(monkeypatch):
    monkeypatch.delenv("INA_SWITCH_IO", raising=False)
    assert parse_args(["--no-p4"]).io is IoMode.FRAMES


def test_the_environment_sets_the_default_and_the_flag_wins(monkeypatch):
    monkeypatch.setenv("INA_SWITCH_IO", "rings")
    assert parse_args(["--no-p4"]).io is IoMode.RINGS
    assert parse_args(["--no-p4", "--io", "frames"]).io is IoMode.FRAMES
    monkeypatch.setenv("INA_SWITCH_IO", "xdp")
    with pytest.raises(UsageError, match="INA_SWITCH_IO='xdp'"):
        parse_args(["--no-p4"])


def test_rings_on_request():
    assert parse_args(["--no-p4", "--io", "rings"]).io is IoMode.RINGS


def test_unknown_io_is_refused():
    with pytest.raises(UsageError, match="invalid choice"):
        parse_args(["--no-p4", "--io", "xdp"])
