"""Responses output shapes: the response object, its output items (reasoning, message,
function_call), usage, and the status a finish reason gives."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.api.responses.parse import ResponsesRequest
    from router.chat.output import ReplyEvent
    from router.errors import ApiError
    from router.text.pieces import UsageCount


def response_object(
    response_id: str,
    req: ResponsesRequest,
    created_at: int,
    status: str,
    output: list[dict],
    usage: dict | None = None,
    error: ApiError | None = None,
) -> dict:
    """The response object. OpenAI's schema types `usage` and `user` as optional but never
    null: until a response finishes, and when the request named no user, they are left out."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    body = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": _error_json(error) if error is not None else None,
        "incomplete_details": incomplete,
        "model": req.model,
        "output": output,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        **({"usage": usage} if usage is not None else {}),
        **req.context.echo,
    }
    if body.get("user") is None:
        body.pop("user", None)
    return body


# The codes of OpenAI's ResponseErrorCode that can describe our failures; the `error` event
# before response.failed carries our own code, which the schema leaves free.
RESPONSE_ERROR_CODES = ("server_error", "rate_limit_exceeded", "invalid_prompt")


def _error_json(error: ApiError) -> dict:
    code = error.code if error.code in RESPONSE_ERROR_CODES else "server_error"
    return {"code": code, "message": error.message}


def now() -> int:
    return int(time.time())


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def usage_json(usage: UsageCount, reasoning_tokens: int) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        # we keep no paid cache tier, so no prompt token is ever billed as a cache write
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


# ------------------------------------------------------------ items


def message_item(item_id: str, text: str, status: str) -> dict:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [text_part(text)] if status != "in_progress" else [],
    }


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "content": content}


def call_item(item_id: str, e: ReplyEvent, status: str) -> dict:
    arguments = e.call.arguments if status != "in_progress" else ""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": e.call_id,
        "name": e.call.name,
        "arguments": arguments,
        "status": status,
    }
