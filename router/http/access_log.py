"""The router's access log: one line per request a person wants to read.

Polls (a successful GET of /health, /v1/cluster, /v1/admin/models, /metrics or the fleet page:
launch-cluster waits for its workers twice a second, the fleet page refreshes every second,
Prometheus scrapes) go at DEBUG, so the INFO log holds what happened. With [router] log_requests every
other request is one JSON line (request id, model, status, tokens, timing); without, one short
text line.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from router.http import app_keys
from router.http.security import KEY_ID

POLL_PATHS = frozenset(
    {"/health", "/v1/cluster", "/v1/admin/models", "/metrics", "/", "/dashboard"}
)
# request[NOTES]: what the handler learnt (request_id, model, tokens), for the log line
NOTES = web.RequestKey("notes", dict) if hasattr(web, "RequestKey") else "mlx_fleet.notes"

log = logging.getLogger("router.access")


def note(request: web.Request, **fields) -> None:
    """Add `fields` to the request's access-log line."""
    request.setdefault(NOTES, {}).update(fields)


class AccessLogger(AbstractAccessLogger):
    """web.run_app(access_log_class=AccessLogger): aiohttp calls `log` once per request."""

    def log(self, request, response, time: float) -> None:
        try:
            if request.method == "GET" and request.path in POLL_PATHS and response.status < 400:
                log.debug(
                    "%s %s %s %d", request.remote, request.method, request.path, response.status
                )
                return
            fields = request.get(NOTES, {})
            if request.app[app_keys.CONFIG].log_requests:
                log.info(json.dumps(request_line(request, response.status, time, fields)))
                return
            model = f" {fields['model']}" if "model" in fields else ""
            log.info(
                "%s %s %s %d%s %.3fs",
                request.remote,
                request.method,
                request.path,
                response.status,
                model,
                time,
            )
        except Exception:  # a log line must never fail a request
            log.exception("could not write the access log line")


def request_line(request, status: int, seconds: float, fields: dict) -> dict:
    """One request as its JSON log line: its id (the response's `id`), model and tokens
    where it generated, who sent it (key fingerprint, address) and how long it took."""
    line = {
        "request_id": fields.get("request_id"),
        "method": request.method,
        "path": request.path,
        "status": status,
        "model": fields.get("model"),
        "prompt_tokens": fields.get("prompt_tokens"),
        "completion_tokens": fields.get("completion_tokens"),
        "cached_tokens": fields.get("cached_tokens"),
        "stream": fields.get("stream"),
        "duration_s": round(seconds, 4),
        "key": request.get(KEY_ID),
        "remote": request.remote,
    }
    return {name: value for name, value in line.items() if value is not None}
