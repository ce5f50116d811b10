"""The Anthropic Messages API (/v1/messages) as an adapter (router/api/adapter.py).

The generation core is the OpenAI endpoints' own (dispatcher, pieces, ChatReader); only the
shapes differ: content blocks, stop_reason, and the event stream message_start, ping,
content_block_start/delta/stop, message_delta, message_stop.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from router.api.anthropic.parse import parse_messages_request
from router.api.anthropic.render import (
    BlockStream,
    content_blocks,
    event,
    message,
    stop_reason,
    usage_json,
)
from router.chat.images.parts import user_image_parts
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.output import reply_reader

if TYPE_CHECKING:
    from router.api.adapter import ChoiceText, StreamEvent
    from router.api.request import GenerationRequest
    from router.errors import ApiError
    from router.text.pieces import Piece, UsageCount
    from router.text.tokenizer import ModelTokenizer


class MessagesApi:
    endpoint = "/v1/messages"

    def parse(
        self,
        body: dict,
        tokenizer: ModelTokenizer,
        model_id: str,
        max_tokens_cap: int | None,
        images: PromptImages = NO_IMAGES,
    ) -> GenerationRequest:
        return parse_messages_request(body, tokenizer, model_id, max_tokens_cap, images)

    def image_parts(self, body: dict) -> list[tuple[dict, str]]:
        return list(user_image_parts(body))

    def new_id(self) -> str:
        return f"msg_{uuid.uuid4().hex[:24]}"

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        return error_events(error)

    def reply(
        self, req: GenerationRequest, request_id: str, tokenizer: ModelTokenizer
    ) -> MessagesReply:
        return MessagesReply(req, request_id, tokenizer)


MESSAGES = MessagesApi()


class MessagesReply:
    def __init__(self, req: GenerationRequest, message_id: str, tokenizer: ModelTokenizer):
        self._req = req
        self._id = message_id
        self._reader = reply_reader(req, tokenizer)
        self._blocks = BlockStream()
        self._last: Piece | None = None

    def whole(self, choices: list[ChoiceText], usage: UsageCount) -> dict:
        (choice,) = choices
        events = self._reader.feed(choice.text) + self._reader.finish()
        reason, stop = stop_reason(self._reader, choice.last)
        content = content_blocks(events)
        counts = usage_json(usage, self._req.breakpoint_tokens)
        return message(self._id, self._req, content, reason, stop, counts)

    def stream_start(self, usage: UsageCount) -> list[StreamEvent]:
        counts = usage_json(usage, self._req.breakpoint_tokens) | {"output_tokens": 0}
        start = message(self._id, self._req, [], None, None, counts)
        return [event("message_start", {"message": start}), event("ping", {})]

    def stream_piece(self, index: int, piece: Piece) -> list[StreamEvent]:
        self._last = piece
        reader = self._reader
        done = piece.finish_reason is not None
        return [
            out
            for e in reader.feed(piece.text) + (reader.finish() if done else [])
            for out in self._blocks.add(e)
        ]

    def stream_end(self, usage: UsageCount) -> list[StreamEvent]:
        reason, stop = stop_reason(self._reader, self._last)
        delta = {"stop_reason": reason, "stop_sequence": stop}
        return [
            *self._blocks.close(),
            event(
                "message_delta",
                {"delta": delta, "usage": usage_json(usage, self._req.breakpoint_tokens)},
            ),
            event("message_stop", {}),
        ]

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        return error_events(error)


def error_events(error: ApiError) -> list[StreamEvent]:
    """Headers are sent: the error goes in the stream, in Anthropic's shape."""
    return [event("error", {"error": error.anthropic_body()["error"]})]
