"""Our own compact JSON Schemas for the replies OpenAI's OpenAPI document describes.

Written from the facts of `openai/openai-openapi` (openapi.yaml, components/schemas, read
2026-11): for each object, the fields the document marks `required`, their JSON types, which
of them may be `null`, and the enumerations a strict decoder (Go, Rust, Java, .NET clients
generated from that document) rejects unknown values of. Extra fields are allowed, as the
document allows them. Names in the comments are the document's schema names.

Where the document has no schema for what OpenAI sends (streamed legacy completions reuse
CreateCompletionResponse, whose `finish_reason` is not nullable), ours says what OpenAI
sends; docs/api.md ("Schema conformance") lists these places.
"""

from __future__ import annotations

import jsonschema

STRING, INTEGER, NUMBER, BOOLEAN = (
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
)


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def enum(*values: str) -> dict:
    return {"type": "string", "enum": list(values)}


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


def obj(required: tuple[str, ...] = (), **properties: dict) -> dict:
    """An object whose `required` names must be present; every property listed is typed."""
    missing = set(required) - properties.keys()
    assert not missing, f"required but untyped: {missing}"
    return {"type": "object", "required": list(required), "properties": properties}


def tagged(**variants: dict) -> dict:
    """A union told apart by its `type` field (the document's `discriminator`)."""
    return {
        "type": "object",
        "required": ["type"],
        "properties": {"type": enum(*variants)},
        "allOf": [
            {"if": {"properties": {"type": {"const": tag}}}, "then": schema}
            for tag, schema in variants.items()
        ],
    }


# ------------------------------------------------------------ chat and completions

COMPLETION_USAGE = obj(  # CompletionUsage
    ("prompt_tokens", "completion_tokens", "total_tokens"),
    prompt_tokens=INTEGER,
    completion_tokens=INTEGER,
    total_tokens=INTEGER,
    prompt_tokens_details=obj(cached_tokens=INTEGER, cache_write_tokens=INTEGER),
    completion_tokens_details=obj(reasoning_tokens=INTEGER),
)
_TOP_LOGPROB = obj(
    ("token", "logprob", "bytes"), token=STRING, logprob=NUMBER, bytes=nullable(array(INTEGER))
)
TOKEN_LOGPROB = obj(  # ChatCompletionTokenLogprob
    ("token", "logprob", "bytes", "top_logprobs"),
    token=STRING,
    logprob=NUMBER,
    bytes=nullable(array(INTEGER)),
    top_logprobs=array(_TOP_LOGPROB),
)
CHAT_LOGPROBS = nullable(
    obj(
        ("content", "refusal"),
        content=nullable(array(TOKEN_LOGPROB)),
        refusal=nullable(array(TOKEN_LOGPROB)),
    )
)
TOOL_CALL = obj(  # ChatCompletionMessageToolCall
    ("id", "type", "function"),
    id=STRING,
    type=enum("function"),
    function=obj(("name", "arguments"), name=STRING, arguments=STRING),
)
CHAT_MESSAGE = obj(  # ChatCompletionResponseMessage
    ("role", "content", "refusal"),
    role=enum("assistant"),
    content=nullable(STRING),
    refusal=nullable(STRING),
    tool_calls=array(TOOL_CALL),
)
CHAT_FINISH = enum("stop", "length", "tool_calls", "content_filter", "function_call")
SERVICE_TIER = nullable(enum("auto", "default", "flex", "scale", "priority", "fast"))
_ENVELOPE = ("choices", "created", "id", "model", "object")
_ENVELOPE_TYPES = {
    "id": STRING,
    "created": INTEGER,
    "model": STRING,
    "system_fingerprint": STRING,  # deprecated, optional, never null
    "service_tier": SERVICE_TIER,
}

