"""Every /v1/responses request field, declared once: honoured, an accepted no-op, or refused.

docs/api.md's Responses table lists the same names (tests/unit/router/api/test_known_fields.py
keeps them equal); a field in neither is a 400 naming it. A field sent as null is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.errors import bad_request


@dataclass(frozen=True)
class Field:
    no_op: type | None = None  # accepted without effect, checked for this JSON type
    refused: str = ""  # why: a 400 with this note unless `harmless(value)`
    harmless: Callable[[object], bool] | None = None  # refused values that ask for nothing


HONOURED = Field()
FIELDS: dict[str, Field] = {
    "model": HONOURED,
    "input": HONOURED,
    "instructions": HONOURED,
    "tools": HONOURED,
    "tool_choice": HONOURED,
    "parallel_tool_calls": HONOURED,
    "text": HONOURED,
    "max_output_tokens": HONOURED,
    "temperature": HONOURED,
    "top_p": HONOURED,
    "stream": HONOURED,
    "store": HONOURED,
    "previous_response_id": HONOURED,
    "truncation": HONOURED,
    "metadata": HONOURED,  # echoed and stored
    "keep_alive": HONOURED,  # placement (router/placement/): Ollama's
    "user": Field(no_op=str),
    "safety_identifier": Field(no_op=str),
    "prompt_cache_key": HONOURED,  # a routing affinity key, as on chat
    "client_metadata": Field(no_op=dict),  # Codex CLI's ids of its session and turn
    "service_tier": Field(no_op=str),
    "stream_options": Field(no_op=dict),
    "prompt_cache_retention": HONOURED,  # "24h": kept a day (router/api/checks.py)
    "prompt_cache_options": Field(no_op=dict),
    "include": Field(
        refused="'include' asks for data this server does not produce (encrypted reasoning, "
        "logprobs, tool sources)",
        harmless=lambda v: isinstance(v, list) and set(v) <= {"reasoning.encrypted_content"},
    ),
    "background": Field(
        refused="background mode is not supported: send the request without 'background' "
        "(or stream it)",
        harmless=lambda v: v is False,
    ),
    "reasoning": Field(
        refused="reasoning effort and summaries are not adjustable; reasoning models think as "
        "their template says",
        harmless=lambda v: isinstance(v, dict) and _no_adjustment(v),
    ),
    "top_logprobs": Field(
        refused="logprobs are not returned by /v1/responses", harmless=lambda v: v == 0
    ),
    "max_tool_calls": Field(refused="'max_tool_calls' is not supported (function tools only)"),
    "conversation": Field(
        refused="the Conversations API is not supported; chain turns with 'previous_response_id'"
    ),
    "prompt": Field(refused="stored prompt templates are not supported; send 'input'"),
    "context_management": Field(refused="context management (compaction) is not supported"),
    "moderation": Field(refused="moderation is not run by this server"),
}
RESPONSES_FIELDS = frozenset(FIELDS)
_SUMMARIES = (None, "auto", "concise", "detailed")


def _no_adjustment(reasoning: dict) -> bool:
    """`reasoning` asks for nothing we would change: no effort; a `summary` (Codex CLI sends
    "auto") is accepted, and reasoning items carry the whole reasoning text instead."""
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    rest = (v for k, v in reasoning.items() if k not in ("summary", "generate_summary"))
    return summary in _SUMMARIES and all(v is None for v in rest)


_TYPE_NAMES = {str: "a string", dict: "an object"}


def check_responses_fields(body: dict) -> None:
    """400 for a refused field's value, or an accepted no-op of the wrong type."""
    for name, f in FIELDS.items():
        value = body.get(name)
        if value is None:
            continue
        if f.refused and not (f.harmless is not None and f.harmless(value)):
            raise bad_request(f.refused, name)
        if f.no_op is not None and type(value) is not f.no_op:
            raise bad_request(f"'{name}' must be {_TYPE_NAMES[f.no_op]}", name)
