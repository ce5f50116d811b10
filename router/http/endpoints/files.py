"""OpenAI's Files API for batches: upload (multipart, purpose "batch"), list, retrieve, the
content, delete. Each file belongs to the API key that uploaded it; its metadata and content
live in the router's store (router/store/records.py; the fleet's Redis with state_url)."""

from __future__ import annotations

import time

from aiohttp import web

from router.api.batch.inputs import check_upload
from router.api.batch.objects import (
    FILE,
    FILE_PURPOSES,
    file_record,
    new_id,
    not_found,
    page,
    public,
)
from router.errors import ApiError, bad_request
from router.http import app_keys
from router.http.security import KEY_ID


async def owned_file(request: web.Request, file_id: str) -> dict:
    """The file `file_id` as the request's key sees it: 404 for another key's."""
    record = await request.app[app_keys.RECORDS].get(FILE, file_id)
    if record is None or record["owner"] != request.get(KEY_ID):
        raise not_found("file", file_id)
    return record


async def upload(request: web.Request) -> web.Response:
    config = request.app[app_keys.CONFIG]
    purpose, name, data = await _form(request, config.batch_file_max_bytes)
    if purpose not in FILE_PURPOSES:
        raise bad_request(
            f"'purpose' must be one of {', '.join(FILE_PURPOSES)} (files serve the Batch API here)",
            "purpose",
            "invalid_value",
        )
    check_upload(data, purpose, config.batch_file_max_bytes, config.batch_file_max_lines)
    file_id = new_id("file-")
    record = file_record(file_id, name, purpose, len(data), int(time.time()), request.get(KEY_ID))
    records = request.app[app_keys.RECORDS]
    await records.put_blob(file_id, data)  # the content first: a listed file can be read
    await records.put(FILE, file_id, record)
    return web.json_response(public(record))


async def list_files(request: web.Request) -> web.Response:
    owner, purpose = request.get(KEY_ID), request.query.get("purpose")
    files = [
        public(f)
        for f in await request.app[app_keys.RECORDS].values(FILE)
        if f["owner"] == owner and purpose in (None, f["purpose"])
    ]
    query = {"limit": 10_000, **request.query}
    return web.json_response(page(files, query))


async def retrieve(request: web.Request) -> web.Response:
    return web.json_response(public(await owned_file(request, request.match_info["id"])))


async def content(request: web.Request) -> web.Response:
    file_id = request.match_info["id"]
    await owned_file(request, file_id)
    data = await request.app[app_keys.RECORDS].get_blob(file_id)
    if data is None:
        raise not_found("file", file_id)
    return web.Response(body=data, content_type="application/octet-stream")


async def delete(request: web.Request) -> web.Response:
    file_id = request.match_info["id"]
    await owned_file(request, file_id)
    records = request.app[app_keys.RECORDS]
    await records.delete(FILE, file_id)
    await records.delete_blob(file_id)
    return web.json_response({"id": file_id, "object": "file", "deleted": True})


async def _form(request: web.Request, max_bytes: int) -> tuple[str | None, str, bytes]:
    """The upload's `purpose` and `file` (its name and bytes, read no further than the bound)."""
    if not request.content_type.startswith("multipart/"):
        raise bad_request("upload a file as multipart/form-data (fields 'file' and 'purpose')")
    purpose, name, data = None, "", None
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if part.name == "purpose":
            purpose = (await part.read(decode=True)).decode("utf-8", "replace")
        elif part.name == "file":
            name, data = part.filename or "upload.jsonl", await _bounded(part, max_bytes)
    if data is None:
        raise bad_request("'file' is required", "file", "missing_required_parameter")
    if purpose is None:
        raise bad_request("'purpose' is required", "purpose", "missing_required_parameter")
    return purpose, name, data


async def _bounded(part, max_bytes: int) -> bytes:
    chunks, size = [], 0
    while chunk := await part.read_chunk(1 << 20):
        size += len(chunk)
        if size > max_bytes:
            message = f"the file is over {max_bytes} bytes, the most accepted"
            raise ApiError(413, message, "file", "file_too_large")
        chunks.append(chunk)
    return b"".join(chunks)
