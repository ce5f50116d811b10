"""A chat request's prompt: messages + tools + template kwargs through the chat template.

Shared by /v1/chat/completions and /v1/messages (which converts its body to the same
normalised messages first).
"""

from __future__ import annotations

import re
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
) -> ChatPrompt:
    if not tokenizer.has_chat_template:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    dialect = dialect_of(tokenizer)
    has_tool_turns = any("tool_calls" in m or m["role"] == "tool" for m in messages)
    messages = history_for(dialect, messages)
    if dialect.tool_prompt is not None:  # the template renders calls and results itself
        if tools is not None:
            messages = family_tool_prompt(dialect.tool_prompt, messages, tools)
    elif not dialect.native_tools and (tools is not None or has_tool_turns):
        messages = fallback_messages(messages, tools)
    schemas = list(tools.functions) if tools is not None and dialect.native_tools else None
    text = _render(tokenizer, messages, schemas, kwargs, add_generation_prompt)
    family = dialect.tools if tools is not None else None
    opener = dialect.reasoning.open
    thinks = bool(opener) and text.rstrip().endswith(opener)
    text, placed = place_images(text, count_marks(messages), images, tokenizer.vision)
    ids = tokenizer.encode_prompt(text) if add_special_tokens else tokenizer.encode_text(text)
    keyed = key_image_tokens(ids, placed, tokenizer.vision)
    if not keyed.images:
        return ChatPrompt(ids, tools, family, thinks, dialect=dialect)
    return ChatPrompt(ids, tools, family, thinks, keyed.keyed_ids, keyed.images, dialect)


def _render(tokenizer: ModelTokenizer, messages, schemas, kwargs, generation: bool) -> str:
    try:
        return tokenizer.render_chat(messages, schemas, kwargs, add_generation_prompt=generation)
    except Exception as e:  # Jinja raise_exception (role order...) or a kwarg of the wrong type
        raise bad_request(f"the chat template refused these messages: {e}", "messages") from None
