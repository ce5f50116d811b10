"""The neutral request every API adapter parses its body into, and the dispatcher serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.chat.tool_grammar import required_call_schema

if TYPE_CHECKING:
    from router.chat.dialects import Dialect
    from router.chat.prompt import ChatPrompt
    from router.chat.tools import ToolSet
    from shared.protocol import CachePin, ImageInput
    from shared.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    kind: str  # "chat" | "text"
    model: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    n: int = 1  # choices, sampled after one prefill (the worker forks the sequence)
    # Chat only (router/chat/prompt.py): how to read the reply, and the call a tool_choice of
    # "required" / a named function demands (a JSON schema for constrained decoding).
    tool_family: str | None = None
    tool_grammar: dict | None = None
    starts_in_reasoning: bool = False
    dialect: Dialect | None = None  # the model's (router/chat/dialects); None: not a chat
    tools: ToolSet | None = None  # the request's functions (the reader checks calls by them)
    # Prompt scoring: the text `echo` puts before the completion (completions); vLLM's
    # `prompt_logprobs` as asked (sampling.prompt_logprobs is what the worker computes)
    echo_text: str | None = None
    prompt_logprobs: int | None = None
    # vLLM's text extensions (router/api/openai/extensions.py)
    include_stop_str: bool = False  # a stop string that ends the reply is part of its text
    skip_special_tokens: bool = True
    cache_key: str | None = None  # OpenAI's prompt_cache_key: a routing affinity key
    # /v1/completions with several prompts: every prompt (prompt_ids is the first), each its
    # own job with n choices; choice index = prompt index x n + choice (OpenAI's order)
    batch: tuple[tuple[int, ...], ...] = ()
    # images (chat APIs): prompt_ids hold their keys where their tokens go, in this order
    images: tuple[ImageInput, ...] = ()
    # prefixes the worker keeps cached past this request: Anthropic's cache_control
    # breakpoints, OpenAI's prompt_cache_retention "24h" (shared/protocol.py CachePin)
    pins: tuple[CachePin, ...] = ()
    # Anthropic usage: the prompt tokens up to the last cache_control breakpoint (0: none)
    breakpoint_tokens: int = 0
    # per-request metadata taken out of the prompt (router/text/volatile.py), for /metrics
    volatile_removed: int = 0

    @property
    def reads_chat(self) -> bool:
        """A chat reply of one choice is read for reasoning and calls (router/chat/output.py):
        it is decoded with its special tokens, which the reader consumes or cuts."""
        return self.kind == "chat" and self.n == 1 and self.dialect is not None


def chat_prompt_fields(prompt: ChatPrompt) -> dict:
    """The fields every chat API (chat, messages, responses, Ollama's) takes from its templated
    prompt: how the reply is read, the call a required tool_choice demands, the images, and
    the volatile metadata the prompt lost. One place, so a new prompt field reaches them all."""
    return {
        "tool_family": prompt.tool_family,
        "dialect": prompt.dialect,
        "tools": prompt.tools,
        "tool_grammar": required_call_schema(prompt.tools),
        "starts_in_reasoning": prompt.starts_in_reasoning,
        "images": prompt.images,
        "volatile_removed": prompt.volatile_removed,
    }
