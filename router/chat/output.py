"""A chat reply's text -> reasoning, content and tool calls, as it streams.

Both API surfaces (OpenAI chat, Anthropic messages) read the same events: text goes first
through the reasoning split (`<think>...</think>` at the start of the reply, or a block the
template opened), then through the tool-call reader of the model's family. Text that might be
the start of a marker is held back until it is known not to be one; everything else is passed
on at once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from router.chat.tool_parsers import (
    ParsedCall,
    call_region_start,
    complete_hermes_calls,
    parse_tool_calls,
    possible_marker_prefix,
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReplyEvent:
    kind: str  # "reasoning" | "content" | "tool_call"
    text: str = ""
    call: ParsedCall | None = None
    call_index: int = 0
    call_id: str = ""


class ChatReader:
    """Feed reply text, get events; `finish()` flushes what was held back."""

    def __init__(self, tool_family: str | None, starts_in_reasoning: bool):
        self._reasoning = _ReasoningSplit(starts_in_reasoning)
        self._tools = _ToolReader(tool_family) if tool_family else None

    @property
    def num_calls(self) -> int:
        return self._tools.num_calls if self._tools else 0

    def feed(self, text: str) -> list[ReplyEvent]:
        return self._route(self._reasoning.feed(text), final=False)

    def finish(self) -> list[ReplyEvent]:
        return self._route(self._reasoning.finish(), final=True)

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.num_calls else reason

    def _route(self, parts: list[tuple[str, str]], final: bool) -> list[ReplyEvent]:
        events = []
        for kind, text in parts:
            if kind == "reasoning":
                events.append(ReplyEvent("reasoning", text))
            elif self._tools is None:
                events.append(ReplyEvent("content", text))
            else:
                events.extend(self._tools.feed(text))
        if final and self._tools is not None:
            events.extend(self._tools.finish())
        return [e for e in events if e.kind == "tool_call" or e.text]


def held_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class _ReasoningSplit:
    def __init__(self, starts_in_reasoning: bool):
        self._state = "reasoning" if starts_in_reasoning else "undecided"
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        buffer, self._held = self._held + text, ""
        if self._state == "undecided":
            head = buffer.lstrip()
            if THINK_OPEN.startswith(head):  # empty, or a part of "<think>"
                self._held = buffer
                return []
            if head.startswith(THINK_OPEN):
                self._state, buffer = "reasoning", head[len(THINK_OPEN) :]
            else:
                self._state = "content"
        if self._state == "after_reasoning":  # the blank lines after </think> are layout
            buffer = buffer.lstrip()
            self._state = "content" if buffer else "after_reasoning"
        if self._state in ("content", "after_reasoning"):
            return [("content", buffer)]
        return self._in_reasoning(buffer)

    def _in_reasoning(self, buffer: str) -> list[tuple[str, str]]:
        end = buffer.find(THINK_CLOSE)
        if end >= 0:
            rest = buffer[end + len(THINK_CLOSE) :].lstrip()
            self._state = "content" if rest else "after_reasoning"
            return [("reasoning", buffer[:end]), ("content", rest)]
        hold = held_suffix(buffer, THINK_CLOSE)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return [("reasoning", buffer[: len(buffer) - hold])]

    def finish(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        return [("reasoning" if self._state == "reasoning" else "content", held)]


class _ToolReader:
    def __init__(self, family: str):
        self._family = family
        self._held = ""  # content that may begin a call region
        self._region: str | None = None  # text from the start of the call region on
        self._sent_content = False
        self.num_calls = 0

    def feed(self, text: str) -> list[ReplyEvent]:
        if self._region is not None:
            self._region += text
            return self._closed_calls()
        buffer, self._held = self._held + text, ""
        start = call_region_start(self._family, buffer, at_reply_start=not self._sent_content)
        if start is not None:
            self._region = buffer[start:]
            return [self._content(buffer[:start]), *self._closed_calls()]
        hold = possible_marker_prefix(self._family, buffer, not self._sent_content)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return [self._content(buffer[: len(buffer) - hold])]

    def finish(self) -> list[ReplyEvent]:
        if self._region is None:
            held, self._held = self._held, ""
            return [self._content(held)]
        parsed = parse_tool_calls(self._family, self._region)
        if not parsed.calls and not self.num_calls:
            return [self._content(self._region)]  # not a call after all: the model's text
        return [self._content(parsed.content), *self._calls(parsed.calls[self.num_calls :])]

    def _closed_calls(self) -> list[ReplyEvent]:
        """Calls complete before the end of the reply (the Hermes format closes each one)."""
        if self._family != "hermes":
            return []
        closed = complete_hermes_calls(self._region)
        if closed <= self.num_calls:
            return []
        end = _nth_end(self._region, "</tool_call>", closed)
        calls = parse_tool_calls("hermes", self._region[:end]).calls
        return self._calls(calls[self.num_calls :])

    def _calls(self, calls) -> list[ReplyEvent]:
        events = []
        for call in calls:
            call_id = f"call_{uuid.uuid4().hex[:24]}"
            events.append(
                ReplyEvent("tool_call", call=call, call_index=self.num_calls, call_id=call_id)
            )
            self.num_calls += 1
        return events

    def _content(self, text: str) -> ReplyEvent:
        self._sent_content = self._sent_content or bool(text.strip())
        return ReplyEvent("content", text)


def _nth_end(text: str, marker: str, n: int) -> int:
    end = 0
    for _ in range(n):
        end = text.index(marker, end) + len(marker)
    return end
