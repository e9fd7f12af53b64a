"""Typed configs: dataclasses with a doc per field, loaded from YAML, overridden by dotted CLI flags.

Precedence is CLI > YAML file > dataclass defaults. Every field is declared with `doc(...)`:

    @dataclass
    class OptimConfig:
        lr: float = doc(5e-4, "Peak learning rate after warmup.")

Nested dataclasses are addressed with dots on the command line (`--optim.lr 2e-4` or `--optim.lr=2e-4`)
and as nested mappings in YAML. Unknown keys and values of the wrong type are a one-line
`CodeParrotError` naming the key (and the file), never a silent default.

Stages whose scripts keep classic flags (`--output-dir DIR`, `--no-progress`) generate them from the same
declarations: `add_flags(parser, cls)` adds one argparse flag per field (type, default, help and choices from
the field), `config_from_args(cls, namespace)` builds the validated dataclass back, `parse_config(cls, ...)`
does both. `doc(...)` takes the few command-line details a field's type cannot say (an explicit flag name,
`inverted` for `--no-X` switches, `nargs`, `metavar`, an argument `group`, an `exclusive` group).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from codeparrot.errors import CodeParrotError

T = TypeVar("T")

# `doc(REQUIRED, ...)`: a field without a default, and a required flag on the command line.
REQUIRED: Any = dataclasses.MISSING
_CLI_KEYS = frozenset({"flag", "inverted", "nargs", "metavar", "group", "exclusive", "required", "cli", "extend",
                       "negatable"})


def doc(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with a default and its documentation (shown by `--help` and `describe`).

    `default` may be a value, `REQUIRED`, a mutable list/dict (copied per instance) or a dataclass type (a
    nested config built with its own defaults). Optional command-line details, read by `add_flags`:
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


def _field_types(cls: type) -> dict[str, Any]:
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
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise CodeParrotError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CodeParrotError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise CodeParrotError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise CodeParrotError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    return value


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a (nested) mapping, rejecting unknown keys with a suggestion."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _field_types(cls)
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


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or a syntax error is a one-line error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise CodeParrotError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise CodeParrotError(f"{where}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CodeParrotError(f"{path}: expected a mapping of config keys at the top level")
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
    hints = _field_types(cls)
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


# ------------------------------------------------------------------------------- argparse flags from fields
def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _flag_fields(cls: type, group: str | None = None):
    """(path of field names, field, type, group title) for every command-line field, nested ones flattened."""
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli", True) is False:
            continue
        if "help" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no doc(...): every command-line field needs a help text")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            for path, sub, sub_tp, sub_group in _flag_fields(tp, f.metadata.get("group", group)):
                yield (f.name, *path), sub, sub_tp, sub_group
        else:
            yield (f.name,), f, tp, f.metadata.get("group", group)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def _dest(flag: str) -> str:
    """The namespace attribute argparse derives from an option string or positional name."""
    return flag.lstrip("-").replace("-", "_")


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _show(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _argparse_kwargs(f: dataclasses.Field, tp: Any) -> dict[str, Any]:
    """argparse `add_argument` keywords for field `f` of type `tp`."""
    meta, default = f.metadata, _field_default(f)
    text = meta["help"].replace("%", "%%")
    kwargs: dict[str, Any] = {}
    base = _unwrap_optional(tp)
    if meta.get("inverted"):
        if base is not bool:
            raise TypeError(f"{f.name}: inverted needs a bool field")
        return {"action": "store_true", "help": text}
    if base is bool:
        if default is True or meta.get("negatable"):
            return {"action": argparse.BooleanOptionalAction, "default": default,
                    "help": text + (" (default: on)" if default else "")}
        return {"action": "store_true", "help": text}
    origin = typing.get_origin(base)
    if origin in (list, tuple):
        kwargs["nargs"] = meta.get("nargs", "+")
        base = typing.get_args(base)[0] if typing.get_args(base) else str
    elif "nargs" in meta:
        kwargs["nargs"] = meta["nargs"]
    if typing.get_origin(base) is typing.Literal:
        kwargs["choices"] = list(typing.get_args(base))
        base = type(kwargs["choices"][0])
    if base is not str:
        kwargs["type"] = base
    if meta.get("extend"):
        kwargs["action"] = "extend"
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    if default is not dataclasses.MISSING and default is not None:
        kwargs["default"] = default
        if "default" not in text.lower():  # a help text that explains its default says it better
            text += f" (default: {_show(default).replace('%', '%%')})"
    elif default is None:
        kwargs["default"] = None
    kwargs["help"] = text
    return kwargs


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of dataclass `cls` (nested dataclasses flattened) to `parser`.

    Types give argparse's `type` and `choices` (Literal), bools become switches (store_true when off by
    default, --X/--no-X when on), lists take `nargs="+"`; defaults and help come from `doc(...)`.
    """
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    members: dict[str, list[dataclasses.Field]] = {}
    for _, f, _, group in _flag_fields(cls):
        if "exclusive" in f.metadata:
            members.setdefault(f.metadata["exclusive"], []).append(f)
    for path, f, tp, group in _flag_fields(cls):
        container = parser
        if group is not None:
            if group not in groups:
                groups[group] = parser.add_argument_group(group)
            container = groups[group]
        flag, kwargs = _flag(f), _argparse_kwargs(f, tp)
        name = f.metadata.get("exclusive")
        if name is not None:
            if name not in exclusive:
                required = any(m.metadata.get("required") for m in members[name])
                exclusive[name] = container.add_mutually_exclusive_group(required=required)
            container = exclusive[name]
        elif _field_default(f) is dataclasses.MISSING or f.metadata.get("required"):
            if flag.startswith("-"):
                kwargs["required"] = True
        if flag.startswith("-"):
            kwargs["dest"] = _dest(flag)
        elif kwargs.get("default", dataclasses.MISSING) is None or kwargs.get("default") == []:
            kwargs.pop("default")  # a positional list without a given default is what argparse calls required
        container.add_argument(flag, **kwargs)


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """The validated `cls` built from a namespace parsed by a parser that `add_flags(parser, cls)` set up."""
    data: dict[str, Any] = {}
    for path, f, _, _ in _flag_fields(cls):
        value = getattr(args, _dest(_flag(f)))
        if f.metadata.get("inverted"):
            if not value:
                continue  # the switch was not given: the field keeps its default
            value = False
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return from_dict(cls, data)


