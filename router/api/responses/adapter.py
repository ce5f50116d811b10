"""OpenAI's Responses API (/v1/responses) as an adapter (router/api/adapter.py).

The generation core is the chat endpoints' own (chat prompt, dispatcher, pieces, ChatReader);
only the shapes differ: output items, and the named event stream response.created ...
response.completed. An adapter is made per request with the router's ResponseStore as the
request's API key sees it (`ScopedStore`), which `previous_response_id` reads and a finished
reply with `store: true` is kept in.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from router.api.responses.parse import (
    ENDPOINT,
    ResponsesRequest,
    history_items,
    parse_responses,
)
from router.api.responses.render import now, response_object, status_of, usage_json
from router.api.responses.stream import ItemStream
from router.chat.images.parts import message_image_parts, user_image_parts
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.output import reply_reader

if TYPE_CHECKING:
    from router.api.adapter import ChoiceText, StreamEvent
    from router.api.responses.store import ScopedStore
    from router.errors import ApiError
    from router.text.pieces import Piece, UsageCount
    from router.text.tokenizer import ModelTokenizer


class ResponsesApi:
    endpoint = ENDPOINT

    def __init__(self, store: ScopedStore):
        self._store = store

    def parse(
        self,
        body: dict,
        tokenizer: ModelTokenizer,
        model_id: str,
        max_tokens_cap: int | None,
        images: PromptImages = NO_IMAGES,
    ) -> ResponsesRequest:
        return parse_responses(body, tokenizer, model_id, max_tokens_cap, self._store, images)

    def image_parts(self, body: dict) -> list[tuple[dict, str]]:
        """The input's images, and the stored conversation's it continues (its earlier
        turns' images are in the prompt again)."""
        history = history_items(body, self._store)
        return [*message_image_parts(history, "previous_response_id"), *user_image_parts(body)]

    def new_id(self) -> str:
        return f"resp_{uuid.uuid4().hex}"

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        """Before any response exists: the `error` event alone, the stream's first."""
        fields = {"code": error.code, "message": error.message, "param": error.param}
        return [ItemStream().event("error", fields)]

    def reply(
        self, req: ResponsesRequest, request_id: str, tokenizer: ModelTokenizer
    ) -> ResponsesReply:
        return ResponsesReply(req, request_id, tokenizer, self._store)


class ResponsesReply:
    def __init__(self, req: ResponsesRequest, response_id: str, tokenizer, store):
        self._req = req
        self._id = response_id
        self._tokenizer = tokenizer
        self._store = store
        self._created_at = now()
        self._reader = reply_reader(req, tokenizer)
        self._items = ItemStream(req.context.parallel_tool_calls)
        self._last: Piece | None = None

    def whole(self, choices: list[ChoiceText], usage: UsageCount) -> dict:
        (choice,) = choices
        for e in self._reader.feed(choice.text) + self._reader.finish():
            self._items.add(e)
        status = status_of(choice.last.finish_reason)
        self._items.finish(status)
        return self._done(status, usage)

    def stream_start(self, usage: UsageCount) -> list[StreamEvent]:
        body = self._response("in_progress")
        return [
            self._items.event("response.created", {"response": body}),
            self._items.event("response.in_progress", {"response": body}),
        ]

    def stream_piece(self, index: int, piece: Piece) -> list[StreamEvent]:
        self._last = piece
        reader, done = self._reader, piece.finish_reason is not None
        events = reader.feed(piece.text) + (reader.finish() if done else [])
        out = [s for e in events for s in self._items.add(e)]
        if done:
            out += self._items.finish(status_of(piece.finish_reason))
        return out

    def stream_end(self, usage: UsageCount) -> list[StreamEvent]:
        status = status_of(self._last.finish_reason if self._last else None)
        body = self._done(status, usage)
        name = "response.completed" if status == "completed" else "response.incomplete"
        return [self._items.event(name, {"response": body})]

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        """Headers are sent: an `error` event, then the response as failed."""
        fields = {"code": error.code, "message": error.message, "param": error.param}
        body = self._response("failed", error=error)
        return [
            self._items.event("error", fields),
            self._items.event("response.failed", {"response": body}),
        ]

    def _done(self, status: str, usage: UsageCount) -> dict:
        """The finished response object, kept in the store when the request said so."""
        reasoning = "".join(
            c["text"] for i in self._items.output if i["type"] == "reasoning" for c in i["content"]
        )
        reasoning_tokens = len(self._tokenizer.encode_text(reasoning)) if reasoning else 0
        body = self._response(status, usage_json(usage, reasoning_tokens))
        context = self._req.context
        if context.store:
            self._store.put(body, context.input_items, context.history, self._req.cache_key)
        return body

    def _response(self, status: str, usage: dict | None = None, error=None) -> dict:
        output = list(self._items.output) if status != "in_progress" else []
        return response_object(self._id, self._req, self._created_at, status, output, usage, error)
