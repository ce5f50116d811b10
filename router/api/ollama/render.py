"""Ollama response shapes: the lines of /api/chat and /api/generate (each a whole JSON object;
the last has `done: true`, `done_reason` and the timings), and what /api/tags, /api/ps,
/api/show and /api/version answer."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.chat.output import ReplyEvent
    from router.text.pieces import UsageCount

# The Ollama API version whose shapes these follow (clients check it against a minimum)
OLLAMA_API_VERSION = "0.12.0"


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def iso_of(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Clock:
    """When a request reached each stage (time.monotonic_ns), for Ollama's durations:
    `load_duration` is the wait before its prompt was read (the model loading, and the body),
    `prompt_eval_duration` from its jobs' start to the first text, `eval_duration` from
    there to the end."""

    started: int = field(default_factory=time.monotonic_ns)
    parsed: int | None = None
    placed: int | None = None
    first: int | None = None

    def mark(self, stage: str) -> None:
        setattr(self, stage, time.monotonic_ns())

    def timings(self, usage: UsageCount) -> dict:
        end = time.monotonic_ns()
        parsed = self.parsed or self.started
        placed = self.placed or parsed
        first = self.first or end
        return {
            "total_duration": end - self.started,
            "load_duration": parsed - self.started,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": first - placed,
            "eval_count": usage.completion_tokens,
            "eval_duration": end - first,
        }


@dataclass
class Delta:
    """What one line (or, gathered, the whole reply) says: text, thinking, tool calls."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def add(self, e: ReplyEvent) -> None:
        if e.kind == "tool_call":
            self.tool_calls.append(tool_call(e))
        elif e.kind == "reasoning":
            self.thinking += e.text
        else:
            self.content += e.text

    def extend(self, other: Delta) -> None:
        self.content += other.content
        self.thinking += other.thinking
        self.tool_calls += other.tool_calls

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls)

    def chat_fields(self) -> dict:
        message = {"role": "assistant", "content": self.content}
        if self.thinking:
            message["thinking"] = self.thinking
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return {"message": message}

    def generate_fields(self) -> dict:
        return {"response": self.content} | ({"thinking": self.thinking} if self.thinking else {})


def tool_call(e: ReplyEvent) -> dict:
    """A call in Ollama's shape: arguments as an object."""
    function = {"index": e.call_index, "name": e.call.name}
    return {"id": e.call_id, "function": function | {"arguments": json.loads(e.call.arguments)}}


def line(model: str, fields: dict, done: bool) -> dict:
    return {"model": model, "created_at": now_iso(), **fields, "done": done}


def error_line(message: str) -> dict:
    return {"error": message}
