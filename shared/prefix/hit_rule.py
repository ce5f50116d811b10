"""How much of a matched prefix a worker can serve as a cache hit: the one rule that the worker's
admission (worker/engine/admission.py) and the router's prefix index
(router/routing/prefix_index.py) both apply, so that the router predicts the `cached_tokens`
the worker then reports.

A hit is the intersection of what every cache kind of the model can serve. Full attention sets
the longest match (the leading blocks the tree holds); each other kind can only shorten it:

- sliding windows: a hit ending after block e reads the window layers' K/V of the
  ⌈(W - 1) / block⌉ blocks before e, so none of them may have lost its window pages;
- chunked local attention (Llama 4, chunks of C = k blocks): the first query after e sees only
  its own chunk's keys, so only the blocks from ⌊e / k⌋·k to e need their pages (none when e
  ends a chunk). Window and chunk layers share one page per block (worker/kv/window_pages.py),
  taken back all at once, so with both the needs join: the pages from the earlier start;
- recurrent state (hybrids): a hit must end where a snapshot of the states was kept.

The hit is the deepest end satisfying every kind at once (not one cut after another: a model
with both windows and states, baichuan_m1, could otherwise end where window pages are gone).
The two sides differ only in how they ask: the worker about block ids and its pools, the router
about chained block hashes and its workers' events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class HitRule:
    window_blocks: int = 0  # blocks before a hit's end that need their window pages (0: none)
    snapshots: bool = False  # a hit ends at a snapshot of the recurrent states
    chunk_blocks: int = 0  # blocks a chunk of chunked local attention (0: none)

    @property
    def trivial(self) -> bool:
        """Full attention only: every matched block is a usable hit."""
        return not self.window_blocks and not self.snapshots and not self.chunk_blocks

    def pages_from(self, end: int) -> int:
        """The first block whose pages a hit ending at block `end` reads (`end`: none)."""
        first = max(0, end - self.window_blocks)
        if self.chunk_blocks:
            first = min(first, end // self.chunk_blocks * self.chunk_blocks)
        return first

    def usable(
        self,
        depth: int,
        window_gone: Callable[[int], bool] = lambda i: False,
        snapshot_after: Callable[[int], bool] = lambda i: True,
    ) -> int:
        """The deepest end e <= `depth` (in blocks) every kind can serve: no block from
        `pages_from(e)` to e lost its pages (`window_gone(i)`, i the block's 0-based
        position), and, for snapshots, one was kept after block e - 1
        (`snapshot_after(e - 1)`). 0 when none can."""
        if self.trivial:
            return depth
        for end in range(depth, 0, -1):
            if self.snapshots and not snapshot_after(end - 1):
                continue
            if any(window_gone(i) for i in range(self.pages_from(end), end)):
                continue
            return end
        return 0
