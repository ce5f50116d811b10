"""The one server-sent-events writer: `data: {...}` lines (OpenAI, ending in `data: [DONE]`)
and `event: name` + `data:` pairs (Anthropic), whatever the API adapter returns."""

from __future__ import annotations

import json
from collections.abc import Iterable

from aiohttp import web

from router.api.adapter import StreamEvent
from router.errors import ApiError

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Send the headers of an event stream; from here on errors go in the stream."""
    response = web.StreamResponse(headers=HEADERS)
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, events: Iterable[StreamEvent]) -> None:
    for event in events:
        data = event.data if isinstance(event.data, str) else json.dumps(event.data)
        head = f"event: {event.name}\n" if event.name is not None else ""
        await response.write(f"{head}data: {data}\n\n".encode())


async def send_error(request: web.Request, response: web.StreamResponse, error: ApiError) -> None:
    """`error` in an open stream, shaped as the request's API shapes stream errors."""
    if request.path.endswith("/messages"):
        events = [StreamEvent({"type": "error", "error": error.anthropic_body()["error"]}, "error")]
    elif request.path.endswith("/responses"):
        fields = {"code": error.code, "message": error.message, "param": error.param}
        events = [StreamEvent({"type": "error"} | fields, "error")]
    else:
        events = [StreamEvent(error.body()), StreamEvent("[DONE]")]
    try:
        await send(response, events)
        await response.write_eof()
    except ConnectionResetError:
        pass
