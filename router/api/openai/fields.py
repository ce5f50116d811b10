"""Every OpenAI request field, declared once: which endpoint knows it and how it is handled.

A field sent as null is absent, whatever its status (generated clients send every unset
field as null). No field is silently ignored (docs/api.md lists every one; tests/unit/router/api/test_known_fields.py
keeps that list and this table equal). A field not in the table is a 400 naming it. A no-op
field is still checked for its type, and a field we cannot honour is a 400 naming it rather
than an answer that quietly differs from what was asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.errors import bad_request

CHAT, TEXT, BOTH = "chat", "text", "chat text"  # /v1/chat/completions, /v1/completions


@dataclass(frozen=True)
class Field:
    endpoints: str  # CHAT, TEXT or BOTH
    no_op: type | None = None  # accepted without effect (chat checks this JSON type)
    note: str = ""  # why a no-op changes nothing; why a refused field is refused
    refused: bool = False  # a 400 with `note`, unless the value asks for nothing (_harmless)
    honoured_if: Callable[[object], bool] | None = None  # the only values we can honour


FIELDS: dict[str, Field] = {
    "model": Field(BOTH),
    "messages": Field(CHAT),
    "prompt": Field(TEXT),
    "max_completion_tokens": Field(CHAT),
    "max_tokens": Field(BOTH),
    "stream_options": Field(BOTH),
    # sampling (router/api/openai/parse.py)
    "temperature": Field(BOTH),
    "top_p": Field(BOTH),
    "top_k": Field(BOTH),
    "min_p": Field(BOTH),
    "seed": Field(BOTH),
    "n": Field(BOTH),
    "stop": Field(BOTH),
    "stream": Field(BOTH),
    # vLLM's extensions (router/api/openai/extensions.py)
    "ignore_eos": Field(BOTH),
    "min_tokens": Field(BOTH),
    "stop_token_ids": Field(BOTH),
    "include_stop_str_in_output": Field(BOTH),
    "skip_special_tokens": Field(BOTH),
    "spaces_between_special_tokens": Field(BOTH, honoured_if=lambda v: v is True),
    # routing (router/routing/affinity.py)
    "prompt_cache_key": Field(BOTH),
    # "24h": the prompt stays cached a day (router/api/checks.py retention_pins)
    "prompt_cache_retention": Field(CHAT),
    # placement (router/placement/): how long the model stays loaded once idle (Ollama's)
    "keep_alive": Field(BOTH),
    # logit processing (router/api/openai/sampling.py); legacy completions' `logprobs` is the count
    "logprobs": Field(BOTH),
    "top_logprobs": Field(CHAT),
    "logit_bias": Field(BOTH),
    "presence_penalty": Field(BOTH),
    "frequency_penalty": Field(BOTH),
    "repetition_penalty": Field(BOTH),
    "response_format": Field(BOTH),
    # prompt scoring (router/api/openai/sampling.py): the prompt's own token logprobs
    "echo": Field(TEXT),
    "prompt_logprobs": Field(BOTH),
    # tools and templates (router/chat/)
    "tools": Field(CHAT),
    "tool_choice": Field(CHAT),
    "chat_template_kwargs": Field(CHAT),
    # accepted, without effect
    "parallel_tool_calls": Field(CHAT, bool, "the model may write several calls; all are returned"),
    "user": Field(BOTH, str, "an end-user id for abuse tracking; not recorded"),
    "safety_identifier": Field(CHAT, str, "as user"),
    "metadata": Field(CHAT, dict, "stored completions are not kept"),
    "store": Field(CHAT, bool, "stored completions are not kept"),
    "service_tier": Field(CHAT, str, "one tier here"),
    "prompt_cache_options": Field(CHAT, dict, "cached prefixes stay until evicted (LRU)"),
    # honoured for one value only
    "best_of": Field(TEXT, honoured_if=lambda v: v == 1),
    "suffix": Field(TEXT, honoured_if=lambda v: v == ""),
    # refused, with what to use instead
    "functions": Field(
        CHAT, refused=True, note="the deprecated 'functions' field is not supported; send 'tools'"
    ),
    "function_call": Field(
        CHAT,
        refused=True,
        note="the deprecated 'function_call' field is not supported; send 'tool_choice'",
    ),
    "audio": Field(CHAT, refused=True, note="audio output is not supported"),
    "modalities": Field(CHAT, refused=True, note="only text output is supported"),
    "prediction": Field(CHAT, refused=True, note="predicted outputs are not supported"),
    "web_search_options": Field(CHAT, refused=True, note="web search is not supported"),
    "reasoning_effort": Field(
        CHAT, refused=True, note="reasoning effort is not adjustable; see chat_template_kwargs"
    ),
    "verbosity": Field(CHAT, refused=True, note="verbosity is not adjustable"),
    "moderation": Field(CHAT, refused=True, note="moderation is not run by this server"),
}

CHAT_FIELDS = frozenset(name for name, f in FIELDS.items() if CHAT in f.endpoints)
COMPLETION_FIELDS = frozenset(name for name, f in FIELDS.items() if TEXT in f.endpoints)
_TYPE_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}


def check_chat_fields(body: dict) -> None:
    """400 for a refused field or a no-op field of the wrong type."""
    for name, f in FIELDS.items():
        if f.refused and body.get(name) is not None and not _harmless(name, body[name]):
            raise bad_request(f.note, name)
    for name, f in FIELDS.items():
        value = body.get(name)
        if f.no_op is not None and value is not None and type(value) is not f.no_op:
            raise bad_request(f"'{name}' must be {_TYPE_NAMES[f.no_op]}", name)


def check_honoured_values(body: dict) -> None:
    """400 for a field whose value we cannot honour (suffix, best_of)."""
    for name, f in FIELDS.items():
        value = body.get(name)
        if f.honoured_if is not None and value is not None and not f.honoured_if(value):
            raise bad_request(f"'{name}' = {value!r} is not supported by this server", name)


def _harmless(name: str, value) -> bool:
    """Values of refused fields that ask for nothing beyond what we do."""
    return name == "modalities" and value == ["text"]
