"""The one server-sent-events writer: `data: {...}` lines (OpenAI, ending in `data: [DONE]`)
and `event: name` + `data:` pairs (Anthropic), whatever the API adapter returns."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from router.api.adapter import StreamEvent

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


async def end_with(response: web.StreamResponse, events: Iterable[StreamEvent]) -> None:
    """Send `events` (an API's error, `Api.stream_error`) and end the stream; a client that
    left is no error."""
    try:
        await send(response, events)
        await response.write_eof()
    except ConnectionResetError:
        pass
