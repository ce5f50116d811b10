"""The KV memory of a tensor-parallel follower rank (worker/tp/): a mirror of the leader's.

A follower keeps no books of its own: the leader's KV manager decides every block (who holds
it, what it caches, what it copies on write) and its forwards write the same slots on every
rank, each over its own KV heads. What a follower must still do to its own shard is repeat the
leader's storage moves, the copies on write its KV manager made before the step (sent with
the step, `Forward.copies`); `MirrorKV` is the one object that does, so the follower's pool,
like the leader's, has a single owner in this package."""

from __future__ import annotations

from collections.abc import Iterable

from worker.kv.block_pool import BlockPool


class MirrorKV:
    """A follower's pool, changed only as the leader's KV manager changed its own."""

    def __init__(self, pool: BlockPool):
        self.pool = pool

    def repeat_copies(self, copies: Iterable[tuple[int, int]]) -> None:
        """The leader's copies on write (source block, destination block), on this shard."""
        for src, dst in copies:
            self.pool.copy_block(src, dst)
