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
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": {"code": error.code or "server_error", "message": error.message}
        if error is not None
        else None,
        "incomplete_details": incomplete,
        "model": req.model,
        "output": output,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "usage": usage,
        **req.context.echo,
    }


def now() -> int:
    return int(time.time())


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def usage_json(usage: UsageCount, reasoning_tokens: int) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
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
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": content}  # fmt: skip


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
