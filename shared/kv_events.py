"""KV-cache events a worker's radix cache emits and the router's prefix index follows, and the
messages that carry them on a router link (tags in shared/protocol.py, which exports them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """A full block entered the worker's prefix cache."""

    block_hash: int
    parent_hash: int  # ROOT_PARENT_HASH for a sequence's first block
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the worker's prefix cache (evicted)."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlockWindowsDropped:
    """Cached blocks lost their window pages, the K/V of every sliding-window and chunked layer
    at once (one page per block and sub-group, taken back together): they still serve the
    full-attention layers, but a hit can no longer read them (a hit needs the pages of the
    blocks just before its end: `Register.window_blocks`, or from its chunk's start:
    `Register.chunk_blocks`)."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StateSnapshotsStored:
    """A hybrid model's worker keeps its recurrent layers' states as they are just after
    these cached blocks: for such a worker (`Register.state_snapshots`) a hit can end only
    where a snapshot is."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StateSnapshotsDropped:
    """Snapshots taken back (evicted, or their blocks left the cache)."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The worker dropped its whole prefix cache."""


KVEvent = (
    BlockStored
    | BlockRemoved
    | AllBlocksCleared
    | BlockWindowsDropped
    | StateSnapshotsStored
    | StateSnapshotsDropped
)


# ---------------------------------------------------------------- on a router link


@dataclass(frozen=True, slots=True)
class KVEvents:
    """Prefix-cache changes, in the order they happened. `seq` numbers a worker's KVEvents on
    each router link, 1, 2, 3, ... (0: unnumbered, an older worker): a number skipped means a
    frame was lost (dropped at ZeroMQ's queue limit), and the router asks for the worker's
    inventory (SendInventory) instead of keeping an index that drifted."""

    worker_id: str
    events: tuple[KVEvent, ...]
    seq: int = 0


@dataclass(frozen=True, slots=True)
class KVInventory:
    """Every block a worker holds (its prefix cache's full blocks and its disk tier's), sent
    after each accepted Register so that a router that restarted or joined a running fleet
    knows what the worker caches. One snapshot travels as `parts` messages (`part` 0, 1, ...)
    sent back to back on the socket that carries the worker's KVEvents to that router, so
    events emitted before the snapshot arrive before it and later ones after it; the router
    replaces what it knew of the worker once the last part has come. `windowless`: those
    blocks whose sliding-window pages were taken back (as BlockWindowsDropped says);
    `snapshots`: a hybrid model's blocks with a snapshot of the states (StateSnapshotsStored).
    `last_seq`: the `seq` of the last KVEvents sent on this link before it (the next is
    `last_seq + 1`)."""

    worker_id: str
    block_hashes: tuple[int, ...]
    windowless: tuple[int, ...] = ()
    part: int = 0
    parts: int = 1
    snapshots: tuple[int, ...] = ()
    last_seq: int = 0


@dataclass(frozen=True, slots=True)
class SendInventory:
    """The router lost some of this worker's KV events (a `KVEvents.seq` skipped): send the
    inventory again, on this link (an older worker ignores it, with a warning)."""

    reason: str = ""
