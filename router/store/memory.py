"""The stored replies in this process's memory (`responses_store = "memory"`): a restart
forgets them. Bounded like every store, by count, bytes (each entry's encoded size) and age."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from router.api.responses.store import StoredResponse
from router.store.codec import encode


class MemoryResponses:
    def __init__(
        self, size: int, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.time
    ):
        self._size, self._max_bytes, self._ttl_s = size, max_bytes, ttl_s
        self.clock = clock  # injectable: tests move time without sleeping
        self._items: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._bytes = 0

    async def total_bytes(self) -> int:
        return self._bytes

    async def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        self._expire()
        found = self._items.get(response_id)
        return found[0] if found is not None and found[0].owner == owner else None

    async def put(self, entry: StoredResponse) -> None:
        entry = replace(entry, stored_at=self.clock())
        size = len(encode(entry))
        self._drop(entry.id)
        if size > self._max_bytes or self._size == 0:
            return
        self._items[entry.id] = (entry, size)
        self._bytes += size
        self._expire()
        while len(self._items) > self._size or self._bytes > self._max_bytes:
            self._drop(next(iter(self._items)))

    async def delete(self, response_id: str, owner: str | None) -> bool:
        if await self.get(response_id, owner) is None:
            return False
        self._drop(response_id)
        return True

    async def count(self) -> int:
        self._expire()
        return len(self._items)

    async def close(self) -> None:
        pass

    def _drop(self, response_id: str) -> None:
        found = self._items.pop(response_id, None)
        if found is not None:
            self._bytes -= found[1]

    def _expire(self) -> None:
        """Drop entries older than the age limit (in insertion order: oldest first)."""
        horizon = self.clock() - self._ttl_s
        while self._items:
            oldest_id, (oldest, _) = next(iter(self._items.items()))
            if oldest.stored_at >= horizon:
                return
            self._drop(oldest_id)
