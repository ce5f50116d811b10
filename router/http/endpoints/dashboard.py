"""The fleet page at `/` and `/dashboard`: one static HTML file shipped in the package
(router/http/endpoints/static/fleet.html: inline CSS and JS, no external assets). The page itself is
open; every call it makes (/v1/cluster each second, /v1/chat/completions) needs the API key
when keys are configured: it asks for the key and sends it as a bearer token. It sends the same
key to the admin API (/v1/admin/models each second, and its load/unload/pin buttons)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from aiohttp import web

PAGE_PATHS = ("/", "/dashboard")


@cache
def _page() -> bytes:
    return files("router.http.endpoints").joinpath("static/fleet.html").read_bytes()


async def fleet_page(request: web.Request) -> web.Response:
    return web.Response(
        body=_page(),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
