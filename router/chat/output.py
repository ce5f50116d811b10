"""A chat reply's text -> reasoning, content and tool calls, as it streams, in the model's dialect.

Every API surface (OpenAI chat, Responses, Anthropic messages) reads the same events. The text
comes decoded with its special tokens kept (router/http/generate.py), because several families
write their markers as special tokens (harmony's channels, Mistral's [TOOL_CALLS] and [THINK],
LFM2's <|tool_call_start|>, Gemma 4's <|"|>): the reader consumes the markers, and what is left
of other special tokens is cut from content and reasoning when the client asked
`skip_special_tokens` (the default).

Text goes first through the reasoning split (the dialect's block at the reply's start, or one
the template opened), then through the tool-call reader of the dialect's call format. gpt-oss's
harmony channels are one reader of their own (dialects/harmony.py). Text that might begin a
marker is held back until it is known not to; everything else is passed on at once.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.chat.dialects import CALL_FORMATS, REASONING_FORMATS, Dialect, ParsedCall, Reasoning
from router.chat.dialects.harmony import HarmonyReader
from router.text.detokenize import held_suffix

if TYPE_CHECKING:
    from router.chat.dialects import CallFormat
    from router.chat.tools import ToolSet

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReplyEvent:
    kind: str  # "reasoning" | "content" | "tool_call"
    text: str = ""
    call: ParsedCall | None = None
    call_index: int = 0
    call_id: str = ""


def plain_dialect(tool_format: str | None) -> Dialect:
    """A dialect of one call format and <think> reasoning (tests; --tool-call-parser)."""
    return Dialect(tool_format or "hermes", REASONING_FORMATS["think"], native_tools=True)


class ChatReader:
    """Feed reply text, get events; `finish()` flushes what was held back.

    `dialect` may be a call format's name (the Hermes, Llama 3 or Mistral reader with <think>
    reasoning). Tool calls are read only when `tools` are given, or when `dialect` is a name
    (then any function name is taken). `strip` cleans content and reasoning of special tokens.
    """

    def __init__(
        self,
        dialect: Dialect | str | None,
        starts_in_reasoning: bool = False,
        tools: ToolSet | None = None,
        strip: Callable[[str], str] | None = None,
    ):
        any_name = isinstance(dialect, str)
        if not isinstance(dialect, Dialect):
            reads_calls = dialect is not None
            dialect = plain_dialect(dialect)
        else:
            reads_calls = tools is not None
        self._strip = strip or (lambda text: text)
        self._harmony = None
        self._reasoning = self._tools = self._layout = None
        if dialect.harmony:
            declared = frozenset(tools.names) if tools is not None else None
            self._harmony = HarmonyReader(declared)
            self._harmony_calls = 0
        else:
            self._reasoning = _ReasoningSplit(dialect.reasoning, starts_in_reasoning)
            self._layout = _Dropper(dialect.layout) if dialect.layout else None
            fmt = dialect.call_format
            if reads_calls and fmt is not None:
                self._tools = _ToolReader(fmt, None if any_name else tools)

    @property
    def num_calls(self) -> int:
        if self._harmony is not None:
            return self._harmony_calls
        return self._tools.num_calls if self._tools else 0

    def feed(self, text: str) -> list[ReplyEvent]:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        assert self._reasoning is not None
        return self._route(self._reasoning.feed(text), final=False)

    def finish(self) -> list[ReplyEvent]:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish())
        assert self._reasoning is not None
        return self._route(self._reasoning.finish(), final=True)

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.num_calls else reason

    def _route(self, parts: list[tuple[str, str]], final: bool) -> list[ReplyEvent]:
        events = []
        if self._layout is not None:
            parts = [(k, self._layout.feed(t) if k == "content" else t) for k, t in parts]
            if final:
                parts.append(("content", self._layout.finish()))
        for kind, text in parts:
            if kind == "reasoning":
                events.append(ReplyEvent("reasoning", text))
            elif self._tools is None:
                events.append(ReplyEvent("content", text))
            else:
                events.extend(self._tools.feed(text))
        if final and self._tools is not None:
            events.extend(self._tools.finish())
        return self._clean(events)

    def _from_harmony(self, parts: list[tuple[str, object]]) -> list[ReplyEvent]:
        events = []
        for kind, value in parts:
            if kind == "call":
                assert isinstance(value, ParsedCall)
                call_id = f"call_{uuid.uuid4().hex[:24]}"
                events.append(
                    ReplyEvent(
                        "tool_call", call=value, call_index=self._harmony_calls, call_id=call_id
                    )
                )
                self._harmony_calls += 1
            else:
                events.append(ReplyEvent(kind, str(value)))
        return self._clean(events)

    def _clean(self, events: list[ReplyEvent]) -> list[ReplyEvent]:
        out = []
        for e in events:
            if e.kind != "tool_call":
                e = ReplyEvent(e.kind, self._strip(e.text))
            if e.kind == "tool_call" or e.text:
                out.append(e)
        return out


def reply_reader(req, tokenizer) -> ChatReader:
    """The reader of a chat request's reply (`req`: router/api/request.py GenerationRequest),
    cutting special tokens out of what the client reads unless it asked to see them."""
    strip = special_stripper(tokenizer.special_tokens) if req.skip_special_tokens else None
    dialect = req.dialect if req.dialect is not None else req.tool_family
    return ChatReader(dialect, req.starts_in_reasoning, req.tools, strip)


@functools.lru_cache(maxsize=64)
def special_stripper(special_tokens: tuple[str, ...]) -> Callable[[str], str]:
    """Cuts the special tokens' strings out of text (what skip_special_tokens would have done)."""
    tokens = sorted({t for t in special_tokens if t}, key=len, reverse=True)
    if not tokens:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(t) for t in tokens))
    return lambda text: pattern.sub("", text) if text else text


