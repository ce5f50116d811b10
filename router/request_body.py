"""Reading a request body as JSON, refusing everything hostile with a 400 before any handler.

Python's json module accepts things no later code should see: NaN/Infinity literals, lone
surrogates from `\\ud800` escapes (they crash a tokenizer's UTF-8 encode), integers of
thousands of digits (they overflow msgpack), and nesting deep enough to raise RecursionError.
Each is refused here with a message saying what was wrong.
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from router.errors import ApiError, bad_request

MAX_NESTING = 64  # far deeper than any real request; keeps later recursive code safe
MAX_INT = 2**63 - 1  # the widest integer msgpack and the worker carry


class _RejectedJson(ValueError):
    pass


def _reject_constant(name: str):
    raise _RejectedJson(f"{name} is not valid JSON")


def parse_json_text(raw: bytes) -> object:
    """The JSON value in `raw`, or ApiError(400) saying why it is refused."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8: {e}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, _RejectedJson) as e:  # JSONDecodeError, int-digits limit, NaN
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    _check_values(value)
    return value


async def json_object_body(request: web.Request) -> dict:
    """The request body as a JSON object; ApiError(400) for anything else."""
    body = parse_json_text(await request.read())
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _check_values(value: object) -> None:
    """Walk the document without recursion: depth, integer range, well-formed strings."""
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
            raise bad_request("the request body holds an integer outside the 64-bit range")
        elif isinstance(item, float) and not math.isfinite(item):
            raise bad_request("the request body holds a number too large to represent")


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(
            "the request body holds an invalid \\u escape (a lone UTF-16 surrogate)"
        ) from None


def _too_deep() -> ApiError:
    return bad_request(f"the request body is nested more than {MAX_NESTING} levels deep")
