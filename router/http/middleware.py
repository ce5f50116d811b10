"""Middlewares: OpenAI-style JSON for every error, and per-endpoint request metrics."""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from router.errors import ApiError, body_too_large
from router.http import app_keys

log = logging.getLogger(__name__)

ANTHROPIC_PATH = "/v1/messages"
OLLAMA_PATH = "/api/"


def error_response(error: ApiError, shape: str = "openai") -> web.Response:
    """An ApiError as its JSON response: OpenAI's error shape, Anthropic's, or Ollama's
    (`{"error": message}`)."""
    if shape == "anthropic":
        body = error.anthropic_body()
    elif shape == "ollama":
        body = {"error": error.message}
    else:
        body = error.body()
    return web.json_response(body, status=error.status, dumps=json.dumps, headers=error.headers)


def _shape(path: str) -> str:
    """The error shape the clients of `path` expect."""
    if path.startswith(ANTHROPIC_PATH):
        return "anthropic"
    return "ollama" if path.startswith(OLLAMA_PATH) else "openai"


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    shape = _shape(request.path)  # its clients expect its error shape
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e, shape)
    except web.HTTPException as e:  # unknown route, wrong method, body too large...
        if e.status < 400:
            raise
        if e.status == 413:  # a chunked body over client_max_size
            limit = request.app[app_keys.CONFIG].max_body_bytes
            return error_response(body_too_large(limit), shape)
        code = "not_found" if e.status == 404 else None
        return error_response(ApiError(e.status, e.reason, code=code), shape)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        error = ApiError(500, "internal server error", type="server_error")
        return error_response(error, shape)


@web.middleware
async def count_requests(request: web.Request, handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    route = request.match_info.route.resource
    endpoint = route.canonical if route is not None else "unmatched"
    request.app[app_keys.METRICS].request_done(
        endpoint, response.status, time.perf_counter() - started
    )
    return response