class _Dropper:
    """Content with the dialect's layout markers cut out (held while one may be arriving)."""

    def __init__(self, markers: tuple[str, ...]):
        self._markers = markers
        self._held = ""

    def feed(self, text: str) -> str:
        buffer, self._held = self._held + text, ""
        for marker in self._markers:
            buffer = buffer.replace(marker, "")
        hold = max(held_suffix(buffer, m) for m in self._markers)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold]

    def finish(self) -> str:
        held, self._held = self._held, ""
        return held


class _ReasoningSplit:
    def __init__(self, reasoning: Reasoning, starts_in_reasoning: bool):
        self._open, self._close = reasoning.open or THINK_OPEN, reasoning.close or THINK_CLOSE
        self._state = "reasoning" if starts_in_reasoning else "undecided"
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        buffer, self._held = self._held + text, ""
        if self._state == "undecided":
            head = buffer.lstrip()
            if self._open.startswith(head):  # empty, or a part of the opening marker
                self._held = buffer
                return []
            if head.startswith(self._open):
                self._state, buffer = "reasoning", head[len(self._open) :].lstrip("\n")
            else:
                self._state = "content"
        if self._state == "after_reasoning":  # the blank lines after the block are layout
            buffer = buffer.lstrip()
            self._state = "content" if buffer else "after_reasoning"
        if self._state in ("content", "after_reasoning"):
            return [("content", buffer)]
        return self._in_reasoning(buffer)

    def _in_reasoning(self, buffer: str) -> list[tuple[str, str]]:
        end = buffer.find(self._close)
        if end >= 0:
            rest = buffer[end + len(self._close) :].lstrip()
            self._state = "content" if rest else "after_reasoning"
            return [("reasoning", buffer[:end]), ("content", rest)]
        hold = held_suffix(buffer, self._close)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return [("reasoning", buffer[: len(buffer) - hold])]

    def finish(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        return [("reasoning" if self._state == "reasoning" else "content", held)]


class _ToolReader:
    """Content until a call region opens; calls out as their region (or item) closes."""

    def __init__(self, fmt: CallFormat, tools: ToolSet | None):
        self._fmt = fmt
        self._tools = tools
        self._held = ""  # content that may begin a call region
        self._region: str | None = None  # the open region's text, after its start marker
        self._bare = False  # the region opened without a marker (the whole reply is a call)
        self._region_calls = 0  # calls of the open region already sent
        self._sent_content = False
        self._gap = ""  # whitespace after a call: sent only if content follows
        self.num_calls = 0

    def feed(self, text: str) -> list[ReplyEvent]:
        fmt, events = self._fmt, []
        buffer, self._held = self._held + text, ""
        while True:
            if self._region is not None:
                self._region += buffer
                end = self._region.find(fmt.end) if fmt.end else -1
                if end < 0:
                    return events + self._closed_items()
                body, buffer = self._region[:end], self._region[end + len(fmt.end) :]
                events += self._close_region(body, final=False)
                continue
            start = self._region_start(buffer)
            if start is None:
                hold = self._marker_prefix(buffer)
                self._held = buffer[len(buffer) - hold :] if hold else ""
                return events + self._content(buffer[: len(buffer) - hold])
            at, skip = start
            events += self._content(buffer[:at])
            self._region, self._region_calls, buffer = "", 0, buffer[at + skip :]

    def finish(self) -> list[ReplyEvent]:
        if self._region is None:
            held, self._held = self._held, ""
            return self._content(held)
        return self._close_region(self._region, final=True)

    def _region_start(self, buffer: str) -> tuple[int, int] | None:
        """(where the region starts, how much of it is marker) or None. A reply that opens
        with the bare form (Llama 3's "{", Mistral's "[") is one region to its end."""
        bare = self._fmt.bare_start
        stripped = buffer.lstrip()
        at_start = bare and not self._sent_content and not self.num_calls
        if at_start and self._fmt.start.startswith(stripped):
            return None  # may still become the marker: held (_marker_prefix)
        if at_start and stripped.startswith(bare):
            self._bare = True
            return len(buffer) - len(stripped), 0
        i = buffer.find(self._fmt.start)
        if i >= 0:
            self._bare = False
            return i, len(self._fmt.start)
        return None

    def _marker_prefix(self, buffer: str) -> int:
        stripped = buffer.strip()
        if self._fmt.bare_start and not self._sent_content and not stripped:
            return len(buffer)  # only whitespace so far: the reply may still open with a call
        at_start = self._fmt.bare_start and not self._sent_content and not self.num_calls
        if at_start and stripped and self._fmt.start.startswith(buffer.lstrip()):
            return len(buffer)
        return held_suffix(buffer, self._fmt.start)

    def _closed_items(self) -> list[ReplyEvent]:
        """Calls of an open region that are complete (formats that close each call)."""
        item_end, region = self._fmt.item_end, self._region
        if not item_end or region is None or region.count(item_end) <= self._region_calls:
            return []
        closed = region[: region.rindex(item_end) + len(item_end)]
        calls = self._fmt.calls(closed, self._tools)
        return self._calls(calls[self._region_calls :]) if calls else []

    def _close_region(self, body: str, final: bool) -> list[ReplyEvent]:
        sent, bare = self._region_calls, self._bare
        self._region, self._bare = None, False
        calls = self._fmt.calls(body, self._tools)
        if calls is None and bare and self._fmt.start in body:  # text, then the marked calls
            head, tail = body.split(self._fmt.start, 1)
            first = self._fmt.calls(head, self._tools) if head.strip() else []
            rest = self._fmt.calls(tail, self._tools)
            if rest is not None:
                if first is None:
                    return self._content(head) + self._calls(rest)
                return self._calls(first + rest)
        if calls is None:
            if sent:
                return []  # its first calls went out; the rest was cut off
            marker = "" if bare else self._fmt.start
            tail = "" if final else self._fmt.end
            return self._content(marker + body + tail)  # not a call after all: the model's text
        return self._calls(calls[sent:])

    def _calls(self, calls: list[ParsedCall]) -> list[ReplyEvent]:
        events = []
        for call in calls:
            call_id = f"call_{uuid.uuid4().hex[:24]}"
            events.append(
                ReplyEvent("tool_call", call=call, call_index=self.num_calls, call_id=call_id)
            )
            self.num_calls += 1
            self._region_calls += 1
        return events

    def _content(self, text: str) -> list[ReplyEvent]:
        if not text:
            return []
        if self.num_calls and not text.strip():
            self._gap += text  # the layout between calls
            return []
        text, self._gap = self._gap + text, ""
        self._sent_content = self._sent_content or bool(text.strip())
        return [ReplyEvent("content", text)]


__all__ = ["CALL_FORMATS", "ChatReader", "ReplyEvent", "held_suffix", "special_stripper"]
