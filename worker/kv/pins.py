"""Cache pins: prefixes a request asks the worker to keep cached for a while, whatever LRU says.

An Anthropic `cache_control` breakpoint (5 minutes, or 1 hour) or OpenAI's
`prompt_cache_retention: "24h"` reaches the worker as a `shared.protocol.CachePin`
(num_tokens, ttl_s). A pin is one lock (`RadixCache.lock`) on the node where the full blocks of
the prompt's first `num_tokens` tokens end: the path from the root to it cannot be evicted.
Splits keep it: the lower part of a split node keeps its identity, its end and its lock count,
and the upper part copies the count, so the pinned node still ends where the pin does.

- Renewal: pinning a prefix already pinned moves its deadline to the later of the two (Anthropic
  refreshes a TTL on each hit) and makes it the newest pin.
- Expiry: deadlines on a monotonic clock (injectable), in a heap; `expire` is a heap peek when
  nothing is due. An expired pin is unlocked: its blocks are then evictable by LRU as usual.
- Bound: the blocks of all pins together (each counted once, however many pins share it) stay
  within `max_blocks` (a share of the pool: `[worker] pin_share`). A new pin past it releases
  the oldest pins (least recently pinned or renewed) first; a pin alone larger than the bound is
  refused. The scheduler also releases the oldest pins when running requests need the memory
  (`release_oldest`, from `make_room`, after evicting what is not pinned): hints never starve it.
- Released for room (not expired): the pinned path is first handed to `spill` (the disk tier's
  `save`, where the worker has one: the listener eviction calls, which skips blocks the disk
  holds already), so a "24h" prefix survives memory pressure on disk and reads back on its next
  hit. Without a disk tier a released prefix is an ordinary cached prefix, evicted by LRU like
  any other: retention is then bounded by the pool.

What a pin keeps is the full-attention blocks of the tree. On a model with sliding-window
layers, the window pages of a cached block no sequence holds are spare, taken back first under
pressure whether pinned or not: the hit on a pinned prefix can then shrink to where its last
⌈(W - 1) / block⌉ blocks still have pages. On a hybrid model, the recurrent-state snapshots a hit
needs keep their own LRU bound (worker/state): a pinned prefix whose snapshot went hits only up
to an earlier snapshot. Prefix caching off: the scheduler takes no pins.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from worker.kv.errors import IntegrityError
from worker.kv.radix_node import common_blocks

if TYPE_CHECKING:
    from shared.protocol import CachePin
    from worker.kv.radix_cache import RadixCache
    from worker.kv.radix_node import RadixNode

# (block_ids, block_hashes, parent_hash, tokens) of one node: `RadixCache.set_evict_listener`'s
Spill = Callable[[list[int], list[int], int, tuple[int, ...]], None]


class PrefixPins:
    """The pins a worker holds over its RadixCache: node -> deadline, oldest pinned first."""

    # the deadline heap is rebuilt when stale entries (renewed or released pins) outnumber it
    COMPACT_SLACK = 64

    def __init__(
        self, cache: RadixCache, max_blocks: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        self._cache, self.max_blocks, self.clock = cache, max_blocks, clock
        self._deadline: OrderedDict[RadixNode, float] = OrderedDict()  # least recent first
        self._heap: list[tuple[float, int, RadixNode]] = []  # (deadline, tiebreak, node)
        self._tiebreak = itertools.count()
        self._pins_of_block: Counter[int] = Counter()
        self.spill: Spill | None = None  # a path released for room is handed here first
        self.expired = self.released_for_room = self.refused = 0  # cumulative

    # ---- queries (none of these mutate) ----

    def __len__(self) -> int:
        return len(self._deadline)

    @property
    def pinned_blocks(self) -> int:
        """Distinct blocks held by pins (a block on several pinned paths counts once)."""
        return len(self._pins_of_block)

    def deadline(self, token_ids: Sequence[int], num_tokens: int) -> float | None:
        """The deadline of the pin on the full blocks of token_ids[:num_tokens], or None."""
        full = num_tokens - num_tokens % self._cache.block_size
        node = _node_at(self._cache.root, tuple(token_ids[:full]), self._cache.block_size)
        return self._deadline.get(node) if node is not None else None

    # ---- mutations ----

    def take(
        self, token_ids: Sequence[int], wanted: tuple[CachePin, ...], cached_tokens: int
    ) -> tuple[CachePin, ...]:
        """Mutates: pins (`pin`) each of `wanted`, pins of the prompt `token_ids`, whose full
        blocks lie within its first `cached_tokens` tokens, which are in the tree; returns the
        others, for when more of the prompt is."""
        bs, left = self._cache.block_size, []
        for want in wanted:
            if want.num_tokens - want.num_tokens % bs <= cached_tokens:
                self.pin(token_ids, want.num_tokens, want.ttl_s)
            else:
                left.append(want)
        return tuple(left)

    def pin(self, token_ids: Sequence[int], num_tokens: int, ttl_s: float) -> bool:
        """Mutates: keeps the full blocks of token_ids[:num_tokens] cached until `ttl_s`
        seconds from now (pinned already: until the later of that and its deadline); whether
        they are pinned now. False, pinning nothing, when they are not all in the tree or are
        more than `max_blocks`. May release the oldest pins to stay within `max_blocks`. The
        match marks the path most recently used, as a hit does."""
        full = num_tokens - num_tokens % self._cache.block_size
        if full <= 0 or ttl_s <= 0:
            return False
        match = self._cache.match_prefix(token_ids[:full])
        if match.num_tokens < full:
            return False
        node, deadline = match.node, self.clock() + ttl_s
        if node in self._deadline:
            self._deadline.move_to_end(node)
            if deadline > self._deadline[node]:
                self._set_deadline(node, deadline)
            return True
        if len(match.block_ids) > self.max_blocks:
            self.refused += 1
            return False
        self._cache.lock(node)
        self._set_deadline(node, deadline)
        self._pins_of_block.update(match.block_ids)
        while self.pinned_blocks > self.max_blocks:  # (the new pin, newest, is never taken)
            self.release_oldest()
        return True

    def expire(self) -> int:
        """Mutates: releases the pins whose deadline has passed; how many. A heap peek (and
        a clock read) when none has."""
        released, now = 0, self.clock()
        while self._heap and self._heap[0][0] <= now:
            deadline, _, node = heapq.heappop(self._heap)
            if self._deadline.get(node) == deadline:  # else renewed or released since
                self._release(node)
                released += 1
        self.expired += released
        return released

    def release_oldest(self) -> bool:
        """Mutates: releases the pins that are due, else the least recently pinned one, for
        room (its path handed to `spill` first); False when there is no pin."""
        if self.expire():
            return True
        if not self._deadline:
            return False
        node = next(iter(self._deadline))
        if self.spill is not None:  # root first, node by node, as eviction would
            for on_path in reversed(list(node.path_to_root())):
                self.spill(
                    on_path.block_ids, on_path.block_hashes, on_path.parent.last_hash, on_path.key
                )
        self._release(node)
        self.released_for_room += 1
        return True

    def clear(self) -> None:
        """Mutates: releases every pin (before the cache is reset)."""
        for node in list(self._deadline):
            self._release(node)
        self._heap.clear()

    def _set_deadline(self, node: RadixNode, deadline: float) -> None:
        self._deadline[node] = deadline
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), node))
        if len(self._heap) > 2 * len(self._deadline) + self.COMPACT_SLACK:
            self._heap = [(d, next(self._tiebreak), n) for n, d in self._deadline.items()]
            heapq.heapify(self._heap)

    def _release(self, node: RadixNode) -> None:
        del self._deadline[node]
        for block_id in _path_blocks(node):
            self._pins_of_block[block_id] -= 1
            if not self._pins_of_block[block_id]:
                del self._pins_of_block[block_id]
        self._cache.unlock(node)

    # ---- integrity ----

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every pin locks a live node and the block count is
        that of their paths; no mutation."""
        counted: Counter[int] = Counter()
        for node in self._deadline:
            if node.removed or node.lock_ref < 1:
                raise IntegrityError("a pinned node was evicted or is not locked")
            counted.update(_path_blocks(node))
        if counted != self._pins_of_block:
            raise IntegrityError("the pins' block counts disagree with their paths")
        if self.pinned_blocks > self.max_blocks:
            raise IntegrityError(f"{self.pinned_blocks} pinned blocks, bound {self.max_blocks}")
        queued = {(id(n), d) for d, _, n in self._heap}
        if any((id(n), d) not in queued for n, d in self._deadline.items()):
            raise IntegrityError("a pin's deadline is not in the heap")


def _node_at(root: RadixNode, tokens: tuple[int, ...], bs: int) -> RadixNode | None:
    """The node whose path from `root` holds exactly `tokens` (full blocks), or None (not
    cached, or ending inside a node). Reads the tree, changes nothing."""
    node, pos = root, 0
    while pos < len(tokens):
        child = node.children.get(tokens[pos : pos + bs])
        if child is None or common_blocks(child, tokens, pos, len(tokens), bs) < child.num_blocks:
            return None
        node, pos = child, pos + child.num_blocks * bs
    return None if node is root else node


def _path_blocks(node: RadixNode) -> list[int]:
    """The blocks from the root to `node` (the same ids across splits)."""
    return [b for on_path in node.path_to_root() for b in on_path.block_ids]