CHAT_COMPLETION = obj(  # CreateChatCompletionResponse
    _ENVELOPE,
    **_ENVELOPE_TYPES,
    object=enum("chat.completion"),
    usage=COMPLETION_USAGE,
    choices=array(
        obj(
            ("finish_reason", "index", "message", "logprobs"),
            finish_reason=CHAT_FINISH,
            index=INTEGER,
            message=CHAT_MESSAGE,
            logprobs=CHAT_LOGPROBS,
        )
    ),
)
TOOL_CALL_CHUNK = obj(  # ChatCompletionMessageToolCallChunk
    ("index",),
    index=INTEGER,
    id=STRING,
    type=enum("function"),
    function=obj(name=STRING, arguments=STRING),
)
CHAT_DELTA = obj(  # ChatCompletionStreamResponseDelta
    content=nullable(STRING),
    refusal=nullable(STRING),
    role=enum("developer", "system", "user", "assistant", "tool"),
    tool_calls=array(TOOL_CALL_CHUNK),
)
CHAT_CHUNK = obj(  # CreateChatCompletionStreamResponse
    _ENVELOPE,
    **_ENVELOPE_TYPES,
    object=enum("chat.completion.chunk"),
    usage=nullable(COMPLETION_USAGE),
    choices=array(
        obj(
            ("delta", "finish_reason", "index"),
            delta=CHAT_DELTA,
            finish_reason=nullable(CHAT_FINISH),
            index=INTEGER,
            logprobs=CHAT_LOGPROBS,
        )
    ),
)
LEGACY_LOGPROBS = nullable(
    obj(
        text_offset=array(INTEGER),
        token_logprobs=array(NUMBER),
        tokens=array(STRING),
        top_logprobs=array({"type": "object", "additionalProperties": NUMBER}),
    )
)
TEXT_FINISH = enum("stop", "length", "content_filter")


def _completion(finish_reason: dict) -> dict:
    return obj(  # CreateCompletionResponse
        _ENVELOPE,
        **_ENVELOPE_TYPES,
        object=enum("text_completion"),
        usage=COMPLETION_USAGE,
        choices=array(
            obj(
                ("finish_reason", "index", "logprobs", "text"),
                finish_reason=finish_reason,
                index=INTEGER,
                logprobs=LEGACY_LOGPROBS,
                text=STRING,
            )
        ),
    )


COMPLETION = _completion(TEXT_FINISH)
# OpenAI streams legacy completions as CreateCompletionResponse objects with finish_reason
# null until the last; the document has no schema of its own for them.
COMPLETION_CHUNK = _completion(nullable(TEXT_FINISH))
ERROR_BODY = obj(  # ErrorResponse
    ("error",),
    error=obj(
        ("type", "message", "param", "code"),
        type=STRING,
        message=STRING,
        param=nullable(STRING),
        code=nullable(STRING),
    ),
)

# ------------------------------------------------------------ responses

