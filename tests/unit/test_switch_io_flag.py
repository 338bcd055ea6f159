"""``ina-switch --io``: rings by default, frames on request, anything else refused."""
from __future__ import annotations

import pytest

from softswitch.cli import UsageError, parse_args
from softswitch.dataplane import IoMode


def test_rings_by_default():
    assert parse_args(["--no-p4"]).io is IoMode.RINGS


def test_frames_on_request():
    assert parse_args(["--no-p4", "--io", "frames"]).io is IoMode.FRAMES


def test_unknown_io_is_refused():
    with pytest.raises(UsageError, match="invalid choice"):
        parse_args(["--no-p4", "--io", "xdp"])
