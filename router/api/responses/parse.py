"""A /v1/responses body -> the neutral GenerationRequest (through the chat prompt path), plus
what the reply echoes and stores (ResponsesRequest.context)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.api.checks import (
    completion_budget,
    refuse_unknown_fields,
    retention_pins,
    typed_field,
)
from router.api.openai.sampling import ANY_JSON_OBJECT, schema_grammar
from router.api.request import GenerationRequest, chat_prompt_fields
from router.api.responses.fields import RESPONSES_FIELDS, check_responses_fields
from router.api.responses.items import chat_messages, input_items
from router.api.responses.store import previous_not_found
from router.api.responses.tools import responses_tools
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.prompt import build_chat_prompt
from router.chat.tool_grammar import enforce_tool_choice
from router.errors import bad_request
from shared.sampling import InvalidRequest, SamplingParams

if TYPE_CHECKING:
    from router.api.responses.store import ScopedStore
    from router.chat.prompt import ChatPrompt
    from router.chat.tools import ToolSet
    from router.text.tokenizer import ModelTokenizer

ENDPOINT = "/v1/responses"


@dataclass(frozen=True)
class ResponseContext:
    """What a Responses reply needs beyond the GenerationRequest: the request's own fields
    (echoed in the response object), its input items and the history it continued."""

    echo: dict
    input_items: list[dict]
    history: tuple[dict, ...] = ()
    store: bool = True
    parallel_tool_calls: bool = True


@dataclass(frozen=True)
class ResponsesRequest(GenerationRequest):
    context: ResponseContext = field(default_factory=lambda: ResponseContext({}, []))


def parse_responses(
    body: dict,
    tokenizer: ModelTokenizer,
    model_id: str,
    max_tokens_cap: int | None,
    store: ScopedStore,
    images: PromptImages = NO_IMAGES,
) -> ResponsesRequest:
    refuse_unknown_fields(body, RESPONSES_FIELDS, ENDPOINT)
    check_responses_fields(body)
    items = input_items(body.get("input"))
    history, previous_key = _history(body, store)
    keep = typed_field(body, "store", bool, True)
    instructions = typed_field(body, "instructions", str, None)
    system = [{"role": "system", "content": instructions}] if instructions else []
    tools = responses_tools(body)
    max_output = typed_field(body, "max_output_tokens", int, None)
    if max_output is not None and max_output < 1:
        raise bad_request("'max_output_tokens' must be at least 1", "max_output_tokens")
    room = output_room(max_output, max_tokens_cap, tokenizer.context_length)
    kept, prompt = _fit(body, system, [*history, *items], tools, tokenizer, room, images)
    max_tokens = completion_budget(
        len(prompt.token_ids), max_output, tokenizer.context_length, max_tokens_cap
    )
    sampling = _sampling(body, max_tokens, tokenizer.chat_stop_token_ids)
    parallel = typed_field(body, "parallel_tool_calls", bool, True)
    return ResponsesRequest(
        "chat",
        model_id,
        tuple(prompt.wire_ids),
        enforce_tool_choice(sampling, tools, prompt, tokenizer),
        (),
        typed_field(body, "stream", bool, False),
        True,
        **chat_prompt_fields(prompt),
        cache_key=_cache_key(body, previous_key, keep),
        pins=retention_pins(body, len(prompt.wire_ids)),
        context=ResponseContext(
            _echo(body, max_output, sampling) | {"parallel_tool_calls": parallel},
            items,
            tuple(kept[: max(0, len(kept) - len(items))]),
            keep,
            parallel,
        ),
    )


def history_items(body: dict, store: ScopedStore) -> tuple[dict, ...]:
    """The stored items a `previous_response_id` continues (none when absent or unknown:
    parse_responses answers that)."""
    previous = body.get("previous_response_id")
    stored = store.get(previous) if isinstance(previous, str) else None
    return stored.context if stored is not None else ()


def _history(body: dict, store: ScopedStore) -> tuple[tuple[dict, ...], str | None]:
    """The items a continuation prepends, and the routing key its conversation was sent by."""
    previous = typed_field(body, "previous_response_id", str, None)
    if previous is None:
        return (), None
    stored = store.get(previous)
    if stored is None:
        raise previous_not_found(previous)
    return stored.context, stored.cache_key


def _cache_key(body: dict, previous_key: str | None, keep: bool) -> str | None:
    """The routing affinity key (router/routing/affinity.py): the request's prompt_cache_key,
    else its conversation's (the turns of a `previous_response_id` chain go where the first
    went, and find their prefix in that worker's cache), else a new one for a stored reply."""
    key = typed_field(body, "prompt_cache_key", str, None) or previous_key
    if key is None and keep:
        key = f"conversation:{uuid.uuid4().hex}"
    return key


