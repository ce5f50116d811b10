"""Errors of the KV memory: misuse of the pool or tree, and broken invariants."""

from __future__ import annotations


class KVCacheError(RuntimeError):
    """A block or tree operation that the current state does not allow (a bug in the caller)."""


class OutOfBlocksError(KVCacheError):
    """More blocks were asked for than the pool has free; check `can_allocate` first."""


class IntegrityError(KVCacheError):
    """An invariant of the pool or the tree does not hold; the message names it."""
