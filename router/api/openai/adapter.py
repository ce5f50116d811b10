"""The OpenAI APIs as adapters (router/api/adapter.py): /v1/chat/completions and
/v1/completions, one choice or n, whole bodies or `data:` chunks ending in [DONE]."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from router.api.adapter import ChoiceText, StreamEvent
from router.api.openai.parse import parse_chat, parse_completion
from router.api.openai.render import ResponseBuilder, chat_deltas, chat_message
from router.chat.images.parts import user_image_parts
from router.chat.images.placement import NO_IMAGES, PromptImages
from router.chat.output import ChatReader, reply_reader
from router.text.logprobs import LogprobsRenderer, vllm_prompt_logprobs

if TYPE_CHECKING:
    from router.api.request import GenerationRequest
    from router.errors import ApiError
    from router.text.logprobs import LogprobEntry
    from router.text.pieces import Piece, UsageCount
    from router.text.tokenizer import ModelTokenizer

DONE = StreamEvent("[DONE]")


class OpenAIApi:
    def __init__(
        self,
        endpoint: str,
        parse: Callable[..., GenerationRequest],
        id_prefix: str,
        takes_images: bool = False,
    ):
        self.endpoint = endpoint
        self._parse = parse
        self._id_prefix = id_prefix
        self._takes_images = takes_images  # chat's messages may hold image parts

    def image_parts(self, body: dict) -> list[tuple[dict, str]]:
        return list(user_image_parts(body)) if self._takes_images else []

    def parse(
        self,
        body: dict,
        tokenizer: ModelTokenizer,
        model_id: str,
        max_tokens_cap: int | None,
        images: PromptImages = NO_IMAGES,
    ) -> GenerationRequest:
        return self._parse(body, tokenizer, model_id, max_tokens_cap, images)

    def new_id(self) -> str:
        return f"{self._id_prefix}-{uuid.uuid4().hex}"

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        return error_events(error)

    def reply(
        self, req: GenerationRequest, request_id: str, tokenizer: ModelTokenizer
    ) -> OpenAIReply:
        renderer = None
        if req.sampling.logprobs:
            renderer = LogprobsRenderer(tokenizer, req.kind, req.sampling.top_logprobs)
        builder = ResponseBuilder(req.kind, request_id, req.model, logprobs=renderer)
        return OpenAIReply(req, builder, tokenizer)


CHAT = OpenAIApi("/v1/chat/completions", parse_chat, "chatcmpl", takes_images=True)
COMPLETIONS = OpenAIApi("/v1/completions", parse_completion, "cmpl")


class OpenAIReply:
    """A chat reply of one choice is read for reasoning and tool calls (ChatReader); the
    choices of n > 1 and text completions go out as the text they are."""

    def __init__(self, req: GenerationRequest, builder: ResponseBuilder, tokenizer=None):
        self._req = req
        self._builder = builder
        self._tokenizer = tokenizer  # for vLLM's prompt_logprobs' decoded tokens
        self._readers: dict[int, ChatReader | None] = {}  # the choices that have started

    def whole(self, choices: list[ChoiceText], usage: UsageCount) -> dict:
        results = []
        for choice in choices:
            text, reason = self._req.echo_text or "", choice.last.finish_reason
            text += choice.text
            entries, scored = self._split(choice.logprobs)
            reader = self._new_reader()
            if reader is not None:
                text = chat_message(reader.feed(text) + reader.finish())
                reason = reader.finish_reason(reason)
            results.append((text, reason, entries, scored))
        return self._builder.full_choices(results, usage)

    def _split(self, entries: tuple[LogprobEntry, ...]) -> tuple[tuple, list | None]:
        """The entries `logprobs` shows (with echo, the prompt's first) and vLLM's
        `prompt_logprobs` (None unless asked for and present)."""
        req = self._req
        echoed = req.echo_text is not None and req.sampling.logprobs
        shown = tuple(e for e in entries if echoed or not e.prompt)
        prompt = [e for e in entries if e.prompt]
        if req.prompt_logprobs is None or not prompt:
            return shown, None
        return shown, vllm_prompt_logprobs(prompt, req.prompt_logprobs, self._tokenizer)

    def stream_start(self, usage: UsageCount) -> list[StreamEvent]:
        return []

    def stream_piece(self, index: int, piece: Piece) -> list[StreamEvent]:
        first = index not in self._readers
        if first:
            self._readers[index] = self._new_reader()
        reader = self._readers[index]
        include_usage = self._req.include_usage
        done = piece.finish_reason is not None
        parts = _stream_parts(reader, piece.text, done)
        if first and self._req.echo_text:  # the prompt goes first, in the first chunk
            parts = [self._req.echo_text + (parts[0] if parts else ""), *parts[1:]]
        entries, scored = self._split(piece.logprobs)  # with the piece's first chunk
        if not parts and (entries or scored or first):
            parts = [""]
        events = []
        for part in parts:
            chunk = self._builder.chunk(part, None, first, include_usage, entries, index)
            events.append(StreamEvent(self._builder.with_prompt_logprobs(chunk, scored)))
            entries, scored, first = (), None, False
        if done:
            reason = reader.finish_reason(piece.finish_reason) if reader else piece.finish_reason
            chunk = self._builder.chunk("", reason, False, include_usage, index=index)
            events.append(StreamEvent(chunk))
        return events

    def stream_end(self, usage: UsageCount) -> list[StreamEvent]:
        if self._req.include_usage:
            return [StreamEvent(self._builder.usage_chunk(usage)), DONE]
        return [DONE]

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        return error_events(error)

    def _new_reader(self) -> ChatReader | None:
        req = self._req
        if req.kind != "chat" or req.n > 1:
            return None
        return reply_reader(req, self._tokenizer)


def error_events(error: ApiError) -> list[StreamEvent]:
    """Headers are sent: the error goes in the stream, as OpenAI does."""
    return [StreamEvent(error.body()), DONE]


def _stream_parts(reader: ChatReader | None, text: str, done: bool) -> list:
    """What to send for a piece of text: itself, or for chat the deltas its events make."""
    if reader is None:
        return [text] if text else []
    events = reader.feed(text) + (reader.finish() if done else [])
    return [delta for e in events for delta in chat_deltas(e)]
