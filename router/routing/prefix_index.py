"""Approximate global prefix index: block hash -> workers that (probably) hold the block.

Two kinds of entries:
- confirmed, from the workers' KV events (BlockStored / BlockRemoved / AllBlocksCleared);
- optimistic, added when the router dispatches a prompt, so that a prefill in flight attracts
  requests sharing its prefix before its events arrive. They expire after `ttl_s`, so a prompt
  that never gets cached (aborted, evicted at once) stops attracting traffic.
Block hashes are chained (shared.hashing), so a hash names a whole prefix, not just one block.

A match is then cut to what the worker can serve, by the rule its own admission applies
(shared/prefix/hit_rule.py), asked about hashes: for sliding-window models
(`Register.window_blocks` = k > 0) none of the k blocks before the end may have lost its window
pages (`BlockWindowsDropped`), for chunked attention (`Register.chunk_blocks` = k > 0) none of
those from the end's chunk start (chunks of k blocks); for hybrid models
(`Register.state_snapshots`) the end must have a snapshot of the states (`StateSnapshotsStored`
/ `StateSnapshotsDropped`); all at once where a model has several.

Inventories (`receive_inventory`): a worker that registers sends every block it holds, in
parts; once the last part is in, the worker's confirmed set *is* the inventory. The parts of
one snapshot come back to back on the socket that carries the worker's events, so any event
seen between its first and last part happened after the snapshot: it is applied again on
top. Replaying an event that the snapshot already reflects changes nothing (each event sets a
block's state outright), so the index converges whatever the interleaving.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from shared.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    BlockWindowsDropped,
    KVEvent,
    StateSnapshotsDropped,
    StateSnapshotsStored,
)
from shared.prefix.hit_rule import HitRule


class _Incoming:
    """An inventory whose parts are still coming, and the events that came meanwhile."""

    __slots__ = ("parts", "next_part", "blocks", "windowless", "snapshots", "events")

    def __init__(self, parts: int) -> None:
        self.parts, self.next_part = parts, 0
        self.blocks: set[int] = set()
        self.windowless: set[int] = set()
        self.snapshots: set[int] = set()
        self.events: list[KVEvent] = []


class PrefixIndex:
    def __init__(self, ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._ttl_s = ttl_s
        self._clock = clock
        self._holders: dict[int, set[str]] = {}  # confirmed: hash -> workers
        self._blocks_of: dict[str, set[int]] = {}  # confirmed: worker -> hashes
        self._optimistic: dict[int, dict[str, float]] = {}  # hash -> worker -> expiry
        self._window_blocks: dict[str, int] = {}  # worker -> k (sliding-window models)
        self._chunk_blocks: dict[str, int] = {}  # worker -> k (chunked-attention models)
        self._windowless: dict[str, set[int]] = {}  # worker -> blocks without window K/V
        self._snapshots: dict[str, set[int]] = {}  # hybrid models' workers -> snapshot hashes
        self._incoming: dict[str, _Incoming] = {}  # worker -> its inventory being received

    # ------------------------------------------------------------ mutations

    def apply(self, worker_id: str, event: KVEvent) -> None:
        """Follow one KV event of `worker_id`."""
        if (incoming := self._incoming.get(worker_id)) is not None:
            incoming.events.append(event)  # applied again once its inventory is whole
        if isinstance(event, BlockStored):
            self._holders.setdefault(event.block_hash, set()).add(worker_id)
            self._blocks_of.setdefault(worker_id, set()).add(event.block_hash)
            self._windowless.get(worker_id, set()).discard(event.block_hash)
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                self._forget(worker_id, block_hash)
        elif isinstance(event, BlockWindowsDropped):
            held = self._blocks_of.get(worker_id, set())
            dropped = {h for h in event.block_hashes if h in held}
            self._windowless.setdefault(worker_id, set()).update(dropped)
        elif isinstance(event, StateSnapshotsStored) and worker_id in self._snapshots:
            self._snapshots[worker_id].update(event.block_hashes)
        elif isinstance(event, StateSnapshotsDropped) and worker_id in self._snapshots:
            self._snapshots[worker_id].difference_update(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.drop_worker(worker_id)
            self._snapshots.get(worker_id, set()).clear()

    def receive_inventory(
        self,
        worker_id: str,
        part: int,
        parts: int,
        block_hashes: Iterable[int],
        windowless: Iterable[int] = (),
        snapshots: Iterable[int] = (),
    ) -> bool:
        """Mutates: part `part` of `parts` of `worker_id`'s inventory. With the last one, its
        confirmed blocks become exactly the inventory's (the events that came between the
        parts applied on top) and True is returned. A part out of sequence drops what was
        gathered: the worker's next inventory (it sends one per registration) replaces it."""
        if part == 0:
            self._incoming[worker_id] = _Incoming(parts)
        incoming = self._incoming.get(worker_id)
        if incoming is None or (part, parts) != (incoming.next_part, incoming.parts):
            self._incoming.pop(worker_id, None)
            return False
        incoming.blocks.update(block_hashes)
        incoming.windowless.update(windowless)
        incoming.snapshots.update(snapshots)
        incoming.next_part += 1
        if incoming.next_part < parts:
            return False
        del self._incoming[worker_id]
        self._replace(worker_id, incoming.blocks, incoming.windowless & incoming.blocks)
        if worker_id in self._snapshots:  # a hybrid model's worker (`set_snapshots`)
            self._snapshots[worker_id] = incoming.snapshots
        for event in incoming.events:
            self.apply(worker_id, event)
        return True

    def set_window(self, worker_id: str, blocks: int, chunk_blocks: int = 0) -> None:
        """`worker_id` serves a sliding-window model: a hit needs the window layers of the
        `blocks` blocks before its end (0: no rule); or a chunked-attention one, chunks of
        `chunk_blocks`: those from its end's chunk start (0: no chunks)."""
        self._window_blocks[worker_id] = blocks
        self._chunk_blocks[worker_id] = chunk_blocks

    def set_snapshots(self, worker_id: str, hybrid: bool) -> None:
        """`worker_id` serves a hybrid model: its hits end only at its snapshots."""
        if hybrid:
            self._snapshots.setdefault(worker_id, set())
        else:
            self._snapshots.pop(worker_id, None)

    def add_optimistic(self, worker_id: str, block_hashes: Iterable[int]) -> None:
        """Count `block_hashes` as on `worker_id` for ttl_s (a prefill just sent there)."""
        expiry = self._clock() + self._ttl_s
        for block_hash in block_hashes:
            self._optimistic.setdefault(block_hash, {})[worker_id] = expiry

    def drop_worker(self, worker_id: str) -> None:
        """Forget every entry of a worker (lost, restarted, or cleared its cache)."""
        self._windowless.pop(worker_id, None)
        if worker_id in self._snapshots:
            self._snapshots[worker_id] = set()
        self._incoming.pop(worker_id, None)
        for block_hash in self._blocks_of.pop(worker_id, set()):
            self._discard_holder(block_hash, worker_id)
        for block_hash in [h for h, w in self._optimistic.items() if worker_id in w]:
            self._discard_optimistic(block_hash, worker_id)

    def purge_expired(self) -> int:
        """Drop expired optimistic entries; returns how many. Call now and then."""
        now = self._clock()
        expired = [(h, w) for h, ws in self._optimistic.items() for w, t in ws.items() if t <= now]
        for block_hash, worker_id in expired:
            self._discard_optimistic(block_hash, worker_id)
        return len(expired)

    # ------------------------------------------------------------ queries (no mutation)

    def match(
        self, block_hashes: Sequence[int], worker_ids: Iterable[str], confirmed: bool = False
    ) -> dict[str, int]:
        """Leading blocks of `block_hashes` each of `worker_ids` holds (0 if none); with
        `confirmed`, only blocks its KV events reported (what a peer can fetch from it)."""
        matched = dict.fromkeys(worker_ids, 0)
        still_matching = set(matched)
        now = float("inf") if confirmed else self._clock()  # every optimistic entry expired
        for depth, block_hash in enumerate(block_hashes):
            still_matching &= self._workers_holding(block_hash, now)
            if not still_matching:
                break
            for worker_id in still_matching:
                matched[worker_id] = depth + 1
        for worker_id, depth in matched.items():
            matched[worker_id] = self._usable(worker_id, block_hashes, depth)
        return matched

    def hit_rule(self, worker_id: str) -> HitRule:
        """The worker's hit rule (shared/prefix/hit_rule.py), from what it registered."""
        return HitRule(
            self._window_blocks.get(worker_id, 0),
            worker_id in self._snapshots,
            self._chunk_blocks.get(worker_id, 0),
        )

    def _usable(self, worker_id: str, block_hashes: Sequence[int], depth: int) -> int:
        """The deepest end <= `depth` the worker can serve as a hit: the rule its own
        admission applies, asked about hashes."""
        rule = self.hit_rule(worker_id)
        if rule.trivial or depth == 0:
            return depth
        windowless = self._windowless.get(worker_id, set())
        snapshots = self._snapshots.get(worker_id, set())
        return rule.usable(
            depth,
            window_gone=lambda i: block_hashes[i] in windowless,
            snapshot_after=lambda i: block_hashes[i] in snapshots,
        )

    def num_blocks(self, worker_id: str) -> int:
        """Confirmed blocks the index believes `worker_id` holds."""
        return len(self._blocks_of.get(worker_id, ()))

    @property
    def num_optimistic(self) -> int:
        return sum(len(ws) for ws in self._optimistic.values())

    # ------------------------------------------------------------ internals

    def _replace(self, worker_id: str, blocks: set[int], windowless: set[int]) -> None:
        """Mutates: `worker_id`'s confirmed blocks are `blocks` (its optimistic entries stay
        until they expire: a prefill in flight is not in a snapshot yet)."""
        for block_hash in self._blocks_of.pop(worker_id, set()) - blocks:
            self._discard_holder(block_hash, worker_id)
        for block_hash in blocks:
            self._holders.setdefault(block_hash, set()).add(worker_id)
        self._blocks_of[worker_id] = blocks
        self._windowless[worker_id] = windowless

    def _workers_holding(self, block_hash: int, now: float) -> set[str]:
        holders = set(self._holders.get(block_hash, ()))
        for worker_id, expiry in self._optimistic.get(block_hash, {}).items():
            if expiry > now:
                holders.add(worker_id)
        return holders

    def _forget(self, worker_id: str, block_hash: int) -> None:
        self._blocks_of.get(worker_id, set()).discard(block_hash)
        self._windowless.get(worker_id, set()).discard(block_hash)
        self._discard_holder(block_hash, worker_id)
        self._discard_optimistic(block_hash, worker_id)

    def _discard_holder(self, block_hash: int, worker_id: str) -> None:
        holders = self._holders.get(block_hash)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[block_hash]

    def _discard_optimistic(self, block_hash: int, worker_id: str) -> None:
        entries = self._optimistic.get(block_hash)
        if entries is not None:
            entries.pop(worker_id, None)
            if not entries:
                del self._optimistic[block_hash]
