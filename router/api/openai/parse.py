"""Validation at the edge: an OpenAI request body -> a GenerationRequest, or an ApiError."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from router.api.checks import (
    completion_budget,
    refuse_unknown_fields,
    retention_pins,
    typed_field,
)
from router.api.openai.extensions import extensions
from router.api.openai.fields import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    check_chat_fields,
    check_honoured_values,
)
from router.api.openai.sampling import echo_of, sampling_fields
from router.api.request import GenerationRequest, chat_prompt_fields
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.prompt import build_chat_prompt, template_kwargs
from router.chat.tool_grammar import enforce_tool_choice
from router.chat.tools import chat_messages, parse_tools
from router.errors import bad_request
from shared.sampling import InvalidRequest, SamplingParams

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer

MAX_STOP_STRINGS = 4


def parse_chat(
    body: dict,
    tokenizer: ModelTokenizer,
    model_id: str,
    max_tokens_cap: int | None = None,
    images: PromptImages = NO_IMAGES,
) -> GenerationRequest:
    refuse_unknown_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    check_chat_fields(body)
    tools = parse_tools(body)
    messages, kwargs = chat_messages(body), template_kwargs(body)
    prompt = build_chat_prompt(messages, tools, tokenizer, kwargs, images=images)
    if prompt.images and body.get("prompt_logprobs") is not None:
        raise bad_request(
            "'prompt_logprobs' is not available for a prompt with images", "prompt_logprobs"
        )
    max_tokens = typed_field(body, "max_completion_tokens", int, None)
    if max_tokens is None:
        max_tokens = typed_field(body, "max_tokens", int, None)
    req = _build(
        "chat",
        body,
        model_id,
        prompt.wire_ids,
        max_tokens,
        max_tokens_cap,
        tokenizer,
        tokenizer.chat_stop_token_ids,
    )
    return replace(
        req,
        sampling=enforce_tool_choice(req.sampling, tools, prompt, tokenizer),
        **chat_prompt_fields(prompt),
        pins=retention_pins(body, len(prompt.wire_ids)),
    )


def parse_completion(
    body: dict,
    tokenizer: ModelTokenizer,
    model_id: str,
    max_tokens_cap: int | None = None,
    images: PromptImages = NO_IMAGES,  # a text prompt holds none (for the adapter's call)
) -> GenerationRequest:
    refuse_unknown_fields(body, COMPLETION_FIELDS, "/v1/completions")
    prompts = _completion_prompts(body, tokenizer)
    max_tokens = typed_field(body, "max_tokens", int, 16)  # OpenAI's default for completions
    req = _build(
        "text",
        body,
        model_id,
        prompts[0],
        max_tokens,
        max_tokens_cap,
        tokenizer,
        tokenizer.eos_token_ids,
    )
    if echo_of(body):
        req = replace(req, echo_text=_echo_text(body, prompts, tokenizer))
    if len(prompts) == 1:
        return req
    budget = max(req.sampling.max_tokens, 1)  # 1 where the prompt is only scored
    for ids in prompts[1:]:  # each prompt must leave room for the same completion budget
        completion_budget(len(ids), budget, tokenizer.context_length, None)
    return replace(req, batch=tuple(tuple(ids) for ids in prompts))


def _echo_text(body: dict, prompts: list[list[int]], tokenizer: ModelTokenizer) -> str:
    """The prompt as `echo` shows it: the string sent, or the decoded token ids."""
    if len(prompts) > 1:
        raise bad_request("'echo' takes one prompt; send several prompts as requests", "echo")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompts[0])


def _build(
    kind, body, model_id, prompt_ids, max_tokens, cap, tokenizer, stop_ids
) -> GenerationRequest:
    check_honoured_values(body)
    prompt_ids = tuple(prompt_ids)
    # max_tokens 0 on completions scores the prompt only (echo, prompt_logprobs)
    scores_only = max_tokens == 0 and kind == "text" and _scores_prompt(body)
    max_tokens = completion_budget(
        len(prompt_ids), 1 if scores_only else max_tokens, tokenizer.context_length, cap
    )
    max_tokens = 0 if scores_only else max_tokens
    ext = extensions(body, stop_ids, tokenizer.vocab_size, max_tokens)
    sampling = SamplingParams(
        temperature=typed_field(body, "temperature", float, 1.0),
        top_p=typed_field(body, "top_p", float, 1.0),
        top_k=typed_field(body, "top_k", int, 0),
        min_p=typed_field(body, "min_p", float, 0.0),
        max_tokens=max_tokens,
        stop_token_ids=ext.stop_token_ids,
        min_tokens=ext.min_tokens,
        seed=typed_field(body, "seed", int, None),
        **sampling_fields(body, kind, tokenizer.vocab_size),
    )
    try:
        sampling.validate()
    except InvalidRequest as e:
        raise bad_request(str(e), _param_of(str(e))) from None
    stream = typed_field(body, "stream", bool, False)
    return GenerationRequest(
        kind,
        model_id,
        prompt_ids,
        sampling,
        _stop_strings(body),
        stream,
        _include_usage(body, stream),
        _choices(body),
        prompt_logprobs=body.get("prompt_logprobs"),
        include_stop_str=ext.include_stop_str,
        skip_special_tokens=ext.skip_special_tokens,
        cache_key=typed_field(body, "prompt_cache_key", str, None),
    )


def _scores_prompt(body: dict) -> bool:
    return echo_of(body) or body.get("prompt_logprobs") is not None


MAX_CHOICES = 16


def _choices(body: dict) -> int:
    n = typed_field(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be between 1 and {MAX_CHOICES}, got {n}", "n")
    return n


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad_request("'stop' must be a string or an array of strings", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' may hold at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(s for s in stop if s)


def _include_usage(body: dict, stream: bool) -> bool:
    options = typed_field(body, "stream_options", dict, None)
    if options is None:
        return False
    if not stream:
        raise bad_request(
            "'stream_options' is only allowed when 'stream' is true", "stream_options"
        )
    return typed_field(options, "include_usage", bool, False)


def _param_of(message: str) -> str | None:
    return message.split(" ", 1)[0] if message else None


# ------------------------------------------------------------ prompts


MAX_PROMPTS = 64  # prompts in one /v1/completions request (each with n choices)


def _completion_prompts(body: dict, tokenizer: ModelTokenizer) -> list[list[int]]:
    """The token ids of each prompt: a string, token ids, or an array of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise bad_request(f"'prompt' may hold at most {MAX_PROMPTS} prompts", "prompt")
        return [_one_prompt(p, tokenizer) for p in prompt]
    return [_one_prompt(prompt, tokenizer)]


def _one_prompt(prompt, tokenizer: ModelTokenizer) -> list[int]:
    if isinstance(prompt, str):
        ids = tokenizer.encode_prompt(prompt)
    elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if not all(0 <= t < tokenizer.vocab_size for t in prompt):
            raise bad_request("'prompt' holds a token id outside the vocabulary", "prompt")
        ids = prompt
    else:
        raise bad_request(
            "'prompt' must be a string, an array of token ids, or an array of either",
            "prompt",
        )
    if not ids:
        raise bad_request("'prompt' must not be empty", "prompt")
    return ids
