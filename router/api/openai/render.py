"""OpenAI response bodies for chat and text completions, whole and as stream chunks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.text.logprobs import LogprobEntry, LogprobsRenderer
    from router.text.pieces import UsageCount


@dataclass
class ResponseBuilder:
    kind: str  # "chat" | "text"
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: LogprobsRenderer | None = None  # when the request asked for them

    def full(
        self,
        text: str | dict,
        finish_reason: str,
        usage: UsageCount,
        entries: tuple[LogprobEntry, ...] = (),
        scored: list | None = None,
    ) -> dict:
        """`text` is the reply, or for chat the whole assistant message (chat_message()).
        `scored`: vLLM's `prompt_logprobs`, when asked for."""
        logprobs = self._logprobs(entries)
        if self.kind == "chat":
            message = text if isinstance(text, dict) else plain_message(text)
            choice = {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion", choice, usage.to_json())
            return self.with_prompt_logprobs(body, scored)
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        body = self._envelope("text_completion", choice, usage.to_json())
        return self.with_prompt_logprobs(body, scored)

    def with_prompt_logprobs(self, body: dict, scored: list | None) -> dict:
        """vLLM's `prompt_logprobs` in `body` (a response or a chunk): at the top for chat, in
        the choice for completions, as vLLM puts them."""
        if scored is not None:
            (body["choices"][0] if self.kind == "text" else body)["prompt_logprobs"] = scored
        return body

    def full_choices(self, choices: list[tuple], usage: UsageCount) -> dict:
        """A whole response of n choices: (text, finish reason, logprob entries, vLLM
        prompt_logprobs or None) each."""
        bodies = [self.full(text, reason, usage, *rest) for text, reason, *rest in choices]
        body = bodies[0]
        body["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
        return body

    def chunk(
        self,
        text: str | dict,
        finish_reason: str | None,
        first: bool,
        include_usage: bool,
        entries: tuple[LogprobEntry, ...] = (),
        index: int = 0,
    ) -> dict:
        """`text` is the new text, or for chat a whole `delta` (chat_deltas())."""
        logprobs = self._logprobs(entries) if entries else None
        if self.kind == "chat":
            delta = text if isinstance(text, dict) else {"content": text}
            if first:
                delta = {"role": "assistant", "content": "", **delta}
            if finish_reason is not None and not text:
                delta = {}
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion.chunk", choice, None)
        else:
            choice = {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            body = self._envelope("text_completion", choice, None)
        if not include_usage or self.kind == "text":
            del body["usage"]  # completions' usage is not nullable in OpenAI's schema
        return body

    def usage_chunk(self, usage: UsageCount) -> dict:
        """The extra last chunk of stream_options.include_usage: no choices, the usage."""
        body = self._envelope(self._chunk_object, None, usage.to_json())
        body["choices"] = []
        return body

    def _logprobs(self, entries: tuple[LogprobEntry, ...]) -> dict | None:
        return self.logprobs.render(list(entries)) if self.logprobs is not None else None

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def _envelope(self, obj: str, choice: dict | None, usage: dict | None) -> dict:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice] if choice is not None else [],
            "usage": usage,
        }


def plain_message(content: str | None) -> dict:
    """An assistant message; `refusal` is required (nullable) in OpenAI's schema, and a
    refusal here is only ever the model's own text, so it is always null."""
    return {"role": "assistant", "content": content, "refusal": None}


def chat_message(events) -> dict:
    """The assistant message of a whole chat reply, from its ChatReader events."""
    content = "".join(e.text for e in events if e.kind == "content")
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    calls = [_tool_call_json(e) for e in events if e.kind == "tool_call"]
    if calls:  # the whitespace that separated the text from the markup goes with the markup
        content = content.strip()
    message = plain_message(content if content or not calls else None)
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def chat_deltas(event) -> list[dict]:
    """One streamed event as OpenAI `delta`s. A call goes as OpenAI streams one: a first
    entry with its index, id, type and name, then its arguments; the router sends a call once
    it is complete, since only then is it known to parse."""
    if event.kind == "tool_call":
        head = {"index": event.call_index, **_tool_call_json(event)}
        head["function"] = {"name": event.call.name, "arguments": ""}
        arguments = {"index": event.call_index, "function": {"arguments": event.call.arguments}}
        return [{"tool_calls": [head]}, {"tool_calls": [arguments]}]
    key = "reasoning_content" if event.kind == "reasoning" else "content"
    return [{key: event.text}]


def _tool_call_json(event) -> dict:
    function = {"name": event.call.name, "arguments": event.call.arguments}
    return {"id": event.call_id, "type": "function", "function": function}