# With no max_output_tokens (and no cap), `truncation: "auto"` still leaves the reply this
# much room: a quarter of the context, at most this many tokens.
DEFAULT_OUTPUT_ROOM = 1024


def output_room(max_output: int | None, cap: int | None, context_length: int) -> int:
    """The output tokens `truncation: "auto"` keeps free: what was asked, within the cap."""
    asked = [v for v in (max_output, cap) if v is not None]
    if asked:
        return min(asked)
    return max(1, min(DEFAULT_OUTPUT_ROOM, context_length // 4))


def _fit(
    body: dict,
    system: list[dict],
    items: list[dict],
    tools: ToolSet | None,
    tokenizer: ModelTokenizer,
    room: int,
    images: PromptImages,
) -> tuple[list[dict], ChatPrompt]:
    """The prompt; with `truncation: "auto"`, the oldest items are dropped (a call's output
    goes with its call) until the prompt and `room` output tokens fit the context."""
    truncation = body.get("truncation", "disabled") or "disabled"
    if truncation not in ("auto", "disabled"):
        raise bad_request("'truncation' must be 'auto' or 'disabled'", "truncation")
    while True:
        messages = system + chat_messages(items)
        prompt = build_chat_prompt(messages, tools, tokenizer, {}, images=images)
        fits = len(prompt.token_ids) + room <= tokenizer.context_length
        if fits or truncation == "disabled" or len(items) == 1:
            return items, prompt
        items = items[1:]
        while len(items) > 1 and items[0]["type"] in ("function_call_output", "reasoning"):
            items = items[1:]


def _sampling(body: dict, max_tokens: int, stop_ids) -> SamplingParams:
    sampling = SamplingParams(
        temperature=typed_field(body, "temperature", float, 1.0),
        top_p=typed_field(body, "top_p", float, 1.0),
        max_tokens=max_tokens,
        stop_token_ids=tuple(stop_ids),
        grammar=text_format_grammar(body.get("text")),
    )
    try:
        sampling.validate()
    except InvalidRequest as e:
        raise bad_request(str(e), str(e).split(" ", 1)[0]) from None
    return sampling


def text_format_grammar(text):
    """`text.format`: text (no grammar), json_object, or json_schema (name + schema)."""
    if text is None:
        return None
    param = "text.format"
    if not isinstance(text, dict) or text.keys() - {"format", "verbosity"}:
        raise bad_request("'text' must be an object with 'format'", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request("'text.verbosity' is not adjustable", "text.verbosity")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return schema_grammar(ANY_JSON_OBJECT, param)
    if kind != "json_schema":
        raise bad_request(
            "'text.format.type' must be 'text', 'json_object' or 'json_schema'", param
        )
    if not isinstance(fmt.get("name"), str) or not fmt["name"]:
        raise bad_request("'text.format.name' must be a non-empty string", param)
    if fmt.get("strict") is not None and type(fmt["strict"]) is not bool:
        raise bad_request("'text.format.strict' must be a boolean", param)
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request("'text.format.schema' must be an object", param)
    return schema_grammar(json.dumps(fmt["schema"]), param)


def _echo(body: dict, max_output: int | None, sampling: SamplingParams) -> dict:
    """The request's settings as the response object repeats them."""
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad_request("'metadata' must be an object of string values", "metadata")
    text = body.get("text") or {}
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": max_output,
        "metadata": metadata,
        "previous_response_id": body.get("previous_response_id"),
        "temperature": sampling.temperature,
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [_echoed_tool(t) for t in body.get("tools") or []],
        "top_p": sampling.top_p,
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
        "store": typed_field(body, "store", bool, True),
    }


def _echoed_tool(tool: dict) -> dict:
    """A function tool as the response repeats it: `strict` and `parameters` are required
    (nullable) there, so one the request left out is echoed as null."""
    return {"strict": None, "parameters": None} | tool
