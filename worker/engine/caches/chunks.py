"""Chunked local attention's pages (Llama 4): the exact chunk rule.

A chunked layer's query at p sees the keys from ⌊p / C⌋·C to p, its own chunk's, never the
C - 1 before it that a window of C would. So, where every page layer is chunked with chunks of
C in whole blocks (`WindowPages.chunked`), `ChunkKind` keeps the window pages' storage and
bookkeeping (`WindowKind`) and changes two answers:

- release: a block's pages go spare once every holder's next query is in a later chunk (a
  window of C keeps up to C / block blocks more: on average half of them, at C = 8192 and
  32-token blocks up to 256 blocks a sequence);
- hit: a hit ending at block e reads the pages of the blocks from its chunk's start to e
  (`HitRule.chunk_blocks`), none when e ends a chunk, not the ⌈(C - 1) / block⌉ before e.

With sliding windows beside chunked layers (no such model yet) the pool keeps the window
rule, which covers both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.prefix.hit_rule import HitRule
from worker.engine.caches.kinds import WindowKind

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence


class ChunkKind(WindowKind):
    """Chunked layers' pages: held from each holder's current chunk on (see the module)."""

    name = "chunked local attention"

    def rule(self) -> HitRule:
        return HitRule(chunk_blocks=self.pages.window // self.pages.block_size)

    def computed(self, seq: Sequence) -> None:
        """Mutates: blocks before the chunk of every query `seq` may still run (the step in
        flight's too, and one token of slack), that every holder is past, go spare."""
        if seq.block_ids:
            first_query = max(0, seq.num_computed - seq.num_in_flight - 1)
            end = min(self.pages.out_of_chunk(first_query), len(seq.block_ids))
            self._release_before(seq, end)
