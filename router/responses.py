"""OpenAI response bodies for chat and text completions, whole and as stream chunks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from router.generation import UsageCount
from router.logprobs import LogprobEntry, LogprobsRenderer


@dataclass
class ResponseBuilder:
    kind: str  # "chat" | "text"
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: LogprobsRenderer | None = None  # when the request asked for them

    def full(
        self,
        text: str,
        finish_reason: str,
        usage: UsageCount,
        entries: tuple[LogprobEntry, ...] = (),
    ) -> dict:
        logprobs = self._logprobs(entries)
        if self.kind == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
            return self._envelope("chat.completion", choice, usage.to_json())
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", choice, usage.to_json())

    def full_choices(
        self, choices: list[tuple[str, str, tuple[LogprobEntry, ...]]], usage: UsageCount
    ) -> dict:
        """A whole response of n choices: (text, finish reason, logprob entries) each."""
        bodies = [self.full(text, reason, usage, entries) for text, reason, entries in choices]
        body = bodies[0]
        body["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
        return body

    def chunk(
        self,
        text: str,
        finish_reason: str | None,
        first: bool,
        include_usage: bool,
        entries: tuple[LogprobEntry, ...] = (),
        index: int = 0,
    ) -> dict:
        logprobs = self._logprobs(entries) if entries else None
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else {"content": text}
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
        if not include_usage:
            del body["usage"]
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
            "system_fingerprint": None,
            "choices": [choice] if choice is not None else [],
            "usage": usage,
        }
