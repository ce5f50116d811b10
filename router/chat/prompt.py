"""A chat request's prompt: messages + tools + template kwargs through the chat template.

Shared by /v1/chat/completions and /v1/messages (which converts its body to the same
normalised messages first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.chat.dialects import Dialect, detect_dialect
from router.chat.history import family_tool_prompt, history_for, probe_arguments
from router.chat.images.placement import (
    NO_IMAGES,
    PromptImages,
    count_marks,
    key_image_tokens,
    place_images,
)
from router.chat.tools import ToolSet, fallback_messages
from router.errors import bad_request
from shared.protocol import ImageInput

if TYPE_CHECKING:
    from router.text.tokenizer import ModelTokenizer

_RESERVED_KWARGS = {"messages", "tools", "add_generation_prompt", "tokenize", "conversation"}
_MENTIONS_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True)
class ChatPrompt:
    token_ids: list[int]  # the real ids (what /tokenize shows, what the context counts)
    tools: ToolSet | None
    tool_family: str | None  # the parser for calls in the reply; None when tools are off
    starts_in_reasoning: bool  # the template opened a reasoning block for the model
    # with images: the ids sent and hashed (image keys at the image positions), and the
    # images in prompt order (router/chat/images/placement.py)
    keyed_ids: list[int] | None = None
    images: tuple[ImageInput, ...] = ()
    dialect: Dialect | None = None  # how the reply is read (router/chat/dialects)
    # per-request metadata taken out of system messages (router/text/volatile.py)
    volatile_removed: int = 0
    # per cut given (cache breakpoints): the prompt tokens up to where it ends
    cut_tokens: tuple[int, ...] = ()

    @property
    def wire_ids(self) -> list[int]:
        return self.token_ids if self.keyed_ids is None else self.keyed_ids


def template_supports_tools(tokenizer: ModelTokenizer) -> bool:
    return bool(_MENTIONS_TOOLS.search(tokenizer.template_source))


def dialect_of(tokenizer: ModelTokenizer) -> Dialect:
    """The model's dialect: set at load (router/lifecycle.py), else detected now (tests)."""
    if tokenizer.dialect is None:
        dialect = detect_dialect(tokenizer.template_source, tokenizer.vocab)
        tokenizer.set_dialect(probe_arguments(dialect, tokenizer))
    return tokenizer.dialect


def tool_family_of(tokenizer: ModelTokenizer, override: str | None = None) -> str:
    """The tool-call format the model writes: the operator's name, else its dialect's."""
    return override or dialect_of(tokenizer).tools


def template_kwargs(body: dict) -> dict:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    if reserved := _RESERVED_KWARGS & kwargs.keys():
        raise bad_request(
            f"'chat_template_kwargs' may not set {', '.join(sorted(reserved))}",
            "chat_template_kwargs",
        )
    return kwargs


def build_chat_prompt(
    messages: list[dict],
    tools: ToolSet | None,
    tokenizer: ModelTokenizer,
    kwargs: dict,
    *,
    add_generation_prompt: bool = True,
    add_special_tokens: bool = False,  # /tokenize's: the template usually writes its own BOS
    images: PromptImages = NO_IMAGES,  # the decoded images the messages' marks name
    cuts: Sequence[list[dict]] = (),  # the conversation cut at each cache breakpoint
) -> ChatPrompt:
    if not tokenizer.has_chat_template:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    dialect = dialect_of(tokenizer)
    has_tool_turns = any("tool_calls" in m or m["role"] == "tool" for m in messages)
    messages, removed = _template_messages(tokenizer, messages, tools, has_tool_turns)
    schemas = list(tools.functions) if tools is not None and dialect.native_tools else None
    text = _render(tokenizer, messages, schemas, kwargs, add_generation_prompt)
    family = dialect.tools if tools is not None else None
    opener = dialect.reasoning.open
    thinks = bool(opener) and text.rstrip().endswith(opener)
    marks = count_marks(messages)
    text, placed = place_images(text, marks, images, tokenizer.vision)
    # cuts (cache breakpoints) are found by text offsets; placed image marks move the text
    ends = (
        []
        if marks or add_special_tokens
        else [
            _cut_end(tokenizer, text, cut, tools, has_tool_turns, schemas, kwargs) for cut in cuts
        ]
    )
    within: list[int] = []
    if ends:  # one tokenization gives the ids and where each cut ends
        ids, within = tokenizer.encode_text_within(text, ends)
    else:
        ids = tokenizer.encode_prompt(text) if add_special_tokens else tokenizer.encode_text(text)
    keyed = key_image_tokens(ids, placed, tokenizer.vision)
    if keyed.images:
        return ChatPrompt(
            ids, tools, family, thinks, keyed.keyed_ids, keyed.images, dialect, removed
        )
    return ChatPrompt(ids, tools, family, thinks, None, (), dialect, removed, tuple(within))


def _template_messages(
    tokenizer: ModelTokenizer, messages: list[dict], tools: ToolSet | None, has_tool_turns: bool
) -> tuple[list[dict], int]:
    """The messages as the template gets them: volatile metadata out (router/text/volatile.py),
    history as the dialect keeps it, tools where the dialect writes them; and the count of
    metadata matches taken out."""
    dialect = dialect_of(tokenizer)
    messages, removed = tokenizer.volatile.scrub(messages)
    messages = history_for(dialect, messages)
    if dialect.tool_prompt is not None:  # the template renders calls and results itself
        if tools is not None:
            messages = family_tool_prompt(dialect.tool_prompt, messages, tools)
    elif not dialect.native_tools and (tools is not None or has_tool_turns):
        messages = fallback_messages(messages, tools)
    return messages, removed


def _cut_end(tokenizer, text: str, cut: list[dict], tools, has_tool_turns, schemas, kwargs):
    """Where the conversation `cut` short (ending at a cache breakpoint) stops agreeing with
    the whole prompt's `text`: a character offset (the breakpoint's end, or before it)."""
    if not cut:
        return 0
    messages, _ = _template_messages(tokenizer, cut, tools, has_tool_turns)
    try:
        shorter = tokenizer.render_chat(messages, schemas, kwargs, add_generation_prompt=False)
    except Exception:  # a template that refuses a conversation cut there (role order)
        return 0
    return _common_prefix(shorter, text)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search over C compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _render(tokenizer: ModelTokenizer, messages, schemas, kwargs, generation: bool) -> str:
    try:
        return tokenizer.render_chat(messages, schemas, kwargs, add_generation_prompt=generation)
    except Exception as e:  # Jinja raise_exception (role order...) or a kwarg of the wrong type
        raise bad_request(f"the chat template refused these messages: {e}", "messages") from None
