"""Anthropic Messages response shapes: content blocks (text / thinking / tool_use),
stop_reason, usage, and the content_block_start/delta/stop events of a stream."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from router.api.adapter import StreamEvent

if TYPE_CHECKING:
    from router.api.request import GenerationRequest
    from router.chat.output import ChatReader, ReplyEvent
    from router.text.pieces import Piece, UsageCount

_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
_BLOCK_TYPES = {"content": "text", "reasoning": "thinking"}
_TEXT_KEYS = {"content": "text", "reasoning": "thinking"}
_DELTA_TYPES = {"content": "text_delta", "reasoning": "thinking_delta"}


def event(name: str, data: dict) -> StreamEvent:
    """A named event whose data carries its name as `type`, as Anthropic's streams do."""
    return StreamEvent({"type": name, **data}, name)


def stop_reason(reader: ChatReader, piece: Piece) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of the last piece."""
    if piece.stop_string is not None:
        return "stop_sequence", piece.stop_string
    if reader.num_calls:
        return "tool_use", None
    return _STOP_REASONS.get(piece.finish_reason, "end_turn"), None


def usage_json(usage: UsageCount, breakpoint_tokens: int = 0) -> dict:
    """Usage as Anthropic counts it: the prompt is the sum of `cache_read_input_tokens`
    (read from cache), `cache_creation_input_tokens` (computed and written to cache up to
    the last cache_control breakpoint, `breakpoint_tokens`; 0 without one) and
    `input_tokens` (the rest: after the breakpoint, neither read nor written). Our cache
    also keeps prefixes no breakpoint marked: what a request reads of those is cache_read."""
    read = usage.cached_tokens
    created = max(0, min(breakpoint_tokens, usage.prompt_tokens) - read)
    return {
        "input_tokens": usage.prompt_tokens - read - created,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    }


def message(message_id: str, req: GenerationRequest, content, reason, stop, usage) -> dict:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop,
        "usage": usage,
    }


def content_blocks(events: list[ReplyEvent]) -> list[dict]:
    """Consecutive events of one kind make one block; every call is its own tool_use block."""
    blocks: list[dict] = []
    for e in events:
        if e.kind == "tool_call":
            blocks.append(_tool_use_block(e, json.loads(e.call.arguments)))
        elif blocks and blocks[-1]["type"] == _BLOCK_TYPES[e.kind]:
            blocks[-1][_TEXT_KEYS[e.kind]] += e.text
        else:
            blocks.append(_empty_block(e.kind) | {_TEXT_KEYS[e.kind]: e.text})
    if any(b["type"] == "tool_use" for b in blocks):  # the separating whitespace goes too
        for block in blocks:
            if block["type"] == "text":
                block["text"] = block["text"].strip()
    return [b for b in blocks if b["type"] != "text" or b["text"]]


def _empty_block(kind: str) -> dict:
    if kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _tool_use_block(e: ReplyEvent, arguments: dict) -> dict:
    call_id = "toolu_" + e.call_id.removeprefix("call_")
    return {"type": "tool_use", "id": call_id, "name": e.call.name, "input": arguments}


class BlockStream:
    """Opens, fills and closes content blocks as reply events arrive; returns the events."""

    def __init__(self):
        self._index = -1
        self._open_kind: str | None = None

    def add(self, e: ReplyEvent) -> list[StreamEvent]:
        if e.kind == "tool_call":
            delta = {"type": "input_json_delta", "partial_json": e.call.arguments}
            return [
                *self.close(),
                self._start(_tool_use_block(e, {})),
                self._delta(delta),
                *self.close(),
            ]
        out = []
        if self._open_kind != e.kind:
            out += self.close()
            out.append(self._start(_empty_block(e.kind)))
            self._open_kind = e.kind
        out.append(self._delta({"type": _DELTA_TYPES[e.kind], _TEXT_KEYS[e.kind]: e.text}))
        return out

    def close(self) -> list[StreamEvent]:
        out = []
        if self._index >= 0 and self._open_kind != "closed":
            out.append(event("content_block_stop", {"index": self._index}))
        self._open_kind = "closed"
        return out

    def _start(self, block: dict) -> StreamEvent:
        self._index += 1
        self._open_kind = "tool_call"
        return event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: dict) -> StreamEvent:
        return event("content_block_delta", {"index": self._index, "delta": delta})
