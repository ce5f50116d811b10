"""The one server-sent-events writer: `data: {...}` lines (OpenAI, ending in `data: [DONE]`)
and `event: name` + `data:` pairs (Anthropic), whatever the API adapter returns; or, for a
request whose endpoint set `request[LINES]` to a content type (Ollama's NDJSON), one JSON
object per line and no comments."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from router.api.adapter import StreamEvent

EVENT_STREAM = "text/event-stream"
HEADERS = {"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache"}
# request[LINES]: the content type of a stream written as JSON lines instead of events
LINES = web.RequestKey("stream_lines", str) if hasattr(web, "RequestKey") else "mlx_fleet.lines"


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Send the headers of an event stream; from here on errors go in the stream."""
    lines = request.get(LINES)
    headers = HEADERS if lines is None else HEADERS | {"Content-Type": lines}
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, events: Iterable[StreamEvent]) -> None:
    lines = response.content_type != EVENT_STREAM
    for event in events:
        data = event.data if isinstance(event.data, str) else json.dumps(event.data)
        if lines:
            await response.write(f"{data}\n".encode())
            continue
        head = f"event: {event.name}\n" if event.name is not None else ""
        await response.write(f"{head}data: {data}\n\n".encode())


async def comment(response: web.StreamResponse, text: str) -> None:
    """A comment line, which event-stream clients skip; JSON lines have none: nothing."""
    if response.content_type == EVENT_STREAM:
        await response.write(f": {text}\n\n".encode())


async def end_with(response: web.StreamResponse, events: Iterable[StreamEvent]) -> None:
    """Send `events` (an API's error, `Api.stream_error`) and end the stream; a client that
    left is no error."""
    try:
        await send(response, events)
        await response.write_eof()
    except ConnectionResetError:
        pass
