"""Partial blocks in the radix prefix cache: reuse of the tokens before a prompt's divergence.

The tree holds full blocks only, so a prompt's K/V used to be reused up to its last whole
block and the rest (up to block_size - 1 tokens: a request's partial last block, a chat
template's tail) was computed again. Three kinds of block can serve those tokens:

- a tail: a finished sequence's partial last block, kept (cached, never written again) under
  the node its full blocks end at, with the tokens it holds;
- a live block: a running sequence's partial last block once its prompt is computed (it goes
  on writing the slots after those tokens, never these; a copy takes what is there);
- the first block of a child of that node: a full block whose leading tokens match.

`match` finds the source with the longest common run; the admitting sequence holds it while it
makes room, then copies it (`BlockPool.copy_on_write`: the cached block is never written in
place, and a tensor-parallel leader's recorded copies reach the followers) and computes only
from the end of that run. Tails emit no KV events (the router hashes full blocks), never go to
the disk tier or a peer, and are evicted before any full block (least recently used first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from worker.kv.errors import IntegrityError

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_node import MatchResult, RadixNode


class PartialHit(NamedTuple):
    block_id: int  # the cached block to copy (a tail, or a child's first full block)
    num_tokens: int  # its leading tokens that the prompt shares (1 .. block_size - 1)


class PartialTails:
    """The tails a RadixCache keeps: node -> tail tokens -> block, in LRU order."""

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool
        self._by_node: dict[RadixNode, dict[tuple[int, ...], int]] = {}
        self._where: dict[int, tuple[RadixNode, tuple[int, ...]]] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._held = 0
        self._live: dict[int, tuple[RadixNode, tuple[int, ...]]] = {}  # held by running seqs
        self.hit_tokens = 0  # prompt tokens served by copying a partial block

    # ---- queries (none of these mutate) ----

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    @property
    def block_ids(self) -> list[int]:
        return list(self._where)

    @property
    def evictable_blocks(self) -> int:
        return len(self._where) - self._held

    def is_live(self, block_id: int) -> bool:
        return block_id in self._live

    def tails_of(self, node: RadixNode) -> dict[tuple[int, ...], int]:
        return dict(self._by_node.get(node, {}))

    def match(self, token_ids: Sequence[int], match: MatchResult) -> PartialHit | None:
        """The cached block sharing the longest run with `token_ids` after `match` (which ends
        at `match.node`), or None. Stops a block short: a whole block would be in `match`."""
        bs = self._pool.block_size
        want = tuple(token_ids[match.num_tokens : match.num_tokens + bs - 1])
        if not want:
            return None
        candidates = [(key, b) for key, b in self._by_node.get(match.node, {}).items()]
        candidates += [(c.key[:bs], c.block_ids[0]) for c in match.node.children.values()]
        candidates += [(key, b) for b, (node, key) in self._live.items() if node is match.node]
        best = None
        for key, block_id in candidates:
            n = _common(key, want)
            if n and (best is None or n > best.num_tokens):
                best = PartialHit(block_id, n)
        return best

    # ---- mutations ----

    def take(self, hit: PartialHit) -> int:
        """Mutates: a new block holding a copy of `hit`'s block (which the caller held and
        now no longer does); counts its tokens as hits."""
        if hit.block_id in self._lru:
            self._lru.move_to_end(hit.block_id)
        self.hit_tokens += hit.num_tokens
        return self._pool.copy_on_write(hit.block_id)

    def add(self, node: RadixNode, tail: tuple[int, ...], block_id: int) -> bool:
        """Mutates: keeps `block_id` (held by the caller, not cached) as the tail after `node`,
        unless a cached block already starts with `tail`; whether it was kept. Unheld tails
        that `tail` extends are dropped (the new one serves them)."""
        bs = self._pool.block_size
        if not 0 < len(tail) < bs:
            raise ValueError(f"a tail holds 1 .. {bs - 1} tokens, not {len(tail)}")
        if self._pool.ref_count(block_id) != 1 or self._pool.is_cached(block_id):
            return False  # shared: another holder may still write to it
        tails = self._by_node.get(node, {})
        keys = [*tails, *(c.key[:bs] for c in node.children.values())]
        if any(key[: len(tail)] == tail for key in keys):
            return False
        for key, old in list(tails.items()):
            if tail[: len(key)] == key and self._pool.ref_count(old) == 0:
                self._drop(old)
        self._pool.set_cached(block_id)
        self._by_node.setdefault(node, {})[tail] = block_id
        self._where[block_id] = (node, tail)
        self._lru[block_id] = None
        self._held += 1  # the caller holds it; the pool tells when it lets go
        return True

    def add_live(self, node: RadixNode, tail: tuple[int, ...], block_id: int) -> bool:
        """Mutates: offers a running sequence's partial block (it holds it; its first
        `len(tail)` slots are computed and final) for copying until `forget_live`."""
        self._live[block_id] = (node, tail)
        return True

    def forget_live(self, block_ids: list[int]) -> None:
        """Mutates: their sequence lets go of these blocks (before the pool may reuse them)."""
        for block_id in block_ids:
            self._live.pop(block_id, None)

    def on_hold(self, block_ids: list[int], held: bool) -> None:
        """Mutates: the pool's news that tails became held (or cached-only)."""
        self._held += len(block_ids) if held else -len(block_ids)

    def evict(self, num_blocks: int) -> int:
        """Mutates: frees up to `num_blocks` unheld tails, least recently used first."""
        unheld = [b for b in self._lru if self._pool.ref_count(b) == 0][:num_blocks]
        for block_id in unheld:
            self._drop(block_id)
        return len(unheld)

    def drop_node(self, node: RadixNode) -> int:
        """Mutates: frees the tails after `node` (it leaves the tree); returns how many."""
        tails = self._by_node.pop(node, {})
        unheld = sum(1 for b in tails.values() if self._pool.ref_count(b) == 0)
        for block_id in tails.values():
            self._drop(block_id)
        return unheld

    def clear(self) -> None:
        """Mutates: lets go of every tail (held ones stay with their holders)."""
        self._live.clear()
        for block_id in list(self._where):
            self._drop(block_id)

    def _drop(self, block_id: int) -> None:
        node, tail = self._where.pop(block_id)
        tails = self._by_node.get(node, {})
        tails.pop(tail, None)
        if not tails:
            self._by_node.pop(node, None)
        del self._lru[block_id]
        self._held -= self._pool.ref_count(block_id) > 0
        self._pool.unset_cached(block_id)

    # ---- integrity ----

    def check(self, tree_blocks: set[int]) -> set[int]:
        """Raise IntegrityError unless the tails agree with the pool and the tree; returns
        their blocks. No mutation."""
        bs = self._pool.block_size
        listed = {b for tails in self._by_node.values() for b in tails.values()}
        if listed != set(self._where) or listed != set(self._lru):
            raise IntegrityError("the tails' node map, block map and LRU disagree")
        if listed & tree_blocks:
            raise IntegrityError(f"blocks both tails and full: {sorted(listed & tree_blocks)}")
        for block_id, (node, tail) in self._where.items():
            if node.removed or self._by_node[node].get(tail) != block_id:
                raise IntegrityError(f"tail block {block_id} hangs off a removed node")
            if not 0 < len(tail) < bs or not self._pool.is_cached(block_id):
                raise IntegrityError(f"tail block {block_id}: {len(tail)} tokens, not cached")
        for block_id in self._live:  # (its node may be gone: a duplicate of the sequence's)
            if self._pool.ref_count(block_id) < 1 or block_id in listed:
                raise IntegrityError(f"live block {block_id} is not a running sequence's")
        held = sum(1 for b in listed if self._pool.ref_count(b) > 0)
        if held != self._held:
            raise IntegrityError(f"tails count {self._held} held blocks, the pool says {held}")
        return listed


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common leading run of `a` and `b`."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
