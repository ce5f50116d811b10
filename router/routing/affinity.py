"""Which worker a prefix was last sent to, remembered after the worker's cache lets it go.

When the fleet's KV cannot hold every tenant, each worker's LRU evicts prefixes, the prefix
index forgets them, and a returning tenant looks new everywhere. Routed by cost alone it would
then land on whichever worker is next in turn, so over time every worker serves every tenant
and all their LRUs churn (each sees the whole working set). Remembering where a prefix went
keeps tenants partitioned: a worker's cache holds a share of the tenants, not a slice of all.

Keys are the prompt's chained block hashes at depths 1, 2, 4, 8, ... blocks (a shallow prefix
is shared by many prompts, a deep one names a tenant); the deepest remembered depth wins.
Bounded: least recently used keys go first.

A request's `prompt_cache_key` (OpenAI's cache-routing hint) is one more key, kept beside the
prefix hashes: prompts that share a key but not a long prefix (one conversation's turns after a
rewritten system prompt, one tenant's documents) go where that key went last.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

MAX_KEYS = 200_000


def _depths(num_blocks: int) -> list[int]:
    depths, d = [], 1
    while d <= num_blocks:
        depths.append(d)
        d *= 2
    if depths and depths[-1] != num_blocks:
        depths.append(num_blocks)
    return depths


class PrefixAffinity:
    def __init__(self, max_keys: int = MAX_KEYS):
        self._where: OrderedDict[int | tuple[str, str], str] = OrderedDict()
        self._max_keys = max_keys

    def lookup(self, hashes: Sequence[int]) -> str | None:
        """The worker the deepest remembered prefix of `hashes` was last sent to."""
        for depth in reversed(_depths(len(hashes))):
            worker = self._where.get(hashes[depth - 1])
            if worker is not None:
                return worker
        return None

    def lookup_key(self, cache_key: str | None) -> str | None:
        """The worker a request with this prompt_cache_key was last sent to."""
        return None if cache_key is None else self._where.get(("cache_key", cache_key))

    def remember(self, hashes: Sequence[int], worker_id: str, cache_key: str | None = None) -> None:
        keys: list = [hashes[depth - 1] for depth in _depths(len(hashes))]
        if cache_key is not None:
            keys.append(("cache_key", cache_key))
        for key in keys:
            self._where[key] = worker_id
            self._where.move_to_end(key)
        while len(self._where) > self._max_keys:
            self._where.popitem(last=False)
