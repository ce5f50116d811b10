"""The logit-processing fields of an OpenAI request body, checked and turned into
SamplingParams keywords: logprobs / top_logprobs, prompt_logprobs and echo (the prompt's own
logprobs), logit_bias, the penalties, and response_format (a grammar the worker enforces)."""

from __future__ import annotations

import json

from router.errors import bad_request
from shared.grammar import check_grammar
from shared.sampling import MAX_TOP_LOGPROBS, Grammar, InvalidRequest, LogitBias

MAX_LEGACY_LOGPROBS = 5  # /v1/completions `logprobs: int`
MAX_LOGIT_BIAS_ENTRIES = 1024
ANY_JSON_OBJECT = '{"type": "object"}'


def sampling_fields(body: dict, kind: str, vocab_size: int) -> dict:
    """SamplingParams keywords for `body` of a "chat" or "text" request; ApiError (400)
    naming the field on a bad value."""
    fields = _logprobs(body) if kind == "chat" else _legacy_logprobs(body)
    fields.update(_prompt_logprobs(body, kind, fields))
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = body.get(name)
        if value is not None:
            fields[name] = _number(value, name)
    if body.get("logit_bias") is not None:
        fields["logit_bias"] = _logit_bias(body["logit_bias"], vocab_size)
    grammar = response_format_grammar(body.get("response_format"))
    if grammar is not None:
        fields["grammar"] = grammar
    return fields


def _number(value, name: str) -> float:
    if type(value) not in (int, float):
        raise bad_request(f"'{name}' must be a number", name)
    return float(value)


def _logprobs(body: dict) -> dict:
    """Chat: `logprobs: bool`, `top_logprobs: 0..20` (which needs logprobs)."""
    logprobs = body.get("logprobs")
    if logprobs is not None and type(logprobs) is not bool:
        raise bad_request("'logprobs' must be a boolean", "logprobs")
    top = body.get("top_logprobs")
    if top is None:
        return {"logprobs": bool(logprobs)}
    if type(top) is not int or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs"
        )
    if top and not logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    return {"logprobs": bool(logprobs), "top_logprobs": top}


def _legacy_logprobs(body: dict) -> dict:
    """Completions: `logprobs: 0..5`, the number of alternatives per token."""
    value = body.get("logprobs")
    if value is None:
        return {}
    if type(value) is not int or not 0 <= value <= MAX_LEGACY_LOGPROBS:
        raise bad_request(
            f"'logprobs' must be an integer in [0, {MAX_LEGACY_LOGPROBS}]", "logprobs"
        )
    return {"logprobs": True, "top_logprobs": value}


def echo_of(body: dict) -> bool:
    """Completions' `echo`: the prompt goes before the completion (and, with `logprobs`, its
    tokens' entries before the completion's)."""
    echo = body.get("echo")
    if echo is not None and type(echo) is not bool:
        raise bad_request("'echo' must be a boolean", "echo")
    return bool(echo)


def _prompt_logprobs(body: dict, kind: str, fields: dict) -> dict:
    """What the worker scores of the prompt: vLLM's `prompt_logprobs` (0..20 alternatives per
    token) and, on completions, `echo` with `logprobs` (its count of alternatives)."""
    asked = body.get("prompt_logprobs")
    if asked is not None and (type(asked) is not int or not 0 <= asked <= MAX_TOP_LOGPROBS):
        raise bad_request(
            f"'prompt_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}]", "prompt_logprobs"
        )
    counts = [asked] if asked is not None else []
    if kind == "text" and echo_of(body) and fields.get("logprobs"):
        counts.append(fields.get("top_logprobs", 0))
    return {"prompt_logprobs": max(counts)} if counts else {}


def _logit_bias(value, vocab_size: int) -> tuple[LogitBias, ...]:
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object of token id -> bias", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(
            f"'logit_bias' may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries", "logit_bias"
        )
    entries = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias")
        token_id = int(key)
        if token_id >= vocab_size:
            raise bad_request(
                f"'logit_bias' token {token_id} is outside the vocabulary [0, {vocab_size})",
                "logit_bias",
            )
        if type(bias) not in (int, float) or not -100 <= bias <= 100:
            raise bad_request(
                f"'logit_bias' values must be numbers in [-100, 100], got {bias!r} for {key}",
                "logit_bias",
            )
        entries.append(LogitBias(token_id, float(bias)))
    return tuple(entries)


def response_format_grammar(value) -> Grammar | None:
    """The grammar `response_format` asks for (None for text); validated here, with the
    library the worker uses, so a bad schema is a 400 before dispatch."""
    if value is None:
        return None
    param = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_grammar(ANY_JSON_OBJECT, param)
    if kind != "json_schema":
        raise bad_request(
            "'response_format.type' must be one of 'text', 'json_object', 'json_schema'", param
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("'response_format.json_schema' must be an object", param)
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("'response_format.json_schema.name' must be a non-empty string", param)
    strict = spec.get("strict")
    if strict is not None and type(strict) is not bool:
        raise bad_request("'response_format.json_schema.strict' must be a boolean", param)
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise bad_request("'response_format.json_schema.schema' must be an object", param)
    return schema_grammar(json.dumps(schema), param)


def schema_grammar(schema_json: str, param: str) -> Grammar:
    """A json_schema Grammar, checked (the hook for tool-call schemas too)."""
    grammar = Grammar("json_schema", schema_json)
    try:
        check_grammar(grammar)
    except InvalidRequest as e:
        raise bad_request(str(e), param) from None
    return grammar