def config_parser(cls: type, description: str | None = None) -> argparse.ArgumentParser:
    """An `ArgumentParser` showing `description` as written (a script's docstring) with `cls`'s flags."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, cls)
    return parser


def parse_config(cls: type[T], argv: list[str] | None = None, description: str | None = None) -> T:
    """Parse `argv` (default: sys.argv[1:]) into a validated `cls`; bad values are one-line errors."""
    return config_from_args(cls, config_parser(cls, description).parse_args(argv))


def given_fields(cls: type, argv: list[str] | None = None) -> frozenset[str]:
    """The fields of `cls` (dotted paths for nested ones) whose flags appear in `argv`, even with a value equal
    to the default: what a preset must not override (`PreprocessConfig.with_recipe`)."""
    parser = config_parser(cls)
    for action in parser._actions:  # argparse has no public "was this given" query: parse without defaults
        action.default, action.required = argparse.SUPPRESS, False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    given = vars(parser.parse_args(argv))
    return frozenset(".".join(path) for path, f, _, _ in _flag_fields(cls) if _dest(_flag(f)) in given)


def parse_subcommand(commands: dict[str, tuple[type, Any]], argv: list[str] | None = None,
                     description: str | None = None) -> tuple[str, Any]:
    """A script with subcommands: `commands` maps each name to (its dataclass, anything else the caller needs);
    each dataclass's docstring is its help line and its fields its flags. Returns (name, validated config)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (cls, _) in commands.items():
        add_flags(sub.add_parser(name, help=" ".join((cls.__doc__ or "").split())), cls)
    args = parser.parse_args(argv)
    return args.command, config_from_args(commands[args.command][0], args)
