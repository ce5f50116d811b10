"""The KV events a worker owes the router, kept between two heartbeats.

The radix cache reports what it stores and removes, and the state pool its snapshots. What
the disk tier changes is the KV manager's to say (it owns the tier): a block evicted to disk
is still this worker's, so the engine passes on only what the manager says left the worker
(`KVManager.left_the_worker`); at start the disk's blocks from an earlier run are announced
(`stored`), and its own removals join each drain."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from shared.kv_events import BlockRemoved, BlockStored, KVEvent

if TYPE_CHECKING:
    from worker.kv.disk_store import StoredBlock


class KVEventLog:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self._events: list[KVEvent] = []

    def record(self, event: KVEvent) -> None:
        self._events.append(event)

    def stored(self, blocks: Iterable[StoredBlock]) -> None:
        """Blocks this worker holds that no event announced (the disk's, at start)."""
        for block in blocks:
            self._events.append(
                BlockStored(block.block_hash, block.parent_hash, block.token_ids, self.block_size)
            )

    def drain(self, removed: Iterable[int] = ()) -> list[KVEvent]:
        """Every event since the last drain, then the removal of `removed` (the disk's)."""
        if removed := tuple(removed):
            self._events.append(BlockRemoved(removed))
        events, self._events = self._events, []
        return events

    def clear(self) -> None:
        self._events.clear()
