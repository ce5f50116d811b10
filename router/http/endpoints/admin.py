"""The admin API: the catalog's models and the hosts (GET), load, pull, unload and pin (POST).

An admin key (`[router] admin_keys`, as `Authorization: Bearer KEY`) is required when any is
set; with none set only clients on this machine (loopback) may call it. The API keys of
ordinary clients do not open it (router/http/security.py leaves /v1/admin/ to this check).
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from router.errors import ApiError, bad_request
from router.http import app_keys
from router.http.body import json_object_body
from router.placement import operator

PREFIX = "/v1/admin/"


def _require_admin(request: web.Request) -> None:
    keys = request.app[app_keys.CONFIG].admin_keys
    if keys:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
        if not any(hmac.compare_digest(given, key) for key in keys):
            raise ApiError(
                401,
                "the admin API needs an admin key (Authorization: Bearer KEY)",
                code="invalid_admin_key",
                type="authentication_error",
            )
        return
    try:
        local = ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        local = False
    if not local:
        raise ApiError(
            403,
            "the admin API is open to this machine only: set [router] "
            "admin_keys to use it from elsewhere",
            code="admin_only_local",
            type="permission_error",
        )


async def catalog(request: web.Request) -> web.Response:
    """GET /v1/admin/models: every catalog model's state, and every host's budget."""
    _require_admin(request)
    demand = request.app[app_keys.DEMAND]
    models = [
        {"id": m} | operator.model_json(demand, m) | _failure_detail(demand.entries[m])
        for m in demand.entries
    ]
    return web.json_response({"models": models, "hosts": operator.hosts_json(demand)})


def _failure_detail(entry) -> dict:
    """The host's whole report of the model's last failed load (its worker's log tail, the
    traceback): for the operator, not in the one-line `failure` clients read."""
    return {"failure_detail": entry.failure_detail or None}


async def load(request: web.Request) -> web.Response:
    _require_admin(request)
    demand = request.app[app_keys.DEMAND]
    return web.json_response(operator.load(demand, _model(request)), status=202)


async def pull(request: web.Request) -> web.Response:
    """A Hub model's files fetched onto a host, no worker started (202: follow its
    `fetching` and `held_on` in GET /v1/admin/models)."""
    _require_admin(request)
    demand = request.app[app_keys.DEMAND]
    return web.json_response(operator.pull(demand, _model(request)), status=202)


async def unload(request: web.Request) -> web.Response:
    _require_admin(request)
    demand = request.app[app_keys.DEMAND]
    return web.json_response(operator.unload(demand, _model(request)), status=202)


async def pin(request: web.Request) -> web.Response:
    """POST /v1/admin/models/{model}/pin {"pinned": true|false} (absent body: true)."""
    _require_admin(request)
    body = await json_object_body(request) if request.can_read_body else {}
    pinned = body.get("pinned", True)
    if type(pinned) is not bool:
        raise bad_request("'pinned' must be a boolean", "pinned")
    demand = request.app[app_keys.DEMAND]
    return web.json_response(operator.pin(demand, _model(request), pinned))


def _model(request: web.Request) -> str:
    """The catalog id the path names (an alias names it too)."""
    name = request.match_info["model"]
    served = request.app[app_keys.MODELS].get(name)
    return served.id if served is not None else name
