"""Radix prefix cache: a token tree whose nodes own the blocks of block-aligned prefixes.

Full blocks only; a sequence's partial last block may be kept as a tail beside the tree
(`insert_tail`, worker/kv/radix_partial.py), which later prompts copy, never share.

How the KV manager (worker/engine/caches/manager.py) uses it:
- admission: `peek_prefix_length` to plan (no mutation), then `match_prefix` (splits,
  touches LRU), `lock(result.node)`, `pool.incref(result.block_ids)`, allocate the rest
  (a partial block: `partials.match`, its block held with `pool.incref` while room is made,
  then copied by `partials.take`), and once it is in, `admitted`; not admitted:
  `unlock(result.node)` and `pool.decref` of what it held;
- prompt computed, still running: `insert(tokens, seq_blocks)` and
  `insert_tail(..., live=True)` let later prompts share it;
- finish: `insert(tokens, seq_blocks)`, `partials.forget_live(seq_blocks)`, `insert_tail`,
  `unlock(node)`, `pool.decref(...)`;
  out of blocks: `evict(n)`: unheld tails first, then least recently used leaves that no
  lock or holder reaches.

LRU: a counter bumped once per walk (`match_prefix`, `insert`, `insert_tail`; deterministic).
The pool tells the tree when cached blocks become held or cached-only (`evictable_blocks` is
exact) or lose window pages. Shared types (`RadixNode`, `MatchResult`): worker/kv/radix_node.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shared import kv_events as ev
from shared.hashing import hash_blocks
from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from worker.kv.errors import KVCacheError
from worker.kv.radix_integrity import TreeCounters, check_tree
from worker.kv.radix_node import LRUHeap, MatchResult, RadixNode, common_blocks
from worker.kv.radix_partial import PartialTails

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool


class RadixCache:
    """Prefix cache over a BlockPool; emits shared.kv_events through `on_event`."""

    def __init__(
        self,
        pool: BlockPool,
        block_size: int | None = None,
        on_event: Callable[[KVEvent], None] | None = None,
    ) -> None:
        if block_size is not None and block_size != pool.block_size:
            raise ValueError(f"block_size {block_size} != the pool's {pool.block_size}")
        self.block_size = pool.block_size
        self._pool, self._on_event = pool, on_event
        self.root = RadixNode(None, (), [], [])
        self._node_of_block: dict[int, RadixNode] = {}
        self._heap = LRUHeap()
        self._clock = self._evictable_blocks = self._num_locks = 0
        self.hit_tokens = self.miss_tokens = self.evicted_blocks = 0  # evicted: cumulative
        self._on_evict: Callable[..., None] | None = None
        self.partials = PartialTails(pool)  # partial blocks kept for copy-on-write reuse
        pool.set_hold_listener(self._on_hold_change)
        if pool.pages is not None:  # window pages taken back: the router counts hits anew
            pool.pages.on_drop = self._on_windows_dropped

    def set_evict_listener(self, listener: Callable[..., None]) -> None:
        """`listener(block_ids, block_hashes, parent_hash, tokens)` hears of every node `evict`
        removes, before its blocks go back to the pool (a lower tier can copy them)."""
        self._on_evict = listener

    # ---- queries (none of these mutate) ----

    @property
    def cached_blocks(self) -> int:
        return len(self._node_of_block)  # full blocks (what the router hears of); no tails

    @property
    def evictable_blocks(self) -> int:
        """Blocks `evict` would free if asked for all: unlocked, unheld subtrees and tails."""
        return self._evictable_blocks + self.partials.evictable_blocks

    @property
    def num_locks(self) -> int:
        return self._num_locks

    def peek_prefix_length(self, token_ids: Sequence[int]) -> int:
        """Tokens of the longest cached block-aligned prefix; splits, touches, counts nothing."""
        tokens, limit = self._full_blocks(token_ids)
        node, pos = self.root, 0
        while pos < limit:
            child = node.children.get(tokens[pos : pos + self.block_size])
            if child is None:
                break
            matched = common_blocks(child, tokens, pos, limit, self.block_size)
            pos += matched * self.block_size
            if matched < child.num_blocks:
                break
            node = child
        return pos

    # ---- mutations ----

    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        """Mutates: the longest cached block-aligned prefix of `token_ids`. Splits the node the
        match ends inside and marks the path most recently used; counts nothing (`admitted`)."""
        tokens, limit = self._full_blocks(token_ids)
        path = self._walk(tokens, limit)
        block_ids = [block_id for node in path for block_id in node.block_ids]
        return MatchResult(
            path[-1] if path else self.root, block_ids, len(block_ids) * self.block_size
        )

    def admitted(self, match: MatchResult, prompt_tokens: int) -> None:
        """Mutates: a request of `prompt_tokens` was admitted on `match` (once per admission,
        not per attempt): counts its hit and miss tokens."""
        self.hit_tokens += match.num_tokens
        self.miss_tokens += prompt_tokens - match.num_tokens

    def lock(self, node: RadixNode) -> None:
        """Mutates: protects `node` and its ancestors from eviction (locking root is a no-op)."""
        self._require_live(node)
        if not node.is_root:
            self._shift_locks(node, 1)

    def unlock(self, node: RadixNode) -> None:
        """Mutates: undoes one `lock(node)`; raises if `node` is not locked."""
        self._require_live(node)
        if node.is_root:
            return
        if node.lock_ref < 1:
            raise KVCacheError("unlock of a node that is not locked")
        self._shift_locks(node, -1)

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        """Mutates: caches the full blocks of `token_ids`; returns how many tokens were cached.

        `block_ids[i]` holds tokens [i*bs, (i+1)*bs); extra ids (a partial tail) are ignored.
        Blocks the tree already has keep the tree's id; the caller's duplicates are untouched.
        New blocks must be held by the caller and not cached; they become cached and each
        emits BlockStored. Otherwise raises KVCacheError, having cached nothing (the walk may
        have split nodes and touched the matched path, which changes no cached content).
        """
        tokens, limit = self._full_blocks(token_ids)
        if len(block_ids) < limit // self.block_size:
            raise ValueError(
                f"{limit // self.block_size} full blocks of tokens but {len(block_ids)} block ids"
            )
        path = self._walk(tokens, limit)
        node = path[-1] if path else self.root
        cached = sum(n.num_blocks for n in path) * self.block_size
        if cached < limit:
            new_ids = list(block_ids[cached // self.block_size : limit // self.block_size])
            self._add_leaf(node, tokens[cached:limit], new_ids)
        return cached

    def insert_tail(self, token_ids: Sequence[int], block_ids: list[int], live=False) -> bool:
        """Mutates: keeps the partial last block of `token_ids` (held, not cached; `live`: its
        running sequence keeps it) after its cached full blocks for copy-on-write reuse."""
        tokens, limit = self._full_blocks(token_ids)
        path = self._walk(tokens, limit)
        if limit == len(tokens) or sum(n.num_blocks for n in path) * self.block_size < limit:
            return False
        tail = tokens[limit:], block_ids[limit // self.block_size]
        add = self.partials.add_live if live else self.partials.add
        return add(path[-1] if path else self.root, *tail)

    def evict(self, num_blocks: int) -> int:
        """Mutates: frees at least `num_blocks` blocks (unheld tails, then least recently used
        leaves) or all it can; returns how many. Emits one BlockRemoved for the batch."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        freed, removed_hashes = self.partials.evict(num_blocks), []
        while freed < num_blocks:
            leaf = self._heap.pop_lru_evictable_leaf()
            if leaf is None:
                break
            removed_hashes.extend(leaf.block_hashes)
            if self._on_evict is not None:
                self._on_evict(leaf.block_ids, leaf.block_hashes, leaf.parent.last_hash, leaf.key)
            freed += self._remove_leaf(leaf)
        self.evicted_blocks += freed
        if removed_hashes:
            self._emit(BlockRemoved(tuple(removed_hashes)))
        return freed

    def reset(self) -> None:
        """Mutates: drops the whole tree (blocks no sequence holds are freed) and emits
        AllBlocksCleared. Raises if any node is locked. Hit/miss counters are kept."""
        if self._num_locks:
            raise KVCacheError(f"reset while {self._num_locks} lock(s) are held")
        self.partials.clear()
        for node in self.root.walk():
            for block_id in node.block_ids:
                self._pool.unset_cached(block_id)
            node.removed = True
        self.root.removed = False
        self.root.children = {}
        self.root.num_held_children = 0
        self._node_of_block.clear()
        self._heap.clear()
        self._evictable_blocks = 0
        self._emit(AllBlocksCleared())

    def check_integrity(self) -> None:
        """Raise IntegrityError unless the tree and its pool agree; no mutation."""
        claimed = TreeCounters(self._evictable_blocks, self._num_locks)
        check_tree(self.root, self._pool, self._node_of_block, claimed, self.partials)

    # ---- walking and shaping the tree ----

    def _full_blocks(self, token_ids: Sequence[int]) -> tuple[tuple[int, ...], int]:
        tokens = tuple(token_ids)
        return tokens, len(tokens) - len(tokens) % self.block_size

    def _walk(self, tokens: tuple[int, ...], limit: int) -> list[RadixNode]:
        """Mutates: the nodes of the longest cached prefix of tokens[:limit], the last one split
        so that it ends where the match does; marks them most recently used."""
        self._clock += 1
        node, pos, path = self.root, 0, []
        while pos < limit:
            child = node.children.get(tokens[pos : pos + self.block_size])
            if child is None:
                break
            matched = common_blocks(child, tokens, pos, limit, self.block_size)
            if matched < child.num_blocks:
                child = self._split(child, matched)
            child.last_access = self._clock
            path.append(child)
            node, pos = child, pos + child.num_blocks * self.block_size
        return path

    def _split(self, node: RadixNode, num_blocks: int) -> RadixNode:
        """Mutates: cuts `node` after its first `num_blocks` blocks; returns the new upper part.
        Blocks, hashes and what is cached do not change."""
        bs = self.block_size
        if node.evictable:
            self._evictable_blocks -= node.num_blocks
        upper = RadixNode(
            node.parent,
            node.key[: num_blocks * bs],
            node.block_ids[:num_blocks],
            node.block_hashes[:num_blocks],
        )
        node.key = node.key[num_blocks * bs :]
        node.block_ids = node.block_ids[num_blocks:]
        node.block_hashes = node.block_hashes[num_blocks:]
        node.parent.children[upper.key[:bs]] = upper
        node.parent = upper
        upper.children[node.key[:bs]] = node
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        upper.num_held = sum(1 for b in upper.block_ids if self._pool.ref_count(b) > 0)
        node.num_held -= upper.num_held
        upper.num_held_children = int(node.subtree_held)
        for block_id in upper.block_ids:
            self._node_of_block[block_id] = upper
        for part in (upper, node):
            self._settle(part, was_evictable=False)
        return upper

    def _add_leaf(self, parent: RadixNode, key: tuple[int, ...], block_ids: list[int]) -> None:
        """Mutates: a new leaf under `parent` owning `block_ids` (held by the caller)."""
        bad = [b for b in block_ids if not self._pool.can_cache(b)]
        if bad or len(set(block_ids)) != len(block_ids):
            raise KVCacheError(
                f"insert needs distinct held, uncached blocks for new tokens; bad: {bad}, "
                f"ids: {block_ids}"
            )
        bs = self.block_size
        hashes = hash_blocks(key, bs, parent_hash=parent.last_hash)
        leaf = RadixNode(parent, key, block_ids, hashes)
        leaf.last_access = self._clock
        leaf.num_held = len(block_ids)
        parent.children[key[:bs]] = leaf
        self.partials.forget_live(block_ids)  # a live block that filled up: a child serves it
        for block_id in block_ids:
            self._pool.set_cached(block_id)
            self._node_of_block[block_id] = leaf
        self._propagate_held(leaf, was_subtree_held=False)
        for i, block_hash in enumerate(hashes):
            prev = hashes[i - 1] if i else parent.last_hash
            self._emit(BlockStored(block_hash, prev, key[i * bs : (i + 1) * bs], bs))
        pages = self._pool.pages  # taken back while their sequence ran, before the tree had them
        if pages and (
            gone := [hashes[i] for i, b in enumerate(block_ids) if not pages.has_page(b)]
        ):
            self._emit(ev.BlockWindowsDropped(tuple(gone)))

    def _remove_leaf(self, leaf: RadixNode) -> int:
        """Mutates: detaches an evictable leaf and returns its blocks to the pool."""
        parent = leaf.parent
        del parent.children[leaf.key[: self.block_size]]
        leaf.removed = True
        self._evictable_blocks -= leaf.num_blocks
        for block_id in leaf.block_ids:
            del self._node_of_block[block_id]
            self._pool.unset_cached(block_id)
        self._queue_if_evictable_leaf(parent)  # eviction cascades up
        return leaf.num_blocks + self.partials.drop_node(leaf)

    # ---- evictability bookkeeping ----

    def _shift_locks(self, node: RadixNode, delta: int) -> None:
        """Mutates: adds `delta` to lock_ref along the path from `node` to the root."""
        for on_path in node.path_to_root():
            was_evictable = on_path.evictable
            on_path.lock_ref += delta
            self._settle(on_path, was_evictable)
        self._num_locks += delta

    def _on_hold_change(self, block_ids: list[int], held: bool) -> None:
        """Mutates: the pool's news that cached blocks became held (or cached-only)."""
        self.partials.on_hold([b for b in block_ids if b in self.partials], held)
        for block_id in (b for b in block_ids if b not in self.partials):
            node = self._node_of_block[block_id]
            was_subtree_held, was_evictable = node.subtree_held, node.evictable
            node.num_held += 1 if held else -1
            self._settle(node, was_evictable)
            self._propagate_held(node, was_subtree_held)

    def _propagate_held(self, node: RadixNode, was_subtree_held: bool) -> None:
        """Mutates: tells ancestors that `node`'s subtree started (or stopped) holding blocks,
        stopping at the first ancestor whose own answer does not change."""
        while node.parent is not None and node.subtree_held != was_subtree_held:
            parent = node.parent
            was_subtree_held, was_evictable = parent.subtree_held, parent.evictable
            parent.num_held_children += 1 if node.subtree_held else -1
            self._settle(parent, was_evictable)
            node = parent

    def _settle(self, node: RadixNode, was_evictable: bool) -> None:
        """Mutates: books a change in `node`'s evictability; queues it if an evictable leaf."""
        if node.evictable != was_evictable:
            self._evictable_blocks += node.num_blocks if node.evictable else -node.num_blocks
        self._queue_if_evictable_leaf(node)

    def _queue_if_evictable_leaf(self, node: RadixNode) -> None:
        if node.evictable and node.is_leaf:
            self._heap.push(node)

    def _require_live(self, node: RadixNode) -> None:
        if node.removed:
            raise KVCacheError("node was evicted or reset; match again")

    def _on_windows_dropped(self, block_ids: list[int]) -> None:
        nodes = [(self._node_of_block.get(b), b) for b in block_ids]
        if hashes := [n.block_hashes[n.block_ids.index(b)] for n, b in nodes if n is not None]:
            self._emit(ev.BlockWindowsDropped(tuple(hashes)))

    def _emit(self, event: KVEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
