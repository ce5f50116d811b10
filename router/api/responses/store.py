"""The router's memory of /v1/responses replies (`store: true`), for `previous_response_id`,
`GET`/`DELETE /v1/responses/{id}` and `.../input_items`.

Bounded by count (the oldest goes first) and by age; held in this process only, so a router
restart forgets every stored response (docs/api.md). Parsing may run in the tokenize pool
while the event loop stores replies: one lock guards the table. With API keys, each entry
belongs to the key that stored it (its fingerprint): requests see the store through
`scoped(owner)`, and another key's entries are as absent as unknown ones.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from router.errors import ApiError, bad_request


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the whole response object, as GET returns it
    input_items: tuple[dict, ...]  # this request's own input items, with ids
    context: tuple[dict, ...]  # every item a continuation prepends: history, input, output
    stored_at: float
    cache_key: str | None = None  # the routing key its conversation was sent by
    owner: str | None = None  # the API key (fingerprint) that stored it; None: keys are off


class ResponseStore:
    def __init__(self, size: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self._size = size
        self._ttl_s = ttl_s
        self._clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)

    def put(
        self,
        response: dict,
        input_items: list[dict],
        history: tuple[dict, ...],
        cache_key: str | None = None,
        owner: str | None = None,
    ) -> None:
        """Keep `response` (evicting the oldest past the size limit); a size of 0 keeps none."""
        context = (*history, *input_items, *response["output"])
        entry = StoredResponse(
            response, tuple(input_items), context, self._clock(), cache_key, owner
        )
        with self._lock:
            self._items[response["id"]] = entry
            self._items.move_to_end(response["id"])
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def get(self, response_id: str, owner: str | None = None) -> StoredResponse | None:
        """The entry `owner` stored under `response_id`, or None (another owner's too)."""
        with self._lock:
            self._expire()
            stored = self._items.get(response_id)
            return stored if stored is not None and stored.owner == owner else None

    def delete(self, response_id: str, owner: str | None = None) -> bool:
        with self._lock:
            self._expire()
            stored = self._items.get(response_id)
            if stored is None or stored.owner != owner:
                return False
            del self._items[response_id]
            return True

    def scoped(self, owner: str | None) -> ScopedStore:
        """The store as the API key `owner` sees it (None: keys are off, one shared store)."""
        return ScopedStore(self, owner)

    def _expire(self) -> None:
        """Drop entries older than the age limit (they are in insertion order: oldest first)."""
        horizon = self._clock() - self._ttl_s
        while self._items:
            oldest = next(iter(self._items.values()))
            if oldest.stored_at >= horizon:
                return
            self._items.popitem(last=False)


class ScopedStore:
    """One API key's view of a `ResponseStore`: what it stores is its own, and it finds
    (reads, deletes, continues) nothing else."""

    def __init__(self, store: ResponseStore, owner: str | None):
        self._store, self._owner = store, owner

    def put(
        self,
        response: dict,
        input_items: list[dict],
        history: tuple[dict, ...],
        cache_key: str | None = None,
    ) -> None:
        self._store.put(response, input_items, history, cache_key, self._owner)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._store.get(response_id, self._owner)

    def delete(self, response_id: str) -> bool:
        return self._store.delete(response_id, self._owner)


def not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", code="not_found")


def previous_not_found(response_id: str) -> ApiError:
    return bad_request(
        f"Previous response with id '{response_id}' not found (never stored, deleted, or "
        "forgotten: the router keeps responses in memory, bounded in count and age)",
        "previous_response_id",
        "previous_response_not_found",
    )


def input_items_page(stored: StoredResponse, query: dict[str, str]) -> dict:
    """GET .../input_items: OpenAI's list shape; `order` (default desc), `after`, `limit`."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'", "order")
    limit_text = query.get("limit", "20")
    if not (limit_text.isascii() and limit_text.isdigit() and 1 <= int(limit_text) <= 100):
        raise bad_request("'limit' must be an integer from 1 to 100", "limit")
    items = list(stored.input_items)
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"'after' names no input item of this response: {after!r}", "after")
        items = items[ids.index(after) + 1 :]
    page = items[: int(limit_text)]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > len(page),
    }
