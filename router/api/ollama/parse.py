"""Ollama API requests (/api/chat, /api/generate) -> the GenerationRequest every API shares.

An Ollama body is checked here, its messages turned into OpenAI's normalised chat messages
(router/chat/tools.py) and rendered by the model's chat template (router/chat/prompt.py), so
templates, tool dialects, reasoning and images work as on the other APIs. Every field Ollama
defines is honoured, refused with a 400 naming it, or a documented no-op (docs/api.md,
"Ollama API"); a field Ollama does not define is a 400 as on every endpoint.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from router.api.checks import completion_budget, refuse_unknown_fields, typed_field
from router.api.openai.sampling import ANY_JSON_OBJECT, schema_grammar
from router.api.request import GenerationRequest, chat_prompt_fields
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.prompt import build_chat_prompt
from router.chat.tool_grammar import enforce_tool_choice
from router.chat.tools import chat_messages, parse_tools
from router.errors import bad_request
from shared.sampling import InvalidRequest, SamplingParams

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer

CHAT_PATH, GENERATE_PATH = "/api/chat", "/api/generate"
COMMON_FIELDS = frozenset({"model", "format", "options", "stream", "keep_alive", "think"})
CHAT_FIELDS = COMMON_FIELDS | {"messages", "tools"}
GENERATE_FIELDS = COMMON_FIELDS | {"prompt", "system", "images", "raw"}
GENERATE_FIELDS |= {"suffix", "template", "context"}  # refused unless empty (_refuse_unsupported)
# `options` honoured: each maps to a SamplingParams field as the OpenAI path's do
SAMPLING_OPTIONS = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "seed": ("seed", int),
    "repeat_penalty": ("repetition_penalty", float),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
}
BUDGET_OPTIONS = frozenset({"num_predict", "num_ctx", "stop"})
# How llama.cpp runs on one machine: nothing to choose here (documented no-ops, still typed)
HARDWARE_OPTIONS = {
    "num_gpu": int,
    "main_gpu": int,
    "num_thread": int,
    "num_batch": int,
    "use_mmap": bool,
    "use_mlock": bool,
    "numa": bool,
    "low_vram": bool,
}
OPTIONS = frozenset(SAMPLING_OPTIONS) | BUDGET_OPTIONS | frozenset(HARDWARE_OPTIONS)
THINK_LEVELS = ("low", "medium", "high")  # gpt-oss's reasoning effort, Ollama's `think`
IMAGE_URL_HEAD = "data:;base64,"  # Ollama's images are bare base64; the type is read from bytes


def parse_chat(
    body: dict,
    tokenizer: ModelTokenizer,
    model_id: str,
    max_tokens_cap: int | None = None,
    images: PromptImages = NO_IMAGES,
) -> GenerationRequest:
    refuse_unknown_fields(body, CHAT_FIELDS, CHAT_PATH)
    messages = chat_messages({"messages": openai_messages(body.get("messages"))})
    return _chat_request(body, messages, tokenizer, model_id, max_tokens_cap, images)


def parse_generate(
    body: dict,
    tokenizer: ModelTokenizer,
    model_id: str,
    max_tokens_cap: int | None = None,
    images: PromptImages = NO_IMAGES,
) -> GenerationRequest:
    refuse_unknown_fields(body, GENERATE_FIELDS, GENERATE_PATH)
    _refuse_unsupported(body)
    prompt = typed_field(body, "prompt", str, "")
    if typed_field(body, "raw", bool, False):
        return _raw_request(body, prompt, tokenizer, model_id, max_tokens_cap)
    system = typed_field(body, "system", str, None)
    turn = {"role": "user", "content": prompt, "images": body.get("images")}
    turns = ([{"role": "system", "content": system}] if system else []) + [turn]
    messages = chat_messages({"messages": openai_messages(turns, "images")})
    return _chat_request(body, messages, tokenizer, model_id, max_tokens_cap, images)


def _refuse_unsupported(body: dict) -> None:
    """`suffix` (fill-in-the-middle), `template` (a per-request template) and `context` (the
    token state of an earlier /api/generate, which we do not return) are not served."""
    reasons = {
        "suffix": "fill-in-the-middle is not supported",
        "template": "the model's own chat template is used; send 'raw': true to skip it",
        "context": "earlier replies' 'context' is not returned nor read; send the text",
    }
    for name, why in reasons.items():
        if body.get(name) not in (None, "", []):
            raise bad_request(f"'{name}': {why}", name)


def _chat_request(body, messages, tokenizer, model_id, cap, images) -> GenerationRequest:
    tools = parse_tools({"tools": _tools(body)})
    prompt = build_chat_prompt(messages, tools, tokenizer, _think_kwargs(body), images=images)
    sampling, stop = _sampling(body, len(prompt.wire_ids), tokenizer, cap)
    return GenerationRequest(
        "chat",
        model_id,
        tuple(prompt.wire_ids),
        enforce_tool_choice(sampling, tools, prompt, tokenizer),
        stop,
        True,  # always streamed inside: the reply measures its own timings (adapter.py)
        False,
        **chat_prompt_fields(prompt),
    )


def _raw_request(body, prompt: str, tokenizer, model_id, cap) -> GenerationRequest:
    """`raw`: the prompt as text, no template (images need the template: refused)."""
    if body.get("images"):
        raise bad_request("'images' need the chat template; they are refused with 'raw'", "images")
    if body.get("system"):
        raise bad_request("'system' needs the chat template; it is refused with 'raw'", "system")
    ids = tokenizer.encode_prompt(prompt)
    if not ids:
        raise bad_request("'prompt' must not be empty with 'raw'", "prompt")
    sampling, stop = _sampling(body, len(ids), tokenizer, cap, tokenizer.eos_token_ids)
    return GenerationRequest("text", model_id, tuple(ids), sampling, stop, True, False)


def stream_of(body: dict) -> bool:
    """Ollama streams unless `stream` is false."""
    return typed_field(body, "stream", bool, True)


# ------------------------------------------------------------ options


def options_of(body: dict) -> dict:
    options = typed_field(body, "options", dict, {})
    # null is absent, as for every option here (LangChain sends each one it knows, most null)
    unknown = sorted(k for k, v in options.items() if v is not None and k not in OPTIONS)
    if unknown:
        raise bad_request(
            f"'options.{unknown[0]}' is not supported (docs/api.md lists the options served)",
            f"options.{unknown[0]}",
        )
    for name, kind in HARDWARE_OPTIONS.items():
        _option(options, name, kind, None)
    return options


def _option(options: dict, name: str, kind: type, default):
    """options[name] checked against `kind` (null counts as absent; ints pass as floats)."""
    value = options.get(name)
    if value is None:
        return default
    if kind is float and type(value) in (int, float):
        return float(value)
    if type(value) is not kind:
        raise bad_request(f"'options.{name}' must be {_KINDS[kind]}", f"options.{name}")
    return value


_KINDS = {int: "an integer", float: "a number", bool: "a boolean"}


def _sampling(
    body: dict, prompt_len: int, tokenizer: ModelTokenizer, cap, stop_ids=None
) -> tuple[SamplingParams, tuple[str, ...]]:
    options = options_of(body)
    num_ctx = _option(options, "num_ctx", int, None)
    if num_ctx is not None and num_ctx > tokenizer.context_length:
        raise bad_request(
            f"'options.num_ctx' is {num_ctx}, above the model's context of "
            f"{tokenizer.context_length} tokens",
            "options.num_ctx",
        )
    max_tokens = _num_predict(options)
    max_tokens = completion_budget(prompt_len, max_tokens, tokenizer.context_length, cap)
    fields = {
        field: _option(options, name, kind, None)
        for name, (field, kind) in SAMPLING_OPTIONS.items()
        if options.get(name) is not None
    }
    grammar = format_grammar(body.get("format"))
    fields.setdefault("temperature", 1.0)  # the OpenAI path's default (docs/api.md)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=tuple(stop_ids or tokenizer.chat_stop_token_ids),
        **fields,
        **({"grammar": grammar} if grammar is not None else {}),
    )
    try:
        sampling.validate()
    except InvalidRequest as e:
        name = str(e).split(" ", 1)[0]
        raise bad_request(f"options: {e}", f"options.{name}") from None
    return sampling, _stop(options)


def _num_predict(options: dict) -> int | None:
    """Ollama's -1 (until the context is full) and -2 (fill the context) both mean no
    limit but the context; 0 and other negatives are refused."""
    value = _option(options, "num_predict", int, None)
    if value in (None, -1, -2):
        return None
    if value < 1:
        raise bad_request(
            "'options.num_predict' must be a positive integer, -1 or -2", "options.num_predict"
        )
    return value


def _stop(options: dict) -> tuple[str, ...]:
    stop = options.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad_request("'options.stop' must be an array of strings", "options.stop")
    return tuple(s for s in stop if s)


def format_grammar(value):
    """`format`: "json" (any JSON object) or a JSON schema, through the grammar the worker
    enforces (as OpenAI's response_format); "" or null: free text."""
    if value in (None, ""):
        return None
    if value == "json":
        return schema_grammar(ANY_JSON_OBJECT, "format")
    if isinstance(value, dict):
        return schema_grammar(json.dumps(value), "format")
    raise bad_request("'format' must be \"json\" or a JSON schema object", "format")


def _think_kwargs(body: dict) -> dict:
    """`think`: true / false turns the template's thinking on or off (enable_thinking, as
    Qwen's and others' templates read it); "low" / "medium" / "high" is gpt-oss's effort."""
    think = body.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in THINK_LEVELS:
        return {"reasoning_effort": think}
    raise bad_request(f"'think' must be a boolean or one of {', '.join(THINK_LEVELS)}", "think")


# ------------------------------------------------------------ messages and tools


def _tools(body: dict) -> list | None:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    return tools or None


def openai_messages(messages, key: str = "messages") -> list[dict]:
    """Ollama's messages in OpenAI's shape: `images` (base64) become image parts after the
    text, `thinking` becomes `reasoning`, a call's arguments stay an object, and a tool
    result is matched to its call by `tool_name` (else by order)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    calls: list[tuple[str, str]] = []  # (call id, function name) of the last assistant turn
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{param} must be an object", param)
        converted = _message(message, param, key)
        if converted["role"] == "assistant":
            calls = [(c["id"], c["function"]["name"]) for c in converted.get("tool_calls", [])]
        elif converted["role"] == "tool":
            converted["tool_call_id"] = _call_id(message, calls, param)
        out.append(converted)
    return out


def _message(message: dict, param: str, key: str) -> dict:
    known = {"role", "content", "images", "tool_calls", "thinking", "tool_name", "tool_call_id"}
    extra = sorted(message.keys() - known)
    if extra:
        raise bad_request(f"{param}.{extra[0]} is not a message field", f"{param}.{extra[0]}")
    out = {"role": message.get("role"), "content": message.get("content") or ""}
    images = image_parts(message, param if key == "messages" else "images")
    if images:
        out["content"] = [{"type": "text", "text": out["content"]}, *images]
    if message.get("thinking"):
        out["reasoning"] = message["thinking"]
    if message.get("tool_calls"):
        out["tool_calls"] = _history_calls(message["tool_calls"], param)
    return out


def image_parts(message: dict, param: str) -> list[dict]:
    """A message's base64 `images` as OpenAI image parts (the same text, so the same image
    key, whether read before parsing by adapter.image_parts or here)."""
    images = message.get("images")
    if images is None:
        return []
    if not (isinstance(images, list) and all(isinstance(b, str) for b in images)):
        raise bad_request(f"{param}.images must be an array of base64 strings", param)
    return [{"type": "image_url", "image_url": {"url": IMAGE_URL_HEAD + b}} for b in images]


def _history_calls(calls, param: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(f"{param}.tool_calls must be an array", f"{param}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            where = f"{param}.tool_calls[{j}]"
            raise bad_request(f"{where} must be {{'function': {{name, arguments}}}}", where)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{j}"
        function = {"name": fn.get("name"), "arguments": fn.get("arguments", {})}
        out.append({"id": call_id, "type": "function", "function": function})
    return out


def _call_id(message: dict, calls: list[tuple[str, str]], param: str) -> str:
    """The id of the call a tool message answers: its `tool_call_id`, else by its
    `tool_name`, else the first not yet answered."""
    if isinstance(message.get("tool_call_id"), str):  # LangChain's ChatOllama sends it
        return message["tool_call_id"]
    name = message.get("tool_name")
    for k, (call_id, fn) in enumerate(calls):
        if name is None or fn == name:
            del calls[k]
            return call_id
    if name is not None:
        return f"call_{name}"
    raise bad_request(
        f"{param}: a tool message must follow an assistant message with tool_calls", param
    )
