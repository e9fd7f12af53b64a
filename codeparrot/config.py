"""Typed configs: dataclasses with a doc per field, loaded from YAML, overridden by dotted CLI flags.

Precedence is CLI > YAML file > dataclass defaults. Every field is declared with `doc(...)`:

    @dataclass
    class OptimConfig:
        lr: float = doc(5e-4, "Peak learning rate after warmup.")

Nested dataclasses are addressed with dots on the command line (`--optim.lr 2e-4` or `--optim.lr=2e-4`)
and as nested mappings in YAML. Unknown keys, keys given twice in a file, values of the wrong type and NaN or
infinite numbers are a one-line `CodeParrotError` naming the key (and the file), never a silent default.

Stages whose scripts keep classic flags (`--output-dir DIR`, `--no-progress`) generate them from the same
declarations (`codeparrot.config_flags`). `doc(...)` takes the few command-line details a field's type cannot
say (an explicit flag name, `inverted` for `--no-X` switches, `nargs`, `metavar`, an argument `group`, an
`exclusive` group).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from codeparrot.errors import CodeParrotError

T = TypeVar("T")

# `doc(REQUIRED, ...)`: a field without a default, and a required flag on the command line.
REQUIRED: Any = dataclasses.MISSING
# The longest wait (timeout, stall limit) a config accepts: a week, far beyond any real one, and within what
# Python's timers take (a thread join's timeout or faulthandler's overflow past about 10^10 seconds).
MAX_WAIT_SECONDS = 7 * 24 * 3600
_CLI_KEYS = frozenset({"flag", "inverted", "nargs", "metavar", "group", "exclusive", "required", "cli", "extend",
                       "negatable"})


def doc(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with a default and its documentation (shown by `--help` and `describe`).

    `default` may be a value, `REQUIRED`, a mutable list/dict (copied per instance) or a dataclass type (a
    nested config built with its own defaults). Optional command-line details, read by
    `codeparrot.config_flags.add_flags`:
    flag (option string such as "--input", or a positional name such as "file"; default `--field-name`),
    inverted (a bool field set to False by a store_true flag such as --no-progress, else left at its default),
    negatable (a bool field off by default that also gets --no-X, for a preset that switches it on),
    nargs, metavar, extend (repeated flags add to the list), group (argparse argument group title; on a
    nested dataclass field it applies to its fields), exclusive (name of a mutually exclusive group, required
    when a member says required=True), required (on the command line although the field has a default),
    cli=False (no flag; the field keeps its default).
    """
    unknown = set(cli) - _CLI_KEYS
    if unknown:
        raise TypeError(f"doc(): unknown command-line options {sorted(unknown)}")
    meta = {"help": help, **cli}
    if default is REQUIRED:
        return dataclasses.field(metadata=meta)
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=meta)
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of every field of dataclass `cls` (string annotations evaluated)."""
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert `value` to type `tp`; strings from the CLI are parsed as YAML scalars first."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [arg for arg in args if arg is not type(None)]
        if len(candidates) == 1:  # Optional[X]: X's own message ("expected a finite number") says more
            return _coerce(value, candidates[0], key)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except CodeParrotError:
                continue
        raise CodeParrotError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise CodeParrotError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise CodeParrotError(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise CodeParrotError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise CodeParrotError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CodeParrotError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        return _finite_float(value, key)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise CodeParrotError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise CodeParrotError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    return value


def _finite_float(value: Any, key: str) -> float:
    """A float field's value. NaN and infinities are refused here, once for every config: they pass every range
    check (`nan < 0` and `nan > 0` are both false) and then fail far away (torch's optimizer, a thread join) or
    silently switch a limit off. No field uses inf for "no limit": those say null or 0."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise CodeParrotError(f"{key}: expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CodeParrotError(f"{key}: expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range
        number = math.inf
    if not math.isfinite(number):
        raise CodeParrotError(f"{key}: expected a finite number, got {value!r}")
    return number


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a (nested) mapping, rejecting unknown keys with a suggestion."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in (data or {}).items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            raise CodeParrotError(f"unknown config key {prefix}{key}{hint}")
        kwargs[key] = _coerce(value, hints[key], f"{prefix}{key}")
    try:
        obj = cls(**kwargs)
    except TypeError as err:
        raise CodeParrotError(f"{prefix or cls.__name__}: {err}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """The config as plain nested dicts (what is saved with every checkpoint)."""
    return dataclasses.asdict(obj)


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (at any depth). Plain YAML keeps the last
    one silently: a second `optim:` section would drop the first one's `lr`. Keys brought in by the merge key
    `<<` may still be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first_line[key]})", key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _read_text(path: Path) -> str:
    """The file's text; unreadable or non-UTF-8 files are a one-line error naming the file (and line)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CodeParrotError(f"{path}: cannot read the config file: {err.strerror or err}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise CodeParrotError(f"{path}:{line}: not UTF-8 text (byte offset {err.start}): save the config file as "
                              "UTF-8") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping of config keys. A missing, unreadable, non-UTF-8 or empty file, a syntax error, a key
    given twice and a top level that is not a mapping are one-line errors naming the file (and line)."""
    path = Path(path)
    if path.is_dir():
        raise CodeParrotError(f"{path} is a folder, not a config file: give a YAML file")
    if not path.is_file():
        raise CodeParrotError(f"config file not found: {path}")
    try:
        data = yaml.load(_read_text(path), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise CodeParrotError(f"{where}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if data is None:  # an empty (or comments-only) file: most likely a truncated or wrong file, not "defaults"
        raise CodeParrotError(f"{path}: the config file is empty: it sets no keys (leave it out for the defaults)")
    if not isinstance(data, dict):
        raise CodeParrotError(f"{path}: expected a mapping of config keys at the top level, got "
                              f"{type(data).__name__} {data!r:.60}")
    return data


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn `['--optim.lr', '2e-4', '--seed=3']` into a nested dict `{'optim': {'lr': '2e-4'}, 'seed': '3'}`.

    Values stay strings here; `from_dict` converts them to each field's declared type.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise CodeParrotError(f"unexpected argument {arg!r}: overrides look like --key value or --key=value")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        else:
            if i + 1 >= len(args) or (args[i + 1].startswith("--") and len(args[i + 1]) > 2):
                value = "true"  # a bare flag, e.g. --gradient_checkpointing
            else:
                i += 1
                value = args[i]
        key = key.replace("-", "_")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise CodeParrotError(f"override --{key} conflicts with another override")
        node[parts[-1]] = _parse_scalar(value)
        i += 1
    return out


def _parse_scalar(value: str) -> Any:
    """CLI strings: keep them as strings except YAML's null, so `--key null` clears an optional field."""
    return None if value in ("null", "None", "~") else value


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `override` into a copy of `base`."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | dict | None = None) -> T:
    """defaults < YAML file < CLI overrides, validated into `cls`. Errors name the file when there is one."""
    file_data: dict[str, Any] = load_yaml(path) if path else {}
    data = file_data
    if overrides:
        data = merge(data, parse_overrides(overrides) if isinstance(overrides, list) else overrides)
    try:
        return from_dict(cls, data)
    except CodeParrotError as err:
        source = _error_source(cls, path, file_data, bool(overrides), err)
        raise CodeParrotError(f"{source}: {err}" if source else str(err)) from None


def _error_source(cls: type, path, file_data: dict[str, Any], has_overrides: bool, err: CodeParrotError) -> str:
    """Where a config error came from: the YAML file when the file alone already fails the same way,
    otherwise the command-line overrides (so `--optim.lrr 2` is never blamed on the YAML file)."""
    if not has_overrides:
        return str(path) if path else ""
    if path:
        try:
            from_dict(cls, file_data)
        except CodeParrotError as file_err:
            if str(file_err) == str(err):
                return str(path)
    return "command line"


def describe(cls: type, prefix: str = "") -> str:
    """A `--help` text: one line per (nested) field with its type, default and documentation."""
    lines = []
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"  {prefix}{f.name}.*: {f.metadata.get('help', '')}")
            lines.append(describe(tp, prefix=f"{prefix}{f.name}."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = "required"
        lines.append(f"  --{prefix}{f.name} ({_type_name(tp)}, default {default!r})\n      {f.metadata.get('help', '')}")
    return "\n".join(lines)
