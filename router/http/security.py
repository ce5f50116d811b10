"""HTTP-side security middlewares: API keys (Bearer or x-api-key), requests in flight per key,
budgets per key (router/http/budgets.py), body limit.

`/health` stays open so load balancers and service checks need no key, and so does the fleet
page's HTML (`/`, `/dashboard`: it holds no data); every other path needs one when keys are
configured.
"""

from __future__ import annotations

import contextlib
import logging

from aiohttp import web

from router.errors import ApiError, body_too_large, key_busy, missing_api_key, wrong_api_key
from router.http import app_keys
from router.http.budgets import OverBudget

log = logging.getLogger(__name__)

ADMIN = "/v1/admin/"  # checked against the admin keys instead (router/http/endpoints/admin.py)
OPEN_PATHS = frozenset({"/health", "/", "/dashboard"})  # the fleet page: its calls need a key
# request[KEY_ID]: the fingerprint of the key a request came with (a typed key from aiohttp 3.14)
KEY_ID = web.RequestKey("key_id", str) if hasattr(web, "RequestKey") else "mlx_fleet.key_id"


@web.middleware
async def require_api_key(request: web.Request, handler) -> web.StreamResponse:
    api_keys = request.app[app_keys.API_KEYS]
    if not api_keys.enabled or request.path in OPEN_PATHS or request.path.startswith(ADMIN):
        return await handler(request)
    key_id = api_keys.identify(_bearer(request))
    if key_id is None:
        log.info("refused %s %s from %s: bad API key", request.method, request.path, request.remote)
        raise wrong_api_key() if _bearer(request) else missing_api_key()
    if not api_keys.can_start(key_id):
        raise key_busy(api_keys.limit)
    usage = request.app[app_keys.METRICS].keys
    try:
        await request.app[app_keys.BUDGETS].admit(key_id)
    except OverBudget as e:
        usage.refused(key_id, e.kind)
        raise
    usage.admitted(key_id)
    request[KEY_ID] = key_id  # for charge_tokens, and the x-ratelimit-* headers
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


async def add_ratelimit_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every response to a budgeted key carries x-ratelimit-* (a
    stream's too: this runs as its headers go out)."""
    key_id = request.get(KEY_ID)
    if key_id is None:
        return
    try:
        headers = await request.app[app_keys.BUDGETS].headers(key_id)
    except ApiError:  # the shared state server is down: the headers are advice, the reply not
        return
    for name, value in headers.items():
        response.headers.setdefault(name, value)


async def charge_tokens(request: web.Request, prompt: int, completion: int) -> None:
    """A finished request's tokens, to its key's budget and usage series."""
    key_id = request.get(KEY_ID)
    if key_id is None:
        return
    request.app[app_keys.METRICS].keys.tokens(key_id, prompt, completion)
    # the shared state server down (logged): the tokens go uncharged, the reply is not lost
    with contextlib.suppress(ApiError):
        await request.app[app_keys.BUDGETS].charge_tokens(key_id, prompt + completion)
