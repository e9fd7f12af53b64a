"""Command-line flags generated from the typed configs of `codeparrot.config` (one flag per `doc(...)` field).

Stages whose scripts keep classic flags (`--output-dir DIR`, `--no-progress`) declare them once, as config
fields: `add_flags(parser, cls)` adds one argparse flag per field (type, default, help and choices from the
field), `config_from_args(cls, namespace)` builds the validated dataclass back, `parse_config(cls, ...)` does
both, `parse_subcommand` does it for a script with subcommands. The command-line details a field's type cannot
say come from `doc(...)` (see its docstring).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

from codeparrot.config import field_types, from_dict
from codeparrot.errors import CodeParrotError

T = TypeVar("T")


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _flag_fields(cls: type, group: str | None = None):
    """(path of field names, field, type, group title) for every command-line field, nested ones flattened."""
    hints = field_types(cls)
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
        # a help text that explains its default says it better; an empty one ("", []) has nothing to show
        if "default" not in text.lower() and _show(default):
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
    try:
        return from_dict(cls, data)
    except CodeParrotError as err:  # "optim.lr: expected ..." -> "--lr: expected ...": the user typed the flag
        key, sep, rest = str(err).partition(": ")
        flags = {".".join(path): _flag(f) for path, f, _, _ in _flag_fields(cls)}
        if sep and key in flags:
            raise CodeParrotError(f"{flags[key]}: {rest}") from None
        raise


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
