"""OpenAI's Batch API: create, retrieve, list, cancel. The batches and their progress live in
the router's store (router/store/); router/http/batch_runner.py answers their lines."""

from __future__ import annotations

import time

from aiohttp import web

from router.api.batch.objects import (
    BATCH,
    CANCEL,
    DONE,
    batch_record,
    check_create,
    new_id,
    not_found,
    page,
    shown,
)
from router.errors import ApiError, bad_request
from router.http import app_keys
from router.http.body import json_object_body
from router.http.endpoints.files import owned_file
from router.http.security import KEY_ID


async def create(request: web.Request) -> web.Response:
    body = check_create(await json_object_body(request))
    source = await owned_file(request, body["input_file_id"])
    if source["purpose"] != "batch":
        message = f"the file '{source['id']}' has purpose '{source['purpose']}', not 'batch'"
        raise bad_request(message, "input_file_id", "invalid_value")
    record = batch_record(body, new_id("batch_"), int(time.time()), request.get(KEY_ID))
    await request.app[app_keys.RECORDS].put(BATCH, record["id"], record)
    request.app[app_keys.BATCH_RUNNER].wake()
    return web.json_response(shown(record, None))


async def retrieve(request: web.Request) -> web.Response:
    batch = await _owned(request)
    cancel = await request.app[app_keys.RECORDS].get(CANCEL, batch["id"])
    return web.json_response(shown(batch, cancel))


async def list_batches(request: web.Request) -> web.Response:
    records, owner = request.app[app_keys.RECORDS], request.get(KEY_ID)
    cancels = {c["id"]: c for c in await records.values(CANCEL)}
    batches = [
        shown(b, cancels.get(b["id"])) for b in await records.values(BATCH) if b["owner"] == owner
    ]
    return web.json_response(page(batches, dict(request.query)))


async def cancel(request: web.Request) -> web.Response:
    """Ask the batch's runner to stop: lines in flight are aborted, the answered ones kept
    (its output file), the others go to its error file as `batch_cancelled`."""
    batch = await _owned(request)
    if batch["status"] in DONE:
        message = f"the batch is {batch['status']}: only a batch still running can be cancelled"
        raise ApiError(409, message, code="batch_not_cancellable")
    records = request.app[app_keys.RECORDS]
    asked = await records.get(CANCEL, batch["id"])
    if asked is None:
        asked = {"id": batch["id"], "at": int(time.time())}
        await records.put(CANCEL, batch["id"], asked)
    request.app[app_keys.BATCH_RUNNER].wake()
    return web.json_response(shown(batch, asked))


async def _owned(request: web.Request) -> dict:
    batch_id = request.match_info["id"]
    batch = await request.app[app_keys.RECORDS].get(BATCH, batch_id)
    if batch is None or batch["owner"] != request.get(KEY_ID):
        raise not_found("batch", batch_id)
    return batch
