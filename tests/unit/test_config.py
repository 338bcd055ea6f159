"""inaproto.config: TOML into frozen dataclasses, overrides, refusals naming the key, a round trip through TOML."""
from __future__ import annotations

import argparse
import enum
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from inaproto.config import (
    ConfigError,
    add_config_arguments,
    as_dict,
    from_args,
    load,
    parse_settings,
    reference,
    setting,
    to_toml,
)


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    timeout: float = setting(1.5, "seconds to wait")
    sizes: tuple[int, ...] = setting((1, 2), "sizes to try")


@dataclass(frozen=True)
class Outer:
    name: str = setting("x", "a name")
    count: int = setting(3, "how many")
    on: bool = setting(False, "whether it is on")
    color: Color = setting(Color.RED, "its colour")
    where: Path | None = setting(None, "an optional path")
    pair: tuple[str, int] = setting(("a", 1), "a fixed pair")
    table: dict[str, int] = setting(factory=dict, doc="names to numbers")
    inner: Inner = setting(factory=Inner, doc="the inner settings")

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file():
    assert load(Outer) == Outer()


def test_a_file_sets_nested_fields_enums_paths_and_tuples(tmp_path):
    path = write(tmp_path, 'count = 7\ncolor = "blue"\nwhere = "/tmp/x"\npair = ["b", 2]\n'
                           "table = {a = 1}\n[inner]\ntimeout = 2\nsizes = [4, 5, 6]\n")
    cfg = load(Outer, path)
    assert cfg == Outer(count=7, color=Color.BLUE, where=Path("/tmp/x"), pair=("b", 2), table={"a": 1},
                        inner=Inner(timeout=2.0, sizes=(4, 5, 6)))
    assert isinstance(cfg.inner.timeout, float)


def test_overrides_win_over_the_file_and_none_means_not_given(tmp_path):
    path = write(tmp_path, "count = 7\n[inner]\ntimeout = 2.0\n")
    cfg = load(Outer, path, {"count": 9, "inner.timeout": None, "inner.sizes": (8,)})
    assert (cfg.count, cfg.inner.timeout, cfg.inner.sizes) == (9, 2.0, (8,))


@pytest.mark.parametrize(("text", "message"), [
    ("cuont = 1\n", "unknown key cuont"),
    ("[inner]\ntimeuot = 1\n", "unknown key inner.timeuot"),
    ('count = "3"\n', "count: expected an integer, got str '3'"),
    ("count = true\n", "count: expected an integer"),
    ('color = "green"\n', "color: 'green' is not one of 'red', 'blue'"),
    ("inner = 3\n", "inner: expected a table"),
    ('pair = ["a"]\n', "pair: expected 2 values, got 1"),
    ('[inner]\nsizes = [1, "x"]\n', "inner.sizes[1]: expected an integer"),
    ("count = -1\n", "count must be >= 0, got -1"),
    ("count = \n", "Invalid value"),
])
def test_a_wrong_file_is_one_line_naming_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(Outer, path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(Outer, tmp_path / "nope.toml")


def test_to_toml_reads_back_to_the_same_configuration(tmp_path):
    cfg = Outer(count=5, color=Color.BLUE, where=Path("/a b"), table={"k": 2}, inner=Inner(sizes=(9,)))
    text = to_toml(cfg)
    assert "# how many\ncount = 5" in text and "[inner]" in text
    assert load(Outer, write(tmp_path, text)) == cfg


def test_as_dict_is_json_ready():
    d = as_dict(Outer(where=Path("/p")))
    assert json.loads(json.dumps(d)) == d
    assert d["color"] == "red" and d["where"] == "/p" and d["inner"] == {"timeout": 1.5, "sizes": [1, 2]}


def test_reference_lists_every_field_documented():
    docs = reference(Outer)
    assert [d.key for d in docs] == ["name", "count", "on", "color", "where", "pair", "table", "inner.timeout", "inner.sizes"]
    assert all(d.doc for d in docs)
    assert next(d for d in docs if d.key == "inner.timeout").default == 1.5


def test_an_undocumented_setting_is_refused_at_definition():
    with pytest.raises(TypeError, match="documented"):
        setting(1)


def test_config_arguments_make_the_path_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    a = p.parse_args(["--config", "c.toml", "--print-config"])
    assert a.config == tmp_path / "c.toml" and a.print_config


def test_set_settings_are_toml_values_and_bare_words_are_strings():
    assert parse_settings(["count=4", "inner.sizes=[1, 2]", "name=abc", 'name2="q r"', "on=true"]) == {
        "count": 4, "inner.sizes": [1, 2], "name": "abc", "name2": "q r", "on": True}
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_settings(["count"])


def test_from_args_layers_file_then_set_then_flags(tmp_path):
    path = write(tmp_path, "count = 1\nname = \"file\"\n[inner]\ntimeout = 9.0\n")
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    args = p.parse_args(["--config", str(path), "--set", "count=2", "--set", "inner.timeout=3"])
    cfg = from_args(Outer, args, {"count": 5, "name": None})
    assert (cfg.count, cfg.name, cfg.inner.timeout) == (5, "file", 3.0)
    args = p.parse_args(["--set", "name=set"])
    assert from_args(Outer, args, {"name": None}).name == "set"  # a flag not given leaves the setting alone
