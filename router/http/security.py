"""HTTP-side security middlewares: API keys (Bearer or x-api-key), requests in flight per key, body limit.

`/health` stays open so load balancers and service checks need no key; every other path needs
one when keys are configured.
"""

from __future__ import annotations

import logging

from aiohttp import web

from router.errors import body_too_large, key_busy, missing_api_key, wrong_api_key
from router.http import app_keys

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health"})


@web.middleware
async def require_api_key(request: web.Request, handler) -> web.StreamResponse:
    api_keys = request.app[app_keys.API_KEYS]
    if not api_keys.enabled or request.path in OPEN_PATHS:
        return await handler(request)
    key_id = api_keys.identify(_bearer(request))
    if key_id is None:
        log.info("refused %s %s from %s: bad API key", request.method, request.path, request.remote)
        raise wrong_api_key() if _bearer(request) else missing_api_key()
    if not api_keys.can_start(key_id):
        raise key_busy(api_keys.limit)
    api_keys.start(key_id)
    try:  # a stream's handler returns when the stream ends: the slot is held until then
        return await handler(request)
    finally:
        api_keys.done(key_id)


@web.middleware
async def limit_body(request: web.Request, handler) -> web.StreamResponse:
    """Refuse a body declared too large before reading it; aiohttp's client_max_size (set to
    the same limit) stops a chunked one while it is read."""
    limit = request.app[app_keys.CONFIG].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise body_too_large(limit)
    return await handler(request)


def _bearer(request: web.Request) -> str:
    """The key presented as 'Authorization: Bearer KEY', or as 'x-api-key: KEY' (the
    Anthropic SDK's header)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    return request.headers.get("x-api-key", "").strip()
