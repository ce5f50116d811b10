"""Middlewares: OpenAI-style JSON for every error, and per-endpoint request metrics."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from router import keys
from router.errors import ApiError, body_too_large

log = logging.getLogger(__name__)


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPException as e:  # unknown route, wrong method, body too large...
        if e.status < 400:
            raise
        if e.status == 413:  # a chunked body over client_max_size
            return body_too_large(request.app[keys.CONFIG].max_body_bytes).response()
        code = "not_found" if e.status == 404 else None
        return ApiError(e.status, e.reason, code=code).response()
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return ApiError(500, "internal server error", type="server_error").response()


@web.middleware
async def count_requests(request: web.Request, handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    route = request.match_info.route.resource
    endpoint = route.canonical if route is not None else "unmatched"
    request.app[keys.METRICS].request_done(endpoint, response.status, time.perf_counter() - started)
    return response
