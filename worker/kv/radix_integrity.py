"""The radix cache's integrity check: every invariant the tree and its pool must share.

It reads the tree's parts (root, block map, counters) and asks the partial tails to check
themselves through `TailCheck`, never naming the cache or the tails' class, so the dependencies
run one way: `radix_cache` imports this module; this one, only the node types and the pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from shared.hashing import hash_blocks
from worker.kv.errors import IntegrityError

if TYPE_CHECKING:
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_node import RadixNode


class TreeCounters(NamedTuple):
    """What the cache claims about its tree, checked against a walk of it."""

    evictable_blocks: int
    num_locks: int


class TailCheck(Protocol):
    """The partial tails kept beside the tree (worker/kv/radix_partial.py), as the check
    sees them."""

    def check(self, tree_blocks: set[int]) -> set[int]:
        """Raise IntegrityError unless the tails agree with the pool and `tree_blocks` (the
        tree's full blocks); returns the tails' blocks. No mutation."""
        ...


def check_tree(
    root: RadixNode,
    pool: BlockPool,
    node_of_block: dict[int, RadixNode],
    claimed: TreeCounters,
    partials: TailCheck,
) -> None:
    """Raise IntegrityError naming the first broken invariant; no mutation."""
    pool.check_integrity()
    if root.block_ids or root.lock_ref:
        raise IntegrityError("the root owns blocks or is locked")
    seen: set[int] = set()
    evictable = direct_locks = 0
    for node in root.walk():
        _check_children(node)
        if node.is_root:
            continue
        _check_node(pool, node, node_of_block, seen)
        evictable += node.num_blocks if node.evictable else 0
        direct_locks += node.lock_ref - sum(c.lock_ref for c in node.children.values())
    tails = partials.check(seen)
    _check_totals(pool, node_of_block, seen, tails, TreeCounters(evictable, direct_locks), claimed)


def _check_node(
    pool: BlockPool,
    node: RadixNode,
    node_of_block: dict[int, RadixNode],
    seen: set[int],
) -> None:
    bs = pool.block_size
    if node.removed:
        raise IntegrityError("a removed node is still in the tree")
    if not node.block_ids or len(node.key) != len(node.block_ids) * bs:
        raise IntegrityError(f"key of {len(node.key)} tokens for {node.num_blocks} blocks of {bs}")
    if len(node.block_hashes) != node.num_blocks:
        raise IntegrityError("a node has a different number of hashes and blocks")
    if node.parent.children.get(node.key[:bs]) is not node:
        raise IntegrityError("a node is not under its first block's tokens in its parent")
    _check_hashes(node, bs)
    for block_id in node.block_ids:
        if block_id in seen:
            raise IntegrityError(f"block {block_id} is in the tree twice")
        seen.add(block_id)
        if node_of_block.get(block_id) is not node:
            raise IntegrityError(f"block {block_id} is not mapped to its node")
        if not pool.is_cached(block_id):
            raise IntegrityError(f"block {block_id} is in the tree but not cached in the pool")
    held = sum(1 for b in node.block_ids if pool.ref_count(b) > 0)
    if held != node.num_held:
        raise IntegrityError(f"node counts {node.num_held} held blocks, the pool says {held}")
    if node.evictable and node.is_leaf and not node.in_heap:
        raise IntegrityError("an evictable leaf is missing from the LRU heap")


def _check_children(node: RadixNode) -> None:
    children = list(node.children.values())
    if any(child.parent is not node for child in children):
        raise IntegrityError("a child does not point back to its parent")
    held_children = sum(1 for child in children if child.subtree_held)
    if held_children != node.num_held_children:
        raise IntegrityError(
            f"node counts {node.num_held_children} children holding blocks, found {held_children}"
        )
    if not node.is_root and node.lock_ref < sum(child.lock_ref for child in children):
        raise IntegrityError("a node's lock_ref is below the sum of its children's")


def _check_hashes(node: RadixNode, bs: int) -> None:
    expected = hash_blocks(node.key, bs, parent_hash=node.parent.last_hash)
    for block_id, got, want in zip(node.block_ids, node.block_hashes, expected, strict=True):
        if got != want:
            raise IntegrityError(f"block {block_id}'s hash does not chain")


def _check_totals(
    pool: BlockPool,
    node_of_block: dict[int, RadixNode],
    seen: set[int],
    tails: set[int],
    found: TreeCounters,
    claimed: TreeCounters,
) -> None:
    if seen != set(node_of_block):
        raise IntegrityError("the block-to-node map disagrees with the tree")
    pool_cached = {b for b in range(pool.num_blocks) if pool.is_cached(b)} - tails
    if pool_cached != seen:
        raise IntegrityError(
            f"cached in the pool but not in the tree: {sorted(pool_cached - seen)}; "
            f"in the tree but not cached: {sorted(seen - pool_cached)}"
        )
    if found.evictable_blocks != claimed.evictable_blocks:
        raise IntegrityError(
            f"evictable_blocks is {claimed.evictable_blocks}, found {found.evictable_blocks}"
        )
    if found.num_locks != claimed.num_locks:
        raise IntegrityError(
            f"num_locks is {claimed.num_locks}, lock_refs add up to {found.num_locks}"
        )
