"""Pages for sliding-window layers: storage a block needs only while some query can see it.

Blocks (`BlockPool`) are the fleet's unit: one block id holds 32 tokens of every layer, the
radix cache and the KV events speak of them, and hashes name them. A sliding-window layer
reads only the last W keys of each row, so its share of a block is dead weight once every
query that will run is past it. Window layers therefore keep their K/V in pages of their own
(the same 32 tokens), and a block has a page only while it may be read through a window:

- a block allocated gets a page (its tokens are about to be written);
- a running sequence whose window has passed one of its blocks (held by it alone) makes that
  block's page *spare*: the content stays, so a later prompt can still hit it, but the page is
  the first to be taken back when a new block needs one (least recently spared first);
- a cached block no sequence holds keeps its page spare; a freed block gives its page back.

A prefix hit needs window pages only for the ⌈(W - 1) / block⌉ blocks before the match point
(`usable_blocks`); the blocks before them serve the full-attention layers alone. This is
vLLM's sliding-window manager's rule; a ring buffer per sequence would break prefix caching.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from worker.kv.errors import IntegrityError


class WindowPages:
    """The page of each block for the window layers, a free list and the spare pages."""

    def __init__(self, num_pages: int, num_blocks: int, window: int, block_size: int):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages, self.window, self.block_size = num_pages, window, block_size
        self.page_of = [-1] * num_blocks
        self._free = deque(range(num_pages))
        self._spare: OrderedDict[int, None] = OrderedDict()  # blocks, least recently spared first
        self.released = 0  # pages made spare while their sequence ran (cumulative)
        self.reclaimed = 0  # spare pages taken back for other blocks (cumulative)

    @property
    def blocks_before_match(self) -> int:
        """Blocks before a match point whose pages a hit needs: ⌈(W - 1) / block⌉."""
        return -(-(self.window - 1) // self.block_size)

    def available(self) -> int:
        """Pages a new block could get now: free, or spare."""
        return len(self._free) + len(self._spare)

    def in_use(self) -> int:
        return self.num_pages - len(self._free) - len(self._spare)

    def has_page(self, block_id: int) -> bool:
        return self.page_of[block_id] >= 0

    def give(self, block_id: int) -> int:
        """Mutates: a page for `block_id` (a free one, else the least recently spared one,
        whose block loses it); the caller checked `available()`."""
        if self.page_of[block_id] >= 0:
            self._spare.pop(block_id, None)
            return self.page_of[block_id]
        if self._free:
            page = self._free.popleft()
        else:
            victim, _ = self._spare.popitem(last=False)
            page, self.page_of[victim] = self.page_of[victim], -1
            self.reclaimed += 1
        self.page_of[block_id] = page
        return page

    def take_back(self, block_id: int) -> None:
        """Mutates: a freed block's page goes back to the free list."""
        page = self.page_of[block_id]
        if page >= 0:
            self._spare.pop(block_id, None)
            self.page_of[block_id] = -1
            self._free.append(page)

    def spare(self, block_id: int, released: bool = False) -> None:
        """Mutates: the page of `block_id` may be taken back (its content stays until then)."""
        if self.page_of[block_id] >= 0 and block_id not in self._spare:
            self._spare[block_id] = None
            self.released += released

    def unspare(self, block_id: int) -> None:
        """Mutates: `block_id` is held for reading again; its page is not to be taken."""
        self._spare.pop(block_id, None)

    def usable_blocks(self, block_ids: Sequence[int]) -> int:
        """How many leading blocks of a prefix match a hit can use: the most m whose
        `blocks_before_match` blocks before m all still have their pages."""
        need = self.blocks_before_match
        for m in range(len(block_ids), 0, -1):
            if all(self.page_of[b] >= 0 for b in block_ids[max(0, m - need) : m]):
                return m
        return 0

    def out_of_window(self, num_computed: int) -> int:
        """Blocks of a sequence at `num_computed` that no query of it will read again: those
        wholly behind the window of its next query (one block of slack for drafts)."""
        return max(0, (num_computed - self.window + 1) // self.block_size - 1)

    def release(
        self, block_ids: Sequence[int], start: int, end: int, refs: Callable[[int], int]
    ) -> int:
        """Mutates: pages of `block_ids[start:end]` that only this sequence holds become
        spare; returns the first block not released (a shared one waits for its holders)."""
        for i in range(start, end):
            block = block_ids[i]
            if refs(block) > 1:
                return i
            self.spare(block, released=True)
        return max(start, end)

    def check(self, refs: Sequence[int], cached: Sequence[bool]) -> None:
        """Raise IntegrityError unless pages are accounted for: each page free or of one block,
        and a freed block holds none."""
        owned = [p for p in self.page_of if p >= 0]
        if len(set(owned)) != len(owned) or set(owned) & set(self._free):
            raise IntegrityError("a window page is owned twice, or owned and free")
        if len(owned) + len(self._free) != self.num_pages:
            raise IntegrityError(f"{len(owned)} owned + {len(self._free)} free != {self.num_pages}")
        for block, page in enumerate(self.page_of):
            if page >= 0 and refs[block] == 0 and not cached[block]:
                raise IntegrityError(f"free block {block} still holds window page {page}")
