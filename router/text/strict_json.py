"""JSON text read strictly: what a request body may hold, and what tool-call arguments may hold.

Python's json module accepts things no later code should see: NaN/Infinity literals, lone
surrogates from `\\ud800` escapes (they crash a tokenizer's UTF-8 encode), integers of
thousands of digits (they overflow msgpack), and nesting deep enough to raise RecursionError.
The same rules apply to request bodies, to the `arguments` strings of tool calls in a chat
history, and to the calls a model writes: each is JSON text from outside.
"""

from __future__ import annotations

import json
import math

MAX_NESTING = 64  # far deeper than any real request; keeps later recursive code safe
MAX_INT = 2**63 - 1  # the widest integer msgpack and the worker carry


class StrictJsonError(ValueError):
    """The text is not JSON, or holds something refused here. The message completes a
    sentence about the text: "the request body " + message."""


def _reject_constant(name: str):
    raise StrictJsonError(f"holds {name}, which is not valid JSON")


def loads(text: str) -> object:
    """The JSON value in `text`; StrictJsonError saying why when it is refused."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise _too_deep() from None
    except StrictJsonError:
        raise
    except ValueError as e:  # JSONDecodeError, the int-digits limit
        raise StrictJsonError(f"is not valid JSON: {e}") from None
    check_values(value)
    return value


def check_values(value: object) -> None:
    """Walk a decoded document without recursion: depth, integer range, well-formed strings."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_NESTING:
                raise _too_deep()
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str):
                    _check_string(key)
                stack.append((child, depth + 1))
        elif isinstance(item, str):
            _check_string(item)
        elif type(item) is int and not -MAX_INT - 1 <= item <= MAX_INT:
            raise StrictJsonError("holds an integer outside the 64-bit range")
        elif isinstance(item, float) and not math.isfinite(item):
            raise StrictJsonError("holds a number too large to represent")


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise StrictJsonError("holds an invalid \\u escape (a lone UTF-16 surrogate)") from None


def _too_deep() -> StrictJsonError:
    return StrictJsonError(f"is nested more than {MAX_NESTING} levels deep")
