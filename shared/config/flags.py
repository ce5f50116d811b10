"""Command-line flags made from the section declarations, and flags over the file.

    add_flags(parser, WorkerSection, ["block_size", "max_running"])  # --block-size, ...
    args, passed = parse_with_passed(parser, argv)  # argparse result + the flags actually typed
    router = merge_flags(config.router, args, passed)  # flags win over the file

A flag's dest is its setting's name, its spelling, type, choices, metavar and help come from
the setting's `spec`, so a setting has one declaration whatever command takes it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shared.config.fields import NO_FLAG, ConfigError, Expected, describe, parse_bool
from shared.config.sections import Section, default_of, setting


def flag_of(field: dataclasses.Field) -> str | None:
    """The setting's flag spelling (None: a file-only key)."""
    flag = field.metadata.get("flag")
    if flag == NO_FLAG:
        return None
    return flag or "--" + field.name.replace("_", "-")


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    section: type,
    names: Iterable[str],
    *,
    parser_defaults: bool = False,
    notes: Mapping[str, str] | None = None,
) -> None:
    """One flag per named setting of `section`.

    With `parser_defaults` the declared defaults go into the parser (for a parser whose
    formatter shows them); otherwise every flag defaults to None (absent: the file's or the
    program's value) and its help says the default. `notes` replaces a flag's help where a
    command means something more (launch-cluster: a budget per worker)."""
    notes = notes or {}
    for name in names:
        field = setting(section, name)
        check, flag = field.metadata["check"], flag_of(field)
        if flag is None:
            raise ValueError(f"{section.__name__}.{name} is a file-only key: it has no flag")
        help_text = notes.get(name, field.metadata["help"]).replace("%", "%%")
        default = default_of(section, name)
        if parser_defaults:
            kwargs: dict[str, Any] = {"default": field.default}
        else:
            kwargs = {"default": None}
            if default is not None and default != () and name not in notes:
                shown = ", ".join(map(str, default)) if isinstance(default, tuple) else default
                help_text += f" (default {shown})"
        if field.metadata["show_choices"] and check.choices is not None:
            kwargs["choices"] = check.choices
        if "choices" not in kwargs:  # named for the flag, not the field: --prefix-ttl PREFIX_TTL
            kwargs["metavar"] = field.metadata["metavar"] or flag[2:].replace("-", "_").upper()
        if check.parse is not str:
            kwargs["type"] = check.parse
        if check.parse is parse_bool:  # the flag alone means true
            kwargs |= {"nargs": "?", "const": True, "metavar": "BOOL"}
        if check.repeat:  # given again, it adds one (the check gets the list)
            kwargs["action"] = "append"
        parser.add_argument(flag, dest=name, help=help_text, **kwargs)


def parse_with_passed(
    parser: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, set[str]]:
    """Parse `argv` as usual, and return also the dests of the options the user typed.

    argparse fills a default only for attributes missing from the namespace, so parsing into
    a namespace pre-filled with a marker leaves the marker wherever nothing was typed."""
    args = parser.parse_args(argv)
    marker = object()
    appends = {a.dest for a in parser._actions if isinstance(a, argparse._AppendAction)}
    probe = argparse.Namespace(**{a.dest: marker for a in parser._actions if a.dest not in appends})
    parser.parse_args(argv, namespace=probe)
    passed = {dest for dest, value in vars(probe).items() if value is not marker}
    # an append action extends what is there: typed, it is a list (its default is None)
    passed = (passed - appends) | {d for d in appends if getattr(args, d) is not None}
    return args, passed


def merge_flags(
    section: Section,
    args: argparse.Namespace,
    passed: Iterable[str],
    rename: Mapping[str, str] | None = None,
) -> Section:
    """`section` with the value of every passed flag that names one of its fields (flags win).

    `rename` maps a flag's dest to the field it sets when the names differ
    (e.g. {"model": "path"}). Values are checked like the file's, so a bad flag value gets
    the same kind of message (with `--flag` instead of `section.key`)."""
    rename = rename or {}
    fields = {f.name: f for f in dataclasses.fields(section)}
    values = {}
    for dest in passed:
        name = rename.get(dest, dest)
        if name in fields:
            flag = "--" + dest.replace("_", "-") if dest != name else flag_of(fields[name])
            raw = getattr(args, dest)
            raw = str(raw) if isinstance(raw, Path) else raw
            values[name] = checked(flag, fields[name], raw, Path.cwd())
    return dataclasses.replace(section, **values)


def checked(key: str, field: dataclasses.Field, raw: Any, base_dir: Path) -> Any:
    """`raw` through the setting's check; ConfigError names `key` and what was expected."""
    try:
        return field.metadata["check"](raw, base_dir)
    except Expected as e:
        raise ConfigError(f"{key}: expected {e}, got {describe(raw)}") from None
