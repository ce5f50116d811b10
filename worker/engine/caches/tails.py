"""Partial tails as a cache kind: a prompt's last, partly filled block, kept beside the radix
tree (worker/kv/radix_partial.py) and copied, never shared, by a later prompt that starts
with the same tokens (see the package docstring for the questions every kind answers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.engine.caches.kinds import CacheKind, Hit

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_cache import MatchResult, RadixCache
    from worker.kv.radix_partial import PartialHit


class TailKind(CacheKind):
    """A finished sequence's partial last block is kept as a tail; a running one's is lent
    once its prompt is computed. A hit the tree served to its end (not cut by another kind,
    not extended from disk) may copy the block sharing the longest run after it, if every
    other kind can copy it too; the block is held from the hit until `start` copies it or
    `give_up`. A fork whose last block is partial copies it for each choice (they each write
    their next token there)."""

    name = "partial tail"

    def __init__(self, pool: BlockPool, cache: RadixCache):
        self.pool, self.cache, self.partials = pool, cache, cache.partials

    def find_tail(
        self, prompt: list[int], match: MatchResult, kinds: list[CacheKind]
    ) -> PartialHit | None:
        """Mutates (holds the block it returns): the partial block extending `match` along
        `prompt`, unless a kind refuses tails or cannot copy this one (`CacheKind.tail`)."""
        if any("tails" in k.cannot for k in kinds):
            return None
        partial = self.partials.match(prompt, match)
        for kind in kinds:
            partial = partial if kind is self else kind.tail(partial)
        self.pool.incref([partial.block_id] if partial else [])  # held too, until copied
        return partial

    def give_up(self, block_ids: list[int], hit: Hit) -> None:
        self.pool.decref([hit.tail.block_id] if hit.tail else [])

    def start(self, seq: Sequence, hit: Hit) -> None:
        """Mutates: `seq`'s next block is a copy of the hit's tail (no longer held), its
        tokens computed."""
        if hit.tail is not None:
            seq.block_ids.append(self.partials.take(hit.tail))
            seq.num_computed += hit.tail.num_tokens

    def cached(self, seq: Sequence, known: int, running: bool) -> None:
        """Mutates: `seq`'s partial block after its `known` cached tokens is lent while it
        runs (once), or kept as a tail when it stops (it lends nothing from then on)."""
        if not running:
            self.partials.forget_live(seq.block_ids)
        bs = self.pool.block_size
        if known % bs == 0 or (running and self.partials.is_live(seq.block_ids[known // bs])):
            return
        self.cache.insert_tail(seq.tokens[:known], seq.block_ids, live=running)

    def fork_blocks(self, parent: Sequence) -> int:
        return parent.forks if self._in_partial_block(parent) else 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Mutates: `child` writes its own copy of `parent`'s partial last block."""
        if self._in_partial_block(parent):
            child.block_ids[-1] = self.pool.copy_on_write(child.block_ids[-1])

    def _in_partial_block(self, seq: Sequence) -> bool:
        return seq.num_computed % self.pool.block_size != 0
