"""One configuration mechanism for every ``ina-*`` command: frozen dataclasses, read from TOML, recorded whole.

A command's configuration is a frozen dataclass whose every field is declared with :func:`setting`, which
carries the field's one-line documentation beside its default::

    @dataclass(frozen=True)
    class ControllerConfig:
        listen: str = setting("127.0.0.1:50051", "address of the admission service")
        policy: PolicyName = setting(PolicyName.FIRST_FIT, "allocation policy of a new database")

:func:`load` reads a TOML file (``--config FILE``, :mod:`tomllib`) into it: a nested dataclass is a TOML
table, an enum its value, a tuple an array; a key the dataclass does not have, or a value of the wrong type,
is refused with the key's dotted name. Values a user sets per run on the command line are ``overrides`` on
top of the file. :func:`as_dict` is what results files record (JSON-ready), :func:`to_toml` what
``--print-config`` prints (a file ``--config`` reads back), and :func:`reference` lists every field with its
type, default and documentation, for the docs and ``--help``.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "ConfigError",
    "FieldDoc",
    "add_config_arguments",
    "as_dict",
    "from_args",
    "load",
    "markdown_table",
    "parse_settings",
    "reference",
    "setting",
    "to_toml",
]

T = TypeVar("T")
_DOC = "doc"


class ConfigError(ValueError):
    """A configuration that cannot be used; the text names the key (dotted) and what is wrong, in one line."""


def setting(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its documentation: ``setting(default, "what it is and its unit")``.

    ``factory`` builds a mutable or nested default (``factory=StreamConfig``), as ``field(default_factory=)``.
    """
    if not doc:
        raise TypeError("every setting is documented: setting(default, 'what it is')")
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={_DOC: doc})
    return dataclasses.field(default=default, metadata={_DOC: doc})


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One field of a configuration, as :func:`reference` lists it: dotted key, type, default, documentation."""

    key: str
    type: str
    default: Any
    doc: str


# --- reading ----------------------------------------------------------------------------------------------
def load(cls: type[T], path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> T:
    """An instance of the dataclass ``cls`` from a TOML file (None: the defaults) with ``overrides`` on top.

    ``overrides`` maps dotted keys (``"stream.op_timeout"``) to values already of the field's type (parsed
    flags); a value of None means "not given" and is skipped. Raises ConfigError naming the key on any problem
    (a file that cannot be read or parsed, an unknown key, a wrong type, a value ``__post_init__`` refuses).
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        *parents, leaf = key.split(".")
        table = data
        for name in parents:
            table = table.setdefault(name, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{key}: {name} is not a table")
        table[leaf] = value
    where = f"{path}: " if path is not None else ""
    try:
        return _build(cls, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def _build(cls: type[T], data: Mapping[str, Any], prefix: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'the file'}: expected a table, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]} (known: {', '.join(sorted(fields))})")
    kwargs = {name: _convert(hints[name], value, prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {exc}") from None


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _convert(option, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {_describe(value)} fits none of {tp}")
    if dataclasses.is_dataclass(tp):
        return value if isinstance(value, tp) else _build(tp, value, key + ".")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected an array, got {_describe(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[A, B]: fixed length
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
            return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        items = [_convert(args[0] if args else Any, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table, got {_describe(value)}")
        kt, vt = args if args else (str, Any)
        return {_convert(kt, k, key): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(f"{key}: {value!r} is not one of {choices}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_describe(value)}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{key}: expected a path (a string), got {_describe(value)}")
        return Path(value)
    raise ConfigError(f"{key}: fields of type {tp} cannot be configured")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


# --- writing ----------------------------------------------------------------------------------------------
def as_dict(config: Any) -> dict[str, Any]:
    """The whole configuration as plain JSON/TOML values (enums as their values, paths as strings)."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return value


def to_toml(config: Any) -> str:
    """The configuration as a TOML file that :func:`load` reads back (fields that are None are left out)."""
    docs = {d.key: d.doc for d in reference(type(config))}
    lines: list[str] = []
    _emit(as_dict(config), "", docs, lines)
    return "\n".join(lines).strip() + "\n"


def _emit(table: Mapping[str, Any], prefix: str, docs: Mapping[str, str], lines: list[str]) -> None:
    subtables = []
    for key, value in table.items():
        if value is None:
            continue
        if f"{prefix}{key}" not in docs:  # a nested configuration: its own table, after this one's keys
            subtables.append((key, value))
            continue
        lines += [f"# {docs[f'{prefix}{key}']}", f"{_toml_key(key)} = {_toml_value(value)}"]
    for key, value in subtables:
        lines += ["", f"[{prefix}{_toml_key(key)}]"]
        _emit(value, f"{prefix}{key}.", docs, lines)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise ConfigError(f"{value!r} has no TOML form")


# --- documentation ----------------------------------------------------------------------------------------
def reference(cls: type, prefix: str = "") -> list[FieldDoc]:
    """Every field of ``cls`` (nested dataclasses flattened to dotted keys), in declaration order."""
    hints = typing.get_type_hints(cls)
    out: list[FieldDoc] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if dataclasses.is_dataclass(tp):
            out += reference(tp, f"{prefix}{f.name}.")
            continue
        shown = None if default is dataclasses.MISSING else _plain(default)
        out.append(FieldDoc(f"{prefix}{f.name}", _type_name(tp), shown, f.metadata.get(_DOC, "")))
    return out


def markdown_table(cls: type) -> str:
    """Every setting of ``cls`` as a Markdown table (key, default, meaning): the docs' settings reference."""
    from inaproto.commands import REPO  # defaults inside the checkout are shown relative to it

    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for d in reference(cls):
        value = d.default
        if isinstance(value, str) and value.startswith(f"{REPO}/"):
            value = value[len(str(REPO)) + 1:]
        default = "none" if value is None else f"`{_toml_value(value)}`"
        rows.append(f"| `{d.key}` | {default} | {d.doc.replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(repr(m.value) for m in tp)
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("pathlib.", "")


# --- the command line -------------------------------------------------------------------------------------
def add_config_arguments(parser: argparse.ArgumentParser, example: str = "") -> None:
    """The options every ``ina-*`` daemon has: ``--config FILE`` (TOML, read with :func:`load`), ``--set KEY=VALUE``
    (one setting, repeatable, over the file) and ``--print-config`` (the effective configuration as TOML, then
    exit). ``example``: a setting of the command's own for ``--set``'s help. Read them back with :func:`from_args`."""
    parser.add_argument("--config", metavar="FILE", type=_absolute,
                        help="read settings from this TOML file (see --print-config for every setting)")
    shown = f": --set {example}" if example else ""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help=f"one setting over the file, as a TOML value{shown} (repeatable)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective configuration as TOML and exit")


def parse_settings(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as overrides for :func:`load`: the value is read as a TOML value (``30``, ``true``,
    ``[1, 2]``, ``"text"``), and a bare word that is not one is taken as a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text.strip()
    return out


def from_args(cls: type[T], args: argparse.Namespace, flags: Mapping[str, Any] | None = None) -> T:
    """The configuration a command line asks for: the ``--config`` file, then its ``--set`` settings, then
    ``flags`` (dotted key -> value of the per-run flags given; None: not given)."""
    given = {key: value for key, value in (flags or {}).items() if value is not None}
    overrides = {**parse_settings(getattr(args, "settings", []) or []), **given}
    return load(cls, getattr(args, "config", None), overrides)


def _absolute(text: str) -> Path:
    return Path(text).expanduser().absolute()
