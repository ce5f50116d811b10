"""KV-cache events a worker's radix cache emits and the router's prefix index follows."""

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
    """Cached blocks lost their sliding-window layers' K/V (their pages were taken back):
    they still serve the full-attention layers, but a hit can no longer end just after them
    (a hit needs the window layers of the blocks just before its end: `Register.window_blocks`)."""

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
