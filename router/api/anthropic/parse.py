"""Anthropic Messages API requests (/v1/messages) -> the same GenerationRequest as OpenAI chat.

The body is checked here, then turned into the normalised chat messages of router/chat/tools.py
(tool_use blocks become assistant tool_calls, tool_result blocks become tool messages) and
rendered by router/chat/prompt.py, so both APIs share templates, tool formats and parsers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.api.anthropic.cache_control import Breakpoints
from router.api.checks import completion_budget, refuse_unknown_fields, typed_field
from router.api.request import GenerationRequest, chat_prompt_fields
from router.chat.images.parts import image_mark, is_image_part
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.prompt import build_chat_prompt, template_kwargs
from router.chat.tool_grammar import enforce_tool_choice
from router.chat.tools import ToolSet, parse_tools
from router.errors import bad_request
from shared.protocol import CachePin
from shared.sampling import InvalidRequest, SamplingParams

if TYPE_CHECKING:
    from router.chat.prompt import ChatPrompt
    from router.text.tokenizer import ModelTokenizer

MAX_STOP_SEQUENCES = 16
_ROLES = ("user", "assistant")
# The fields /v1/messages knows (docs/api.md's table); any other is a 400 naming it.
MESSAGES_FIELDS = frozenset(
    {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p"}
    | {"top_k", "stream", "tools", "tool_choice", "chat_template_kwargs", "thinking", "metadata"}
    | {"output_config", "context_management"}  # what Claude Code sends on every turn
    | {"keep_alive"}  # placement (router/placement/): Ollama's, honoured before parsing
    | {"cache_control"}  # automatic caching: a breakpoint at the last message (router docs)
)


def parse_messages_request(
    body: dict,
    tokenizer: ModelTokenizer,
    model_id: str,
    max_tokens_cap: int | None = None,
    images: PromptImages = NO_IMAGES,
) -> GenerationRequest:
    refuse_unknown_fields(body, MESSAGES_FIELDS, "/v1/messages")
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int:
        raise bad_request("'max_tokens' is required and must be an integer", "max_tokens")
    prompt, ttls = _prompt_and_breakpoints(body, tokenizer, images)
    tools = prompt.tools
    max_tokens = completion_budget(
        len(prompt.token_ids), max_tokens, tokenizer.context_length, max_tokens_cap
    )
    stream = typed_field(body, "stream", bool, False)
    return GenerationRequest(
        "chat",
        model_id,
        tuple(prompt.wire_ids),
        enforce_tool_choice(
            _sampling(body, max_tokens, tokenizer.chat_stop_token_ids), tools, prompt, tokenizer
        ),
        _stop_sequences(body),
        stream,
        False,
        **chat_prompt_fields(prompt),
        pins=tuple(
            CachePin(tokens, ttl)
            for tokens, ttl in zip(prompt.cut_tokens, ttls, strict=True)
            if tokens > 0
        ),
        breakpoint_tokens=max(prompt.cut_tokens, default=0),
    )


def messages_prompt(
    body: dict, tokenizer: ModelTokenizer, images: PromptImages = NO_IMAGES
) -> ChatPrompt:
    """The templated prompt of a /v1/messages body (also /v1/messages/count_tokens')."""
    return _prompt_and_breakpoints(body, tokenizer, images)[0]


def _prompt_and_breakpoints(
    body: dict, tokenizer: ModelTokenizer, images: PromptImages
) -> tuple[ChatPrompt, list[float]]:
    """The prompt, with the tokens up to each cache_control breakpoint (`cut_tokens`), and
    each breakpoint's TTL in seconds, in the same order."""
    check_messages_no_ops(body)
    _check_thinking(body)
    tools = _tools(body)
    marks = Breakpoints()
    marks.tools(body.get("tools"))
    system = _system(body.get("system"), marks)
    messages = system + _messages(body.get("messages"), marks, system)
    if (top := body.get("cache_control")) is not None:  # automatic: at the last message
        marks.add(top, "cache_control", list(messages))
    prompt = build_chat_prompt(
        messages, tools, tokenizer, template_kwargs(body), images=images, cuts=marks.cuts
    )
    return prompt, marks.ttls


def check_messages_no_ops(body: dict) -> None:
    """/v1/messages' accepted no-op is still checked for its type."""
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("'metadata' must be an object", "metadata")
    config = body.get("output_config")
    if config is not None and (not isinstance(config, dict) or config.keys() - {"effort"}):
        raise bad_request(
            "'output_config' may only carry 'effort' (accepted, not adjustable)", "output_config"
        )
    edits = (
        (body.get("context_management") or {}).get("edits")
        if isinstance(body.get("context_management"), dict)
        else None
    )
    if body.get("context_management") is not None and not (
        isinstance(edits, list)
        and all(
            isinstance(e, dict) and str(e.get("type")).startswith("clear_thinking") for e in edits
        )
    ):
        raise bad_request(
            "'context_management' may only hold clear_thinking edits (earlier thinking is "
            "rendered as the chat template says); clearing tool uses is not supported",
            "context_management",
        )


def _check_thinking(body: dict) -> None:
    thinking = body.get("thinking")
    if thinking is not None and not (
        isinstance(thinking, dict) and thinking.get("type") in ("disabled", "adaptive")
    ):
        raise bad_request(
            "'thinking' budgets are not supported; reasoning models think as their template "
            "says (see chat_template_kwargs)",
            "thinking",
        )


def _sampling(body: dict, max_tokens: int, stop_ids) -> SamplingParams:
    temperature = typed_field(body, "temperature", float, 1.0)
    if not 0.0 <= temperature <= 1.0:  # Anthropic's range
        raise bad_request(f"temperature must be in [0, 1], got {temperature}", "temperature")
    sampling = SamplingParams(
        temperature=temperature,
        top_p=typed_field(body, "top_p", float, 1.0),
        top_k=typed_field(body, "top_k", int, 0),
        max_tokens=max_tokens,
        stop_token_ids=tuple(stop_ids),
    )
    try:
        sampling.validate()
    except InvalidRequest as e:
        raise bad_request(str(e), str(e).split(" ", 1)[0]) from None
    return sampling


def _stop_sequences(body: dict) -> tuple[str, ...]:
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
        raise bad_request("'stop_sequences' must be an array of strings", "stop_sequences")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(
            f"'stop_sequences' may hold at most {MAX_STOP_SEQUENCES}", "stop_sequences"
        )
    return tuple(s for s in stops if s)


# ------------------------------------------------------------ tools


def _tools(body: dict) -> ToolSet | None:
    tools = body.get("tools")
    choice = _tool_choice(body.get("tool_choice"))
    if tools is not None and not isinstance(tools, list):
        raise bad_request("'tools' must be an array", "tools")
    functions = [_function(t, i) for i, t in enumerate(tools or [])]
    return parse_tools({"tools": functions, "tool_choice": choice})


def _function(tool, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        raise bad_request(f"{param} must be a custom tool with a name and an input_schema", param)
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise bad_request(
            f"{param}.input_schema must be a JSON schema object", f"{param}.input_schema"
        )
    fn = {"name": tool.get("name"), "parameters": schema}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _tool_choice(choice):
    """Anthropic's tool_choice in OpenAI's terms (parse_tools checks the result)."""
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in ("auto", "any", "none"):
        return {"auto": "auto", "any": "required", "none": "none"}[kind]
    raise bad_request("'tool_choice' must be {\"type\": auto | any | tool | none}", "tool_choice")


# ------------------------------------------------------------ messages


def _system(system, marks: Breakpoints) -> list[dict]:
    if system is None:
        return []
    text, blocks = _text_of(system, "system", ("text",))
    for j, block in enumerate(blocks):
        if block.get("cache_control") is not None:
            upto = "".join(b["text"] for b in blocks[: j + 1] if b.get("type") == "text")
            cut = [{"role": "system", "content": upto}]
            marks.add(block["cache_control"], f"system[{j}].cache_control", cut)
    return [{"role": "system", "content": text}]


def _messages(messages, marks: Breakpoints, head: list[dict]) -> list[dict]:
    """The normalised messages; a breakpoint in one is cut after it (`head`, the system
    messages, first)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    out: list[dict] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        content = message.get("content") if isinstance(message, dict) else None
        found = marks.marks_in(content, f"{param}.content")
        out += _message(message, param)
        for mark, where in found:
            marks.add(mark, where, head + out)
    return out


def _message(message, param: str) -> list[dict]:
    """One Anthropic message as normalised chat messages."""
    if isinstance(message, dict) and message.get("role") == "system":
        # a system message mid-conversation (Claude Code's mid-conversation-system beta):
        # text only, rendered where it stands as the chat template renders system turns
        text, _ = _text_of(message.get("content"), f"{param}.content", ("text",))
        return [{"role": "system", "content": text}]
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise bad_request(
            f"{param} must be an object with role 'user', 'assistant' or 'system'", param
        )
    return _turn(message["role"], message.get("content"), param)


def _turn(role: str, content, param: str) -> list[dict]:
    allowed = ("text", "tool_result") if role == "user" else ("text", "tool_use")
    text, blocks = _text_of(content, f"{param}.content", allowed, images=role == "user")
    if role == "assistant":
        calls = [_tool_use(b, f"{param}.content") for b in blocks if b["type"] == "tool_use"]
        return [{"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {})]
    results = [_tool_result(b, f"{param}.content") for b in blocks if b["type"] == "tool_result"]
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _text_of(
    content, param: str, allowed: tuple[str, ...], images: bool = False
) -> tuple[str, list[dict]]:
    """(the text blocks joined, all blocks) of a string or an array of content blocks; an
    image block becomes its mark (router/chat/images/parts.py) where `images` are allowed
    (a user turn's own content)."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise bad_request(f"{param} must be a string or an array of content blocks", param)
    texts = []
    for j, block in enumerate(content):
        if is_image_part(block):
            texts.append(image_mark(block, f"{param}[{j}]", images))
            continue
        if not isinstance(block, dict) or block.get("type") not in allowed:
            raise bad_request(
                f"{param}[{j}]: block types allowed here: {', '.join(allowed)}", param
            )
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise bad_request(f"{param}[{j}].text must be a string", param)
            texts.append(block["text"])
    return "".join(texts), content


def _tool_use(block: dict, param: str) -> dict:
    if not (
        isinstance(block.get("id"), str)
        and isinstance(block.get("name"), str)
        and isinstance(block.get("input"), dict)
    ):
        raise bad_request(f"{param}: a tool_use block needs id, name and an input object", param)
    function = {"name": block["name"], "arguments": block["input"]}
    return {"id": block["id"], "type": "function", "function": function}


def _tool_result(block: dict, param: str) -> dict:
    if not isinstance(block.get("tool_use_id"), str):
        raise bad_request(f"{param}: a tool_result block needs a tool_use_id", param)
    content = block.get("content", "")
    text = _text_of(content, param, ("text",))[0]
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}
