"""Ollama's /api/chat and /api/generate as adapters (router/api/adapter.py).

One adapter per request (it holds the request's Clock, so the reply's timings are measured):
the endpoint makes it when the request arrives. The GenerationRequest is always streamed
inside, so that the first text's arrival is seen; with `stream: false` the reply gathers the
pieces and writes one object at the end (router/http/endpoints/ollama.py sets the content
type: NDJSON or JSON). The reply is read by the model's dialect (router/chat/output.py) for
thinking and tool calls, as on the other APIs.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from router.api.adapter import StreamEvent
from router.api.ollama.parse import image_parts, parse_chat, parse_generate, stream_of
from router.api.ollama.render import Clock, Delta, error_line, line
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.output import reply_reader

if TYPE_CHECKING:
    from router.api.adapter import ChoiceText
    from router.api.request import GenerationRequest
    from router.errors import ApiError
    from router.text.pieces import Piece, UsageCount
    from router.text.tokenizer import ModelTokenizer

PARSERS = {"chat": parse_chat, "generate": parse_generate}
ENDPOINTS = {"chat": "/api/chat", "generate": "/api/generate"}


class OllamaApi:
    def __init__(self, kind: str):
        self.kind = kind  # "chat" | "generate"
        self.endpoint = ENDPOINTS[kind]
        self.clock = Clock()
        self.stream = True

    def parse(
        self,
        body: dict,
        tokenizer: ModelTokenizer,
        model_id: str,
        max_tokens_cap: int | None,
        images: PromptImages = NO_IMAGES,
    ) -> GenerationRequest:
        self.clock.mark("parsed")
        self.stream = stream_of(body)
        return PARSERS[self.kind](body, tokenizer, model_id, max_tokens_cap, images)

    def image_parts(self, body: dict) -> list[tuple[dict, str]]:
        if self.kind == "generate":
            if body.get("raw"):
                return []  # refused by the parser, with its own message
            return [(p, "images") for p in image_parts(body, "images")]
        messages = body.get("messages")
        return [
            (part, f"messages[{i}].images")
            for i, m in enumerate(messages if isinstance(messages, list) else [])
            if isinstance(m, dict) and m.get("role") == "user"
            for part in image_parts(m, f"messages[{i}]")
        ]

    def new_id(self) -> str:
        return f"ollama-{uuid.uuid4().hex}"

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        return [StreamEvent(error_line(error.message))]

    def reply(
        self, req: GenerationRequest, request_id: str, tokenizer: ModelTokenizer
    ) -> OllamaReply:
        self.clock.mark("placed")
        return OllamaReply(self, req, tokenizer)


class OllamaReply:
    def __init__(self, api: OllamaApi, req: GenerationRequest, tokenizer: ModelTokenizer):
        self._api = api
        self._model = req.model
        self._reader = reply_reader(req, tokenizer) if req.reads_chat else None
        self._gathered = Delta()  # stream: false: the whole reply, written at the end
        self._last: Piece | None = None

    def whole(self, choices: list[ChoiceText], usage: UsageCount) -> dict:
        (choice,) = choices
        self._last = choice.last
        self._gathered.extend(self._delta(choice.text, final=True))
        return self._end(usage, self._gathered)

    def stream_start(self, usage: UsageCount) -> list[StreamEvent]:
        self._api.clock.mark("first")
        return []

    def stream_piece(self, index: int, piece: Piece) -> list[StreamEvent]:
        self._last = piece
        delta = self._delta(piece.text, final=piece.finish_reason is not None)
        if not self._api.stream:
            self._gathered.extend(delta)
            return []
        return [StreamEvent(self._line(delta, done=False))] if delta else []

    def stream_end(self, usage: UsageCount) -> list[StreamEvent]:
        return [StreamEvent(self._end(usage, self._gathered if not self._api.stream else Delta()))]

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        return self._api.stream_error(error)

    def _delta(self, text: str, final: bool) -> Delta:
        delta = Delta()
        if self._reader is None:  # a raw prompt: the text as it comes
            delta.content = text
            return delta
        for e in self._reader.feed(text) + (self._reader.finish() if final else []):
            delta.add(e)
        return delta

    def _line(self, delta: Delta, done: bool) -> dict:
        fields = delta.chat_fields() if self._api.kind == "chat" else delta.generate_fields()
        return line(self._model, fields, done)

    def _end(self, usage: UsageCount, delta: Delta) -> dict:
        reason = self._last.finish_reason if self._last is not None else None
        timings = self._api.clock.timings(usage)
        return self._line(delta, done=True) | {"done_reason": reason or "stop", **timings}