ITEM_STATUS = enum("in_progress", "completed", "incomplete")
OUTPUT_TEXT = obj(  # OutputTextContent
    ("type", "text", "annotations", "logprobs"),
    type=enum("output_text"),
    text=STRING,
    annotations=array({"type": "object"}),
    logprobs=array({"type": "object"}),
)
REASONING_TEXT = obj(("type", "text"), type=enum("reasoning_text"), text=STRING)
OUTPUT_CONTENT = tagged(
    output_text=OUTPUT_TEXT,
    reasoning_text=REASONING_TEXT,  # OutputContent
    refusal=obj(("type", "refusal"), refusal=STRING, type=STRING),
)
OUTPUT_MESSAGE = obj(  # OutputMessage
    ("id", "type", "role", "content", "status"),
    id=STRING,
    type=enum("message"),
    role=enum("assistant"),
    content=array(OUTPUT_CONTENT),
    status=ITEM_STATUS,
)
FUNCTION_CALL = obj(  # FunctionToolCall
    ("type", "call_id", "name", "arguments"),
    id=STRING,
    type=enum("function_call"),
    call_id=STRING,
    name=STRING,
    arguments=STRING,
    status=ITEM_STATUS,
)
REASONING_ITEM = obj(  # ReasoningItem
    ("id", "summary", "type"),
    id=STRING,
    type=enum("reasoning"),
    summary=array(obj(("type", "text"), type=enum("summary_text"), text=STRING)),
    content=array(REASONING_TEXT),
    encrypted_content=nullable(STRING),
    status=ITEM_STATUS,
)
OUTPUT_ITEM = tagged(message=OUTPUT_MESSAGE, function_call=FUNCTION_CALL, reasoning=REASONING_ITEM)
RESPONSE_USAGE = obj(  # ResponseUsage
    (
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    ),
    input_tokens=INTEGER,
    input_tokens_details=obj(
        ("cached_tokens", "cache_write_tokens"), cached_tokens=INTEGER, cache_write_tokens=INTEGER
    ),
    output_tokens=INTEGER,
    output_tokens_details=obj(("reasoning_tokens",), reasoning_tokens=INTEGER),
    total_tokens=INTEGER,
)
RESPONSE_ERROR_CODES = ("server_error", "rate_limit_exceeded", "invalid_prompt")  # of 20
FUNCTION_TOOL = obj(  # FunctionTool
    ("type", "name", "strict", "parameters"),
    type=enum("function"),
    name=STRING,
    strict=nullable(BOOLEAN),
    parameters=nullable({"type": "object"}),
)
TOOL_CHOICE = {"anyOf": [enum("none", "auto", "required"), obj(("type",), type=STRING)]}
RESPONSE = obj(  # Response (ModelResponseProperties + ResponseProperties + its own)
    (
        "id",
        "object",
        "created_at",
        "error",
        "incomplete_details",
        "instructions",
        "model",
        "tools",
        "output",
        "parallel_tool_calls",
        "metadata",
        "tool_choice",
        "temperature",
        "top_p",
    ),
    id=STRING,
    object=enum("response"),
    created_at=NUMBER,
    status=enum("completed", "failed", "in_progress", "cancelled", "queued", "incomplete"),
    error=nullable(obj(("code", "message"), code=enum(*RESPONSE_ERROR_CODES), message=STRING)),
    incomplete_details=nullable(obj(reason=enum("max_output_tokens", "content_filter"))),
    instructions=nullable({"anyOf": [STRING, array({"type": "object"})]}),
    model=STRING,
    tools=array(tagged(function=FUNCTION_TOOL)),
    output=array(OUTPUT_ITEM),
    parallel_tool_calls=BOOLEAN,
    metadata=nullable({"type": "object", "additionalProperties": STRING}),
    tool_choice=TOOL_CHOICE,
    temperature=nullable(NUMBER),
    top_p=nullable(NUMBER),
    usage=RESPONSE_USAGE,  # optional, never null
    user=STRING,  # deprecated, optional, never null
    safety_identifier=nullable(STRING),
    prompt_cache_key=nullable(STRING),
    previous_response_id=nullable(STRING),
    background=nullable(BOOLEAN),
    max_output_tokens=nullable(INTEGER),
    truncation=nullable(enum("auto", "disabled")),
    service_tier=nullable(
        enum("auto", "default", "flex", "scale", "priority", "fast", "ultrafast")
    ),
    reasoning=nullable(
        obj(effort=nullable(STRING), summary=nullable(enum("auto", "concise", "detailed")))
    ),
    text=obj(format=obj(("type",), type=enum("text", "json_schema", "json_object"))),
)
_AT_ITEM = {"item_id": STRING, "output_index": INTEGER}
_AT_PART = {**_AT_ITEM, "content_index": INTEGER}


def _event(*required: str, **properties: dict) -> dict:
    """An event's schema; its `type` is set below, from its name in STREAM_EVENTS."""
    return obj(
        (*required, "type", "sequence_number"), type=STRING, sequence_number=INTEGER, **properties
    )


