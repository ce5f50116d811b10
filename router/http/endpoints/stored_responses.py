"""The stored /v1/responses replies (router/api/responses/store.py): GET, DELETE, their input
items, and cancel (background mode is not supported, so nothing is ever cancellable)."""

from __future__ import annotations

from aiohttp import web

from router.api.responses.store import ScopedStore, StoredResponse, input_items_page, not_found
from router.errors import bad_request
from router.http import app_keys
from router.http.security import KEY_ID


def responses_of(request: web.Request) -> ScopedStore:
    """The stored responses the request's API key may see: its own (all, without keys)."""
    return request.app[app_keys.RESPONSES].scoped(request.get(KEY_ID))


def _stored(request: web.Request) -> StoredResponse:
    response_id = request.match_info["id"]
    stored = responses_of(request).get(response_id)
    if stored is None:
        raise not_found(response_id)
    return stored


async def get(request: web.Request) -> web.Response:
    return web.json_response(_stored(request).response)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["id"]
    if not responses_of(request).delete(response_id):
        raise not_found(response_id)
    return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    return web.json_response(input_items_page(_stored(request), dict(request.query)))


async def cancel(request: web.Request) -> web.Response:
    _stored(request)
    raise bad_request(
        "only background responses can be cancelled, and background mode is not supported; "
        "a streaming response ends when its client closes the connection"
    )
