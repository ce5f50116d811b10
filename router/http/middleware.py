"""Middlewares: OpenAI-style JSON for every error, and per-endpoint request metrics."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from router.api.errors import ApiError, body_too_large
from router.http import app_keys

log = logging.getLogger(__name__)

ANTHROPIC_PATH = "/v1/messages"


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    anthropic = request.path.startswith(ANTHROPIC_PATH)  # its clients expect its error shape
    try:
        return await handler(request)
    except ApiError as e:
        return e.response(anthropic)
    except web.HTTPException as e:  # unknown route, wrong method, body too large...
        if e.status < 400:
            raise
        if e.status == 413:  # a chunked body over client_max_size
            limit = request.app[app_keys.CONFIG].max_body_bytes
            return body_too_large(limit).response(anthropic)
        code = "not_found" if e.status == 404 else None
        return ApiError(e.status, e.reason, code=code).response(anthropic)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        error = ApiError(500, "internal server error", type="server_error")
        return error.response(anthropic)


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
