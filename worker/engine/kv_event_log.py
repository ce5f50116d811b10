"""The KV events a worker owes the router, kept between two heartbeats.

The radix cache reports what it stores and removes; blocks evicted to the disk tier are still
this worker's (a later request reads them back), so their removal is not announced until the
disk itself drops them, and at start the disk's blocks from an earlier run are announced."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.kv_events import BlockRemoved, BlockStored, KVEvent

if TYPE_CHECKING:
    from worker.kv.disk_tier import DiskTier


class KVEventLog:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.disk: DiskTier | None = None  # set once the tier is open (it needs the cache)
        self._events: list[KVEvent] = []

    def record(self, event: KVEvent) -> None:
        """The radix cache's `on_event`: removals of blocks the disk keeps are dropped."""
        if isinstance(event, BlockRemoved) and self.disk is not None:
            kept = tuple(h for h in event.block_hashes if h not in self.disk.store)
            if not kept:
                return
            event = BlockRemoved(kept)
        self._events.append(event)

    def announce_disk_blocks(self) -> None:
        """Tell the router what the disk holds (a restarted worker's returning prefixes)."""
        if self.disk is None:
            return
        for block in self.disk.store.blocks():
            self._events.append(
                BlockStored(block.block_hash, block.parent_hash, block.token_ids, self.block_size)
            )

    def drain(self) -> list[KVEvent]:
        """Every event since the last drain, the disk's own removals included."""
        if self.disk is not None and (dropped := self.disk.store.drain_removed()):
            self._events.append(BlockRemoved(tuple(dropped)))
        events, self._events = self._events, []
        return events

    def clear(self) -> None:
        self._events.clear()
