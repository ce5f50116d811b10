"""What a worker tells a router that has just accepted its registration: every block it holds,
as KVInventory parts (shared/protocol.py), so that a router that restarted, or one that joins a
running fleet, routes by the fleet's caches at once instead of by load alone.

Built on the engine thread between steps (the radix tree is the engine's), after the events
already emitted are sent, and queued on the same socket as that router's KVEvents: events
before the snapshot reach the router before it, events after it reach the router after it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from shared.protocol import KVInventory

if TYPE_CHECKING:
    from worker.engine.engine import Engine

# hashes per part: ~74 KB of msgpack (9 bytes a hash), far under the frame cap; the router's
# validating decode takes ~12 ms a part here (16,384 hashes: 25 ms, /tmp bench on this 2-core
# box), so its event loop serves requests between the parts of a big cache
PART_BLOCKS = 8_192


class Held(NamedTuple):
    blocks: list[int]  # every block: the prefix cache's full blocks, then the disk tier's
    windowless: set[int]  # those whose window pages were taken back
    snapshots: list[int]  # a hybrid model's blocks with a snapshot of the states after them


def held_blocks(engine: Engine) -> Held:
    """What the worker holds, by block hash (the KV manager's hashes). Reads only."""
    blocks, windowless = engine.kv.cached_hashes()
    snapshots = list(engine.states.pool.snapshots) if engine.states is not None else []
    return Held(blocks, windowless, snapshots)


def inventory_parts(
    worker_id: str,
    blocks: list[int],
    windowless: set[int],
    snapshots: Sequence[int] = (),
    per_part: int = PART_BLOCKS,
) -> list[KVInventory]:
    """`blocks` in parts of at most `per_part` hashes (one part when there are none), each
    with the windowless blocks among its own; the snapshots (at most one per slot of the
    state pool: few) ride in the first part."""
    chunks = [blocks[i : i + per_part] for i in range(0, len(blocks), per_part)] or [[]]
    return [
        KVInventory(
            worker_id,
            tuple(chunk),
            tuple(h for h in chunk if h in windowless),
            part=i,
            parts=len(chunks),
            snapshots=tuple(snapshots) if i == 0 else (),
        )
        for i, chunk in enumerate(chunks)
    ]


def inventory(engine: Engine, worker_id: str) -> list[KVInventory]:
    """The worker's inventory now, in parts."""
    return inventory_parts(worker_id, *held_blocks(engine))
