"""Typed fields for the fleet config file: each field carries a check that turns a TOML value
into the Python value, or says what was expected (`router.port: expected an integer 1-65535,
got "abc"`), a line of help, and its command-line spelling. One such field is the whole
declaration of a setting: shared/config/flags.py makes the argparse flags from it, the
sections in shared/config/sections.py read the file with it, and the runtime configs take
their defaults from it. Nothing here knows the sections."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

# A check gets the raw value and the directory relative paths are taken from.
Check = Callable[[Any, Path], Any]


class ConfigError(ValueError):
    """A config file or flag value that can't be used; the message names the key."""


class Expected(ValueError):
    """Raised by a check: the text says what was expected."""


def describe(value: Any) -> str:
    """A value as the user wrote it: strings quoted, the rest as TOML/JSON shows them."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


NO_FLAG = ""  # spec(flag=NO_FLAG): a file-only key (e.g. api_keys: ps would show a flag)


def spec(
    default: Any,
    check: Check,
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    unset: Any = None,
    show_choices: bool = True,
    **kwargs,
) -> Any:
    """A dataclass field declaring one setting.

    `help` is the flag's help and the key's description; `flag` its spelling (default: the
    field's name with dashes; NO_FLAG: none); `unset` the value the program uses when the key
    is left at `default=None` (the engine's own default, shown in the help); `show_choices`
    False keeps a check's choices out of argparse (the check's message reports them)."""
    metadata = {"check": check, "help": help, "flag": flag, "metavar": metavar}
    metadata |= {"unset": unset, "show_choices": show_choices}
    return field(default=default, metadata=metadata, **kwargs)


def _parses(
    parse: Callable[[str], Any], choices: Sequence[str] | None = None, repeat: bool = False
):
    """Mark a check with how a flag's text becomes a value it takes (and its choices);
    `repeat`: the flag may be given several times, the check gets the list."""

    def mark(check: Check) -> Check:
        check.parse, check.choices, check.repeat = parse, choices, repeat
        return check

    return mark


def integer(low: int | None = None, high: int | None = None, optional: bool = False) -> Check:
    @_parses(int)
    def check(value, _base):
        if value is None and optional:
            return None
        if type(value) is not int or (low is not None and value < low):
            raise Expected(_int_text(low, high))
        if high is not None and value > high:
            raise Expected(_int_text(low, high))
        return value

    return check


def _int_text(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"an integer {low}-{high}"
    return f"an integer >= {low}" if low is not None else "an integer"


def number(low: float, high: float | None = None, low_open: bool = False) -> Check:
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    text = f"a number {bound}" + (f" and <= {high:g}" if high is not None else "")

    @_parses(float)
    def check(value, _base):
        if type(value) not in (int, float):
            raise Expected(text)
        if value < low or (low_open and value == low) or (high is not None and value > high):
            raise Expected(text)
        return float(value)

    return check


def string(
    choices: Sequence[str] | None = None,
    optional: bool = False,
    parse: Callable[[str], str] = str,
) -> Check:
    """A string (one of `choices`); `parse` turns a flag's text into it (e.g. str.upper)."""

    @_parses(parse, choices)
    def check(value, _base):
        if value is None and optional:
            return None
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise Expected(f"one of {', '.join(choices)}" if choices else "a string")
        return value

    return check


def parse_bool(text: str) -> bool:
    """A flag's text as a boolean: true/false, yes/no, on/off, 1/0."""
    word = text.strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def boolean() -> Check:
    """true or false; its flag alone means true (`--log-requests`)."""

    @_parses(parse_bool)
    def check(value, _base):
        if type(value) is not bool:
            raise Expected("true or false")
        return value

    return check


def strings() -> Check:
    @_parses(lambda text: tuple(item for item in text.split(",") if item))
    def check(value, _base):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            raise Expected("a list of non-empty strings")
        return tuple(value)

    return check


def regexes() -> Check:
    """Regular expressions (a TOML array, a repeated flag; empty: none): each must compile and
    must not match the empty string (it would fire everywhere and take nothing out)."""

    @_parses(str, repeat=True)
    def check(value, _base):
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise Expected("a list of regular expressions")
        for pattern in value:
            try:
                compiled = re.compile(pattern)
            except re.error as e:
                raise Expected(f"regular expressions ({pattern!r}: {e})") from None
            if compiled.fullmatch(""):
                raise Expected(
                    f"regular expressions that match some text ({pattern!r} matches none)"
                )
        return tuple(value)

    return check


def endpoints() -> Check:
    """One ZeroMQ address or several (a TOML string or array, a repeated flag): a tuple."""
    one = endpoint()

    @_parses(str, repeat=True)
    def check(value, base):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not items:
            raise Expected("a ZeroMQ address like tcp://HOST:PORT, or a list of them")
        return tuple(dict.fromkeys(one(item, base) for item in items))

    return check


def path(optional: bool = True) -> Check:
    """A file or directory; `~` expands, relative paths are taken from the config file's folder."""

    @_parses(str)
    def check(value, base):
        if value is None and optional:
            return None
        if not isinstance(value, str | Path) or not str(value):
            raise Expected("a path (a non-empty string)")
        return (base / Path(value).expanduser()).resolve()

    return check


ZMQ_ENDPOINT = re.compile(r"^(tcp://[^\s:]+:(\d+|\*)|ipc://\S+|inproc://\S+)$")


def endpoint(words: tuple[str, ...] = (), optional: bool = False) -> Check:
    """A ZeroMQ address, or one of `words` (e.g. "auto", "off"); None when `optional`."""

    @_parses(str)
    def check(value, _base):
        if value is None and optional:
            return None
        if value in words:
            return value
        if not isinstance(value, str) or not ZMQ_ENDPOINT.match(value):
            also = "".join(f" or {w}" for w in words)
            raise Expected(f"a ZeroMQ address like tcp://HOST:PORT{also}")
        return value

    return check


def redis_url(optional: bool = True) -> Check:
    """A Redis server's URL: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss:// with TLS,
    unix:///PATH for a local socket; None when `optional`."""

    @_parses(str)
    def check(value, _base):
        if value is None and optional:
            return None
        if not isinstance(value, str) or not REDIS_URL.match(value):
            raise Expected("a Redis URL like redis://HOST:6379/0 (or rediss://, unix://)")
        return value

    return check


REDIS_URL = re.compile(r"^(rediss?://[^/\s]+(/\d+)?/?|unix:///\S+)$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def size(optional: bool = True) -> Check:
    """Bytes: an integer, or a string like "512MiB", "8GB"."""

    @_parses(str)
    def check(value, _base):
        if value is None and optional:
            return None
        if type(value) is int and value > 0:
            return value
        match = _SIZE.match(value) if isinstance(value, str) else None
        if match is None or float(match.group(1)) <= 0:
            raise Expected('a size in bytes: an integer or a string like "8GiB" or "512MB"')
        return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])

    return check
