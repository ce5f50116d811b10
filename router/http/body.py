"""Reading a request body as JSON, refusing everything hostile with a 400 before any handler.

The rules (no NaN/Infinity, lone surrogates, integers beyond 64 bits, nesting past 64 levels)
are router/text/strict_json.py's; here they become 400s with a message saying what was wrong.
"""

from __future__ import annotations

from aiohttp import web

from router.errors import bad_request
from router.text import strict_json


def parse_json_text(raw: bytes) -> object:
    """The JSON value in `raw`, or ApiError(400) saying why it is refused."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8: {e}") from None
    try:
        return strict_json.loads(text)
    except strict_json.StrictJsonError as e:
        raise bad_request(f"the request body {e}") from None


# request[BODY]: the parsed body, so an endpoint that looks into it first parses it once
BODY = web.RequestKey("body", dict) if hasattr(web, "RequestKey") else "mlx_fleet.body"


async def json_object_body(request: web.Request) -> dict:
    """The request body as a JSON object; ApiError(400) for anything else."""
    if BODY in request:
        return request[BODY]
    body = parse_json_text(await _read(request))
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    request[BODY] = body
    return body


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.RequestPayloadError as e:  # e.g. Content-Encoding: gzip over bytes that are not
        reason = str(e).strip().splitlines()[-1].strip()  # "400, message:\n  <the reason>"
        raise bad_request(f"the request body could not be read: {reason}") from None
