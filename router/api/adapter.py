"""What an API adapter is: the one contract between router/http/generate.py and an API.

An adapter turns a JSON body into a GenerationRequest, and the text pieces of the job that
serves it into a whole JSON body or into stream events. It does no I/O: the HTTP layer reads
the body, starts the job, collects the pieces and writes what the adapter returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from router.api.request import GenerationRequest
    from router.chat.images.placement import PromptImages
    from router.errors import ApiError
    from router.text.logprobs import LogprobEntry
    from router.text.pieces import Piece, UsageCount
    from router.text.tokenizer import ModelTokenizer


@dataclass(frozen=True)
class StreamEvent:
    """One server-sent event: `data` (a JSON object, or a bare string such as "[DONE]"),
    named with an `event:` line when `name` is set (Anthropic's streams name theirs)."""

    data: dict | str
    name: str | None = None


@dataclass(frozen=True)
class ChoiceText:
    """One choice of a whole reply: its text, its last piece (finish reason, stop string),
    and its logprob entries."""

    text: str
    last: Piece
    logprobs: tuple[LogprobEntry, ...] = ()


class Reply(Protocol):
    """The replies to one request; a stream's Reply keeps state between its pieces."""

    def whole(self, choices: list[ChoiceText], usage: UsageCount) -> dict: ...

    def stream_start(self, usage: UsageCount) -> list[StreamEvent]:
        """The events before the first piece; `usage` is the prompt's as of the first tokens
        (its cached tokens known, none generated yet)."""
        ...

    def stream_piece(self, index: int, piece: Piece) -> list[StreamEvent]: ...

    def stream_end(self, usage: UsageCount) -> list[StreamEvent]: ...

    def stream_error(self, error: ApiError) -> list[StreamEvent]: ...


class Api(Protocol):
    """One API (OpenAI chat, OpenAI completions, Anthropic messages)."""

    endpoint: str  # the path, for error messages

    def parse(
        self,
        body: dict,
        tokenizer: ModelTokenizer,
        model_id: str,
        max_tokens_cap: int | None,
        images: PromptImages = ...,  # the body's decoded images (router/http/images.py)
    ) -> GenerationRequest: ...

    def image_parts(self, body: dict) -> list[tuple[dict, str]]:
        """The image parts the prompt will hold (each with the field naming it), decoded
        before `parse`: the body's user messages, and for a continued conversation its
        stored history's."""
        ...

    def new_id(self) -> str: ...

    def reply(
        self, req: GenerationRequest, request_id: str, tokenizer: ModelTokenizer
    ) -> Reply: ...

    def stream_error(self, error: ApiError) -> list[StreamEvent]:
        """An error in a stream opened before any reply exists (the stream's headers went out
        while its model loaded, router/http/generate.py), in this API's shape."""
        ...
