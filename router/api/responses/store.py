"""Stored /v1/responses replies (`store: true`), for `previous_response_id`,
`GET`/`DELETE /v1/responses/{id}` and `.../input_items`: what an entry is, the interface of the
stores that keep them (router/store/: SQLite by default, memory, or a shared Redis), and one
request's view of them.

Every store is bounded by count and bytes (the oldest go first) and by age. With API keys, each
entry belongs to the key that stored it (its fingerprint): another key's entries are as absent
as unknown ones. This package does no I/O, so a request sees the store through a `ScopedStore`:
the HTTP layer loads the entry its `previous_response_id` names before parsing (parsing may run
in the tokenize pool), and writes the reply it keeps before the client sees the reply's end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from router.errors import ApiError, bad_request


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the whole response object, as GET returns it
    input_items: tuple[dict, ...]  # this request's own input items, with ids
    context: tuple[dict, ...]  # every item a continuation prepends: history, input, output
    stored_at: float = 0.0  # wall-clock seconds; the store sets it when it keeps the entry
    cache_key: str | None = None  # the routing key its conversation was sent by
    owner: str | None = None  # the API key (fingerprint) that stored it; None: keys are off

    @property
    def id(self) -> str:
        return self.response["id"]


class ResponseStore(Protocol):
    """Where stored replies live. Each method may do I/O; each may be awaited on the event loop
    (router/store/ says what each backend costs)."""

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        """The live entry `owner` stored under `response_id`; None for another owner's."""
        ...

    async def put(self, entry: StoredResponse) -> None:
        """Keep `entry` (stamped with the store's clock), then drop the oldest past the
        bounds; an entry bigger than the byte bound alone is not kept. Mutates."""
        ...

    async def delete(self, response_id: str, owner: str | None) -> bool:
        """Forget `owner`'s entry; False when there was none. Mutates."""
        ...

    async def count(self) -> int:
        """Live entries, every owner's."""
        ...

    async def close(self) -> None: ...


@dataclass
class ScopedStore:
    """One request's view of the store as its API key (`owner`) sees it: the entries loaded
    for it (the one its previous_response_id names) and the replies it keeps (`pending`), which
    the HTTP layer writes. No I/O here, so parsing may run in any thread."""

    owner: str | None
    loaded: dict[str, StoredResponse] = field(default_factory=dict)
    pending: list[StoredResponse] = field(default_factory=list)

    def put(
        self,
        response: dict,
        input_items: list[dict],
        history: tuple[dict, ...],
        cache_key: str | None = None,
    ) -> None:
        context = (*history, *input_items, *response["output"])
        entry = StoredResponse(
            response, tuple(input_items), context, cache_key=cache_key, owner=self.owner
        )
        self.pending.append(entry)

    def get(self, response_id: str) -> StoredResponse | None:
        return self.loaded.get(response_id)


def not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", code="not_found")


def previous_not_found(response_id: str) -> ApiError:
    return bad_request(
        f"Previous response with id '{response_id}' not found (never stored, deleted, or "
        "expired: the store keeps responses bounded in count, bytes and age)",
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
