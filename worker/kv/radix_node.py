"""A node of the radix prefix cache, a match that ends at one, and the LRU heap of evictable
leaves: the types the tree, its partial tails and its integrity check share."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import NamedTuple

from shared.hashing import ROOT_PARENT_HASH


class RadixNode:
    """A block-aligned run of tokens and the blocks holding their K/V.

    Read these attributes, never write them: the RadixCache keeps them consistent.
    `key` holds len(block_ids) * block_size tokens; `children` maps the first block's tokens
    of each child to the child. `lock_ref` counts locks on this node or below it. `num_held`
    counts its blocks with ref count >= 1; `num_held_children` its children whose subtree has a
    held block. A node is evictable (its subtree can go) when neither locks nor holds reach it.
    """

    __slots__ = (
        "parent",
        "key",
        "block_ids",
        "block_hashes",
        "children",
        "lock_ref",
        "num_held",
        "num_held_children",
        "last_access",
        "in_heap",
        "removed",
    )

    def __init__(
        self,
        parent: RadixNode | None,
        key: tuple[int, ...],
        block_ids: list[int],
        block_hashes: list[int],
    ) -> None:
        self.parent = parent
        self.key = key
        self.block_ids = block_ids
        self.block_hashes = block_hashes
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.lock_ref = 0
        self.num_held = 0
        self.num_held_children = 0
        self.last_access = 0
        self.in_heap = False
        self.removed = False

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def last_hash(self) -> int:
        """The hash the first block of a child chains on."""
        return self.block_hashes[-1] if self.block_hashes else ROOT_PARENT_HASH

    @property
    def subtree_held(self) -> bool:
        return self.num_held > 0 or self.num_held_children > 0

    @property
    def evictable(self) -> bool:
        """Whether eviction may take this node once its children are gone."""
        return not self.is_root and self.lock_ref == 0 and not self.subtree_held

    def path_to_root(self) -> Iterator[RadixNode]:
        """This node and its ancestors, root excluded."""
        node = self
        while node.parent is not None:
            yield node
            node = node.parent

    def walk(self) -> Iterator[RadixNode]:
        """This node and every node below it (depth-first, iterative)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


class MatchResult(NamedTuple):
    """The longest cached block-aligned prefix of a prompt (`RadixCache.match_prefix`)."""

    node: RadixNode  # deepest matched node (the root when nothing matched); lock this
    block_ids: list[int]  # the cached blocks of the prefix, in order
    num_tokens: int  # len(block_ids) * block_size


def common_blocks(node: RadixNode, tokens: tuple[int, ...], pos: int, limit: int, bs: int) -> int:
    """Leading full blocks of `node.key` equal to tokens[pos:limit] (>= 1: the child map)."""
    end = min(len(node.key), limit - pos)
    if tokens[pos : pos + end] == node.key[:end]:
        return end // bs
    matched = 1  # a mismatch lies before `end`, so this loop stops there
    while (
        tokens[pos + matched * bs : pos + (matched + 1) * bs]
        == node.key[matched * bs : (matched + 1) * bs]
    ):
        matched += 1
    return matched


class LRUHeap:
    """Evictable leaves by last access, lazily cleaned: stale entries are skipped or re-queued.

    A node is in the heap at most once (`in_heap`), so the heap never outgrows the tree.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._tiebreak = itertools.count()  # nodes are never compared

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, node: RadixNode) -> None:
        """Mutates: queues `node` under its current last access, unless already queued."""
        if not node.in_heap:
            node.in_heap = True
            heapq.heappush(self._heap, (node.last_access, next(self._tiebreak), node))

    def pop_lru_evictable_leaf(self) -> RadixNode | None:
        """Mutates: removes and returns the least recently used evictable leaf, or None."""
        while self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            node.in_heap = False
            if node.removed or not node.is_leaf or not node.evictable:
                continue  # pushed again when it becomes an evictable leaf
            if stamp != node.last_access:
                self.push(node)  # touched since it was queued
                continue
            return node
        return None

    def clear(self) -> None:
        """Mutates: forgets every entry."""
        for _, _, node in self._heap:
            node.in_heap = False
        self._heap.clear()
