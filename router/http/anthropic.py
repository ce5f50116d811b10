"""POST /v1/messages: Anthropic Messages responses, whole and as server-sent events.

The generation core is the OpenAI endpoints' own (dispatcher, pieces, ChatReader); only the
shapes differ: content blocks (text / thinking / tool_use), stop_reason, and the event stream
message_start, ping, content_block_start/delta/stop, message_delta, message_stop.
"""

from __future__ import annotations

import json
import uuid

from aiohttp import web

from router.api.anthropic.parse import parse_messages_request
from router.api.errors import ApiError
from router.api.openai.parse import GenerationRequest
from router.chat.output import ChatReader, ReplyEvent
from router.http import app_keys
from router.http.body import json_object_body
from router.http.endpoints import _count_usage, _start
from router.lifecycle import parse_off_loop
from router.text.pieces import UsageCount, pieces, usage_of

_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


async def messages(request: web.Request) -> web.StreamResponse:
    app = request.app
    body = await json_object_body(request)
    served = app[app_keys.MODELS].for_request(body)
    max_tokens_cap = app[app_keys.CONFIG].max_tokens_cap
    req = await parse_off_loop(
        app, parse_messages_request, body, served.tokenizer, served.id, max_tokens_cap
    )
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    job = _start(served, message_id, req)
    try:
        stream = pieces(job, served.tokenizer, served.dispatcher, req.stop)
        if req.stream:
            return await _stream(request, served, job, req, message_id, aiter(stream))
        return await _whole(served, job, req, message_id, stream)
    finally:
        served.dispatcher.cancel(job)


def stop_reason(reader: ChatReader, piece) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of the last piece."""
    if piece.stop_string is not None:
        return "stop_sequence", piece.stop_string
    if reader.num_calls:
        return "tool_use", None
    return _STOP_REASONS.get(piece.finish_reason, "end_turn"), None


def usage_json(usage: UsageCount) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def content_blocks(events: list[ReplyEvent]) -> list[dict]:
    """Consecutive events of one kind make one block; every call is its own tool_use block."""
    blocks: list[dict] = []
    for event in events:
        if event.kind == "tool_call":
            blocks.append(_tool_use_block(event, json.loads(event.call.arguments)))
        elif blocks and blocks[-1]["type"] == _BLOCK_TYPES[event.kind]:
            blocks[-1][_TEXT_KEYS[event.kind]] += event.text
        else:
            blocks.append(_empty_block(event.kind) | {_TEXT_KEYS[event.kind]: event.text})
    if any(b["type"] == "tool_use" for b in blocks):  # the separating whitespace goes too
        for block in blocks:
            if block["type"] == "text":
                block["text"] = block["text"].strip()
    return [b for b in blocks if b["type"] != "text" or b["text"]]


_BLOCK_TYPES = {"content": "text", "reasoning": "thinking"}
_TEXT_KEYS = {"content": "text", "reasoning": "thinking"}
_DELTA_TYPES = {"content": "text_delta", "reasoning": "thinking_delta"}


def _empty_block(kind: str) -> dict:
    if kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _tool_use_block(event: ReplyEvent, arguments: dict) -> dict:
    call_id = "toolu_" + event.call_id.removeprefix("call_")
    return {"type": "tool_use", "id": call_id, "name": event.call.name, "input": arguments}


def _message(message_id: str, req: GenerationRequest, content, reason, stop, usage) -> dict:
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


async def _whole(served, job, req: GenerationRequest, message_id: str, stream) -> web.Response:
    reader = ChatReader(req.tool_family, req.starts_in_reasoning)
    events = []
    async for piece in stream:
        events += reader.feed(piece.text)
        last = piece
    events += reader.finish()
    usage = usage_of(job)
    _count_usage(served, usage)
    reason, stop = stop_reason(reader, last)
    body = _message(message_id, req, content_blocks(events), reason, stop, usage_json(usage))
    return web.json_response(body)


async def _stream(request, served, job, req: GenerationRequest, message_id: str, stream):
    piece = await anext(stream)  # an error before the first token is a plain HTTP error
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    events = _EventWriter(response)
    usage = {"input_tokens": len(job.prompt_ids), "output_tokens": 0}
    start = _message(message_id, req, [], None, None, usage)
    try:
        await events.send("message_start", {"message": start})
        await events.send("ping", {})
        try:
            await _stream_reply(events, served, job, req, piece, stream)
        except ApiError as e:  # headers are sent: the error goes in the stream
            await events.send("error", {"error": e.anthropic_body()["error"]})
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left; messages() aborts the job
    return response


async def _stream_reply(events, served, job, req: GenerationRequest, piece, stream) -> None:
    reader = ChatReader(req.tool_family, req.starts_in_reasoning)
    blocks = _BlockStream(events)
    while True:
        done = piece.finish_reason is not None
        for event in reader.feed(piece.text) + (reader.finish() if done else []):
            await blocks.add(event)
        if done:
            break
        piece = await anext(stream)
    await blocks.close()
    usage = usage_of(job)
    _count_usage(served, usage)
    reason, stop = stop_reason(reader, piece)
    delta = {"stop_reason": reason, "stop_sequence": stop}
    await events.send("message_delta", {"delta": delta, "usage": usage_json(usage)})
    await events.send("message_stop", {})


class _EventWriter:
    def __init__(self, response: web.StreamResponse):
        self._response = response

    async def send(self, name: str, data: dict) -> None:
        payload = json.dumps({"type": name, **data})
        await self._response.write(f"event: {name}\ndata: {payload}\n\n".encode())


class _BlockStream:
    """Opens, fills and closes content blocks as reply events arrive."""

    def __init__(self, events: _EventWriter):
        self._events = events
        self._index = -1
        self._open_kind: str | None = None

    async def add(self, event: ReplyEvent) -> None:
        if event.kind == "tool_call":
            await self.close()
            block = _tool_use_block(event, {})
            await self._start(block)
            delta = {"type": "input_json_delta", "partial_json": event.call.arguments}
            await self._delta(delta)
            await self.close()
            return
        if self._open_kind != event.kind:
            await self.close()
            await self._start(_empty_block(event.kind))
            self._open_kind = event.kind
        key = _TEXT_KEYS[event.kind]
        await self._delta({"type": _DELTA_TYPES[event.kind], key: event.text})

    async def close(self) -> None:
        if self._index >= 0 and self._open_kind != "closed":
            await self._events.send("content_block_stop", {"index": self._index})
        self._open_kind = "closed"

    async def _start(self, block: dict) -> None:
        self._index += 1
        self._open_kind = "tool_call"
        await self._events.send(
            "content_block_start", {"index": self._index, "content_block": block}
        )

    async def _delta(self, delta: dict) -> None:
        await self._events.send("content_block_delta", {"index": self._index, "delta": delta})
