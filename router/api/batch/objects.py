"""File and batch objects as OpenAI's API shows them, their ids and list pages, and the store
interface they live in.

What a store keeps per object is a plain dict: the public fields plus `owner` (the API key's
fingerprint; None when keys are off), which `public` leaves out. Another key's objects are as
absent as unknown ones (a 404).
"""

from __future__ import annotations

import secrets
from typing import Protocol

from router.errors import ApiError, bad_request

FILE_PURPOSES = ("batch",)  # what a client may upload (OpenAI's others are not served here)
OUTPUT_PURPOSE = "batch_output"  # of the files the runner writes
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
COMPLETION_WINDOWS = {"24h": 24 * 3600}
# statuses in which a runner still has work (validating -> in_progress -> finalizing)
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
DONE = ("completed", "failed", "expired", "cancelled")
MAX_METADATA = 16  # pairs, as OpenAI (keys up to 64 characters, values up to 512)

FILE = "file"  # record kinds
BATCH = "batch"
CANCEL = "batch_cancel"  # a cancel asked for (its own record: only the runner writes a batch)


def lines_of(batch_id: str) -> str:
    """The record kind of a batch's answered lines (one record per input line, by index)."""
    return f"batch_lines:{batch_id}"


class Records(Protocol):
    """Where files, batches and a batch's progress live (router/store/records.py: SQLite or
    memory; redis_records.py: the fleet's shared Redis). Each method may do I/O."""

    async def put(self, kind: str, key: str, value: dict) -> None: ...
    async def get(self, kind: str, key: str) -> dict | None: ...
    async def values(self, kind: str) -> list[dict]:
        """Every record of `kind`, in no particular order."""
        ...

    async def count(self, kind: str) -> int: ...
    async def delete(self, kind: str, key: str) -> bool: ...
    async def drop(self, kind: str) -> None:
        """Delete every record of `kind`."""
        ...

    async def put_blob(self, key: str, data: bytes) -> None: ...
    async def get_blob(self, key: str) -> bytes | None: ...
    async def delete_blob(self, key: str) -> None: ...
    async def claim(self, name: str, holder: str, ttl_s: float) -> bool:
        """Hold the lease `name` for `ttl_s` seconds (or renew it) unless another holder has
        it: one router runs a batch at a time."""
        ...

    async def close(self) -> None: ...


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `file-...`, `batch_...`, `batch_req_...` (the prefix says which)."""
    return prefix + secrets.token_hex(12)


PRIVATE = ("owner", "ending")  # kept in a record, never shown


def public(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in PRIVATE}


def file_record(file_id: str, name: str, purpose: str, size: int, now: int, owner) -> dict:
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": now,
        "expires_at": None,
        "filename": name,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
        "owner": owner,
    }


def batch_record(body: dict, batch_id: str, now: int, owner) -> dict:
    """A new batch from a checked create body (`check_create`)."""
    window = body["completion_window"]
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": body["endpoint"],
        "errors": None,
        "input_file_id": body["input_file_id"],
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + COMPLETION_WINDOWS[window],
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": body.get("metadata"),
        "owner": owner,
    }


def shown(batch: dict, cancel: dict | None) -> dict:
    """The batch as a client sees it: a cancel asked for and not yet taken up by its runner
    shows as `cancelling` (the runner alone writes the batch's record)."""
    view = public(batch)
    if cancel is not None and batch["status"] in ("validating", "in_progress", "finalizing"):
        view["status"], view["cancelling_at"] = "cancelling", cancel["at"]
    return view


def check_create(body: dict) -> dict:
    """POST /v1/batches's body, checked (400s naming the field)."""
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise bad_request(f"'{name}' is required and must be a string", name)
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    if unknown:
        raise bad_request(f"unknown parameter '{unknown[0]}'", unknown[0], "unknown_parameter")
    if body["endpoint"] not in ENDPOINTS:
        raise bad_request(
            f"'endpoint' must be one of {', '.join(ENDPOINTS)}", "endpoint", "invalid_value"
        )
    if body["completion_window"] not in COMPLETION_WINDOWS:
        raise bad_request("'completion_window' must be '24h'", "completion_window", "invalid_value")
    metadata = body.get("metadata")
    if metadata is not None and not _good_metadata(metadata):
        raise bad_request(
            f"'metadata' must be an object of at most {MAX_METADATA} string values (keys up "
            "to 64 characters, values up to 512)",
            "metadata",
            "invalid_value",
        )
    return body


def _good_metadata(metadata) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= MAX_METADATA
        and all(isinstance(k, str) and len(k) <= 64 for k in metadata)
        and all(isinstance(v, str) and len(v) <= 512 for v in metadata.values())
    )


def page(objects: list[dict], query: dict, default_order: str = "desc") -> dict:
    """A list page as OpenAI's (`after`, `limit` 1..10000, `order` by created_at), newest
    first by default; objects are public dicts."""
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        raise bad_request("'limit' must be an integer", "limit") from None
    if not 1 <= limit <= 10_000:
        raise bad_request("'limit' must be between 1 and 10000", "limit")
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'", "order")
    ordered = sorted(objects, key=lambda o: (o["created_at"], o["id"]), reverse=order == "desc")
    after = query.get("after")
    if after is not None:
        ids = [o["id"] for o in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No such {kind}: '{object_id}'", code="not_found")
