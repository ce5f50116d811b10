"""Request checks every API adapter shares: typed fields, unknown fields, the token budget.

They live here, not in one API's parser, so that no adapter reaches into another's module.
"""

from __future__ import annotations

from router.errors import bad_request
from shared.protocol import CachePin

_KIND_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    str: "a string",
    list: "an array",
    dict: "an object",
}
_JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}


def typed_field(body: dict, name: str, kind: type, default):
    """body[name] checked against `kind` (null counts as absent); ints pass as floats."""
    value = body.get(name)
    if value is None:
        return default
    if kind is float and type(value) in (int, float):
        return float(value)
    if type(value) is not kind:
        raise bad_request(
            f"'{name}' must be {_KIND_NAMES[kind]}, got {_JSON_TYPES.get(type(value), 'null')}",
            name,
        )
    return value


def refuse_unknown_fields(body: dict, known: frozenset[str], endpoint: str) -> None:
    """400 naming the first field (in sorted order) that `endpoint` does not know.

    OpenAI answers an unknown field with "Unrecognized request argument supplied"; so do we,
    on every POST endpoint, so that a misspelt field (`max_token`) or another server's
    extension (`guided_json`) is never silently without effect."""
    unknown = sorted(body.keys() - known)
    if unknown:
        name = unknown[0]
        raise bad_request(
            f"unrecognized request argument supplied: {name!r} ({endpoint} does not know it; "
            "docs/api.md lists every field)",
            name,
        )


def completion_budget(
    prompt_len: int, max_tokens: int | None, context_length: int, cap: int | None
) -> int:
    """The completion budget: as asked (default: the rest of the context), clamped to `cap`."""
    if prompt_len >= context_length:
        raise bad_request(
            f"This model's maximum context length is {context_length} tokens; the prompt has "
            f"{prompt_len} tokens",
            "messages",
            "context_length_exceeded",
        )
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    if max_tokens is None:
        max_tokens = context_length - prompt_len
    if cap is not None:
        max_tokens = min(max_tokens, cap)
    if prompt_len + max_tokens > context_length:
        raise bad_request(
            f"This model's maximum context length is {context_length} tokens; you requested "
            f"{prompt_len + max_tokens} ({prompt_len} in the prompt, {max_tokens} for the "
            "completion)",
            "max_tokens",
            "context_length_exceeded",
        )
    return max_tokens


# OpenAI's prompt_cache_retention (Chat and Responses): how long the prompt's prefix is kept
RETENTIONS = {"in_memory": 0.0, "24h": 24 * 3600.0}


def retention_pins(body: dict, prompt_tokens: int) -> tuple[CachePin, ...]:
    """`prompt_cache_retention: "24h"` keeps the whole prompt cached for a day (the worker
    pins it, shared/protocol.py CachePin); `"in_memory"` (the default) keeps it as long as
    memory allows (LRU). Any other value is a 400."""
    value = body.get("prompt_cache_retention")
    if value is None:
        return ()
    if value not in RETENTIONS:
        raise bad_request(
            f"'prompt_cache_retention' must be one of {', '.join(map(repr, RETENTIONS))}",
            "prompt_cache_retention",
        )
    ttl = RETENTIONS[value]
    return (CachePin(prompt_tokens, ttl),) if ttl else ()
