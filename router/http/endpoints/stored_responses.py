"""The stored /v1/responses replies (router/api/responses/store.py, kept by router/store/): GET,
DELETE, their input items, and cancel (background mode is not supported, so nothing is ever
cancellable); and the view a /v1/responses request has of them."""

from __future__ import annotations

from aiohttp import web

from router.api.responses.store import ScopedStore, StoredResponse, input_items_page, not_found
from router.errors import bad_request
from router.http import app_keys
from router.http.security import KEY_ID


async def view_for(request: web.Request, body: dict) -> ScopedStore:
    """The store as the request's API key sees it, with the entry its previous_response_id
    names loaded (parsing reports a missing one; a malformed one is parsing's to refuse)."""
    view = ScopedStore(request.get(KEY_ID))
    previous = body.get("previous_response_id")
    if isinstance(previous, str):
        stored = await request.app[app_keys.RESPONSES].get(previous, view.owner)
        if stored is not None:
            view.loaded[previous] = stored
    return view


async def keep(request: web.Request, view: ScopedStore) -> None:
    """Write the replies the request kept (`store: true`)."""
    store = request.app[app_keys.RESPONSES]
    while view.pending:
        await store.put(view.pending.pop(0))


async def _stored(request: web.Request) -> StoredResponse:
    response_id = request.match_info["id"]
    stored = await request.app[app_keys.RESPONSES].get(response_id, request.get(KEY_ID))
    if stored is None:
        raise not_found(response_id)
    return stored


async def get(request: web.Request) -> web.Response:
    return web.json_response((await _stored(request)).response)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["id"]
    if not await request.app[app_keys.RESPONSES].delete(response_id, request.get(KEY_ID)):
        raise not_found(response_id)
    return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    return web.json_response(input_items_page(await _stored(request), dict(request.query)))


async def cancel(request: web.Request) -> web.Response:
    await _stored(request)
    raise bad_request(
        "only background responses can be cancelled, and background mode is not supported; "
        "a streaming response ends when its client closes the connection"
    )