_WITH_RESPONSE = _event("response", response=RESPONSE)
STREAM_EVENTS = {  # ResponseStreamEvent, the variants we send
    "response.created": _WITH_RESPONSE,
    "response.in_progress": _WITH_RESPONSE,
    "response.completed": _WITH_RESPONSE,
    "response.incomplete": _WITH_RESPONSE,
    "response.failed": _WITH_RESPONSE,
    "response.output_item.added": _event(
        "output_index", "item", output_index=INTEGER, item=OUTPUT_ITEM
    ),
    "response.output_item.done": _event(
        "output_index", "item", output_index=INTEGER, item=OUTPUT_ITEM
    ),
    "response.content_part.added": _event(*_AT_PART, "part", **_AT_PART, part=OUTPUT_CONTENT),
    "response.content_part.done": _event(*_AT_PART, "part", **_AT_PART, part=OUTPUT_CONTENT),
    "response.output_text.delta": _event(
        *_AT_PART, "delta", "logprobs", **_AT_PART, delta=STRING, logprobs=array({"type": "object"})
    ),
    "response.output_text.done": _event(
        *_AT_PART, "text", "logprobs", **_AT_PART, text=STRING, logprobs=array({"type": "object"})
    ),
    "response.reasoning_text.delta": _event(*_AT_PART, "delta", **_AT_PART, delta=STRING),
    "response.reasoning_text.done": _event(*_AT_PART, "text", **_AT_PART, text=STRING),
    "response.function_call_arguments.delta": _event(*_AT_ITEM, "delta", **_AT_ITEM, delta=STRING),
    "response.function_call_arguments.done": _event(
        *_AT_ITEM, "name", "arguments", **_AT_ITEM, name=STRING, arguments=STRING
    ),
    "error": _event(
        "code", "message", "param", code=nullable(STRING), message=STRING, param=nullable(STRING)
    ),
}


STREAM_EVENTS = {
    name: schema | {"properties": schema["properties"] | {"type": enum(name)}}
    for name, schema in STREAM_EVENTS.items()
}


def violations(instance, schema: dict) -> list[str]:
    """Every place `instance` breaks `schema`, as 'path: message' (empty when it conforms)."""
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    ]


def event_violations(event: dict) -> list[str]:
    """A Responses stream event checked against the schema of its `type`."""
    schema = STREAM_EVENTS.get(event.get("type"))
    if schema is None:
        return [f"unknown event type {event.get('type')!r}"]
    return violations(event, schema)


# ------------------------------------------------------------ requests

# Every property of the request bodies (CreateChatCompletionRequest, CreateCompletionRequest,
# CreateResponse, their allOf parts included): fields a generated client may send, as null
# when unset.
REQUEST_FIELDS = {
    "/v1/chat/completions": frozenset(
        [
            "audio",
            "frequency_penalty",
            "function_call",
            "functions",
            "logit_bias",
            "logprobs",
            "max_completion_tokens",
            "max_tokens",
            "messages",
            "metadata",
            "modalities",
            "model",
            "moderation",
            "n",
            "parallel_tool_calls",
            "prediction",
            "presence_penalty",
            "prompt_cache_key",
            "prompt_cache_options",
            "prompt_cache_retention",
            "reasoning_effort",
            "response_format",
            "safety_identifier",
            "seed",
            "service_tier",
            "stop",
            "store",
            "stream",
            "stream_options",
            "temperature",
            "tool_choice",
            "tools",
            "top_logprobs",
            "top_p",
            "user",
            "verbosity",
            "web_search_options",
        ]
    ),
    "/v1/completions": frozenset(
        [
            "best_of",
            "echo",
            "frequency_penalty",
            "logit_bias",
            "logprobs",
            "max_tokens",
            "model",
            "n",
            "presence_penalty",
            "prompt",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "suffix",
            "temperature",
            "top_p",
            "user",
        ]
    ),
    "/v1/responses": frozenset(
        [
            "background",
            "context_management",
            "conversation",
            "include",
            "input",
            "instructions",
            "max_output_tokens",
            "max_tool_calls",
            "metadata",
            "model",
            "moderation",
            "parallel_tool_calls",
            "previous_response_id",
            "prompt",
            "prompt_cache_key",
            "prompt_cache_options",
            "prompt_cache_retention",
            "reasoning",
            "safety_identifier",
            "service_tier",
            "store",
            "stream",
            "stream_options",
            "temperature",
            "text",
            "tool_choice",
            "tools",
            "top_logprobs",
            "top_p",
            "truncation",
            "user",
        ]
    ),
}
