"""A reply's events (router/chat/output.py) -> Responses output items and the stream events
that build them: output_item.added, content_part.added, output_text / reasoning_text /
function_call_arguments deltas and their .done, content_part.done, output_item.done.

Whole replies go through the same builder (their events dropped), so a streamed response's
final object and a whole one hold the same items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.api.adapter import StreamEvent
from router.api.responses.items import new_item_id
from router.api.responses.render import call_item, message_item, reasoning_item, text_part

if TYPE_CHECKING:
    from router.chat.output import ReplyEvent

_TEXT_KIND = {"content": "output_text", "reasoning": "reasoning_text"}


class ItemStream:
    """Opens, fills and closes output items as reply events arrive; numbers every event."""

    def __init__(self, parallel_tool_calls: bool = True):
        self.output: list[dict] = []  # the finished items
        self._parallel = parallel_tool_calls
        self._sequence = 0
        self._open: tuple[str, str, str] | None = None  # (kind, item id, text so far)
        self._blank = ""  # whitespace-only content, held until text follows it

    def event(self, name: str, data: dict) -> StreamEvent:
        """A named event carrying its name as `type` and the next sequence number."""
        self._sequence += 1
        return StreamEvent({"type": name, **data, "sequence_number": self._sequence - 1}, name)

    def add(self, e: ReplyEvent) -> list[StreamEvent]:
        if e.kind == "tool_call":
            return self._call(e)
        text = e.text
        if e.kind == "content" and (self._open is None or self._open[0] != "content"):
            text, self._blank = self._blank + text, ""
            if not text.strip():  # the layout between calls, or before one
                self._blank = text
                return []
        return self._text(e.kind, text)

    def _text(self, kind: str, text: str) -> list[StreamEvent]:
        """`text` of `kind` (content, reasoning) into its item, opened if need be."""
        out = []
        if self._open is None or self._open[0] != kind:
            out += self.close("completed")
            out += self._start(kind)
        kind, item_id, so_far = self._open
        self._open = (kind, item_id, so_far + text)
        delta = {"item_id": item_id, "output_index": len(self.output), "content_index": 0}
        extra = {"logprobs": []} if kind == "content" else {}
        return [
            *out,
            self.event(f"response.{_TEXT_KIND[kind]}.delta", delta | {"delta": text} | extra),
        ]

    def close(self, status: str) -> list[StreamEvent]:
        """Finish the open item (if any) with `status`."""
        if self._open is None:
            return []
        kind, item_id, text = self._open
        self._open = None
        where = {"item_id": item_id, "output_index": len(self.output), "content_index": 0}
        if kind == "content":
            item, part = message_item(item_id, text, status), text_part(text)
            done = self.event("response.output_text.done", where | {"text": text, "logprobs": []})
        else:
            item = reasoning_item(item_id, text, "completed")
            part = item["content"][0]
            done = self.event("response.reasoning_text.done", where | {"text": text})
        return [
            done,
            self.event("response.content_part.done", where | {"part": part}),
            *self._finish(item),
        ]

    def finish(self, status: str) -> list[StreamEvent]:
        """The end of the reply: close what is open; an empty reply is one empty message.
        Whitespace held back is the reply's text unless a call came (then it was layout)."""
        blank, self._blank = self._blank, ""
        out = self._text("content", blank) if blank and not self._has_call() else []
        out += self.close(status)
        if not self.output:
            out += self._start("content") + self.close(status)
        return out

    def _start(self, kind: str) -> list[StreamEvent]:
        item_id = new_item_id("message" if kind == "content" else "reasoning")
        self._open = (kind, item_id, "")
        make = message_item if kind == "content" else reasoning_item
        where = {"item_id": item_id, "output_index": len(self.output), "content_index": 0}
        part = text_part("") if kind == "content" else {"type": "reasoning_text", "text": ""}
        return [
            self.event(
                "response.output_item.added",
                {"output_index": len(self.output), "item": make(item_id, "", "in_progress")},
            ),
            self.event("response.content_part.added", where | {"part": part}),
        ]

    def _call(self, e: ReplyEvent) -> list[StreamEvent]:
        if not self._parallel and self._has_call():
            return []  # parallel_tool_calls: false keeps the first call only
        out = self.close("completed")
        self._blank = ""
        item_id = new_item_id("function_call")
        where = {"item_id": item_id, "output_index": len(self.output)}
        added = {"output_index": len(self.output), "item": call_item(item_id, e, "in_progress")}
        arguments = e.call.arguments
        return [
            *out,
            self.event("response.output_item.added", added),
            self.event("response.function_call_arguments.delta", where | {"delta": arguments}),
            self.event(
                "response.function_call_arguments.done",
                where | {"arguments": arguments, "name": e.call.name},
            ),
            *self._finish(call_item(item_id, e, "completed")),
        ]

    def _has_call(self) -> bool:
        return any(i["type"] == "function_call" for i in self.output)

    def _finish(self, item: dict) -> list[StreamEvent]:
        self.output.append(item)
        done = {"output_index": len(self.output) - 1, "item": item}
        return [self.event("response.output_item.done", done)]
