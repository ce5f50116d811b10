"""The KV manager's package: the only owner of KV memory, and the scheduler's one view of it.

`KVManager` (manager.py) holds the block pool, the radix tree, the disk tier, the cache pins
and, through the coordinator, the cache kinds; the scheduler asks it a few verbs (the computed
prefix a request starts from, slots for more tokens, what enters the prefix cache, a fork, a
sequence's end) and never calls the pool or the tree itself.

A model's layers keep their context in one or more *kinds* of cache beside the full-attention
blocks the radix tree indexes: sliding-window pages (worker/kv/window_pages.py), the same pages
under chunked attention's own rule (chunks.py), recurrent-state slots and snapshots
(states.py), partial tails (worker/kv/radix_partial.py, as a kind in tails.py:
every model has it). Each kind answers the same questions, as a `CacheKind`; the manager asks
the coordinator, which asks every kind the model has, and nobody names a kind itself (vLLM v1's
KVCacheCoordinator over its SingleTypeKVCacheManagers is the model):

- `hit`: how much of a prefix match every kind can serve (shared/prefix/hit_rule.py, the rule
  the router's index applies too), and what the hit holds until it is admitted or given up;
  `tail`: the partial tail a kind keeps past it (`find_tail`), if every kind can copy it;
- `room`, `plan`, `unplan`, `chunk`: whether a sequence can start now, where its prefill
  must stop (a plan dropped when it is not admitted after all);
- `start`, `computed`, `cached`, `fork_blocks`, `fork`, `release`, `free`, `give_up`: what
  each kind takes, gives back or keeps as a sequence is admitted, advances, enters the prefix
  cache, forks, finishes or is preempted;
- `cannot`: what the fleet must not do with the model (the disk tier, peer transfers, drafts,
  tensor parallelism), each refusal with its reason.

A new kind is one class (kinds.py, or beside its data structure) plus its line in
`coordinator.kinds_of`. Beside the kinds, the coordinator owns the cache pins
(worker/kv/pins.py): prefixes requests asked to keep cached for a while (Anthropic
`cache_control`, OpenAI `prompt_cache_retention`), locked in the radix tree until a deadline.
"""

from worker.engine.caches.chunks import ChunkKind
from worker.engine.caches.coordinator import CacheCoordinator, kinds_of
from worker.engine.caches.kinds import CacheKind, Hit, StateKind, WindowKind
from worker.engine.caches.manager import (
    FEATURES,
    CachedHashes,
    KVFigures,
    KVManager,
    Prefix,
    PrefixEvicted,
)
from worker.engine.caches.mirror import MirrorKV
from worker.engine.caches.tails import TailKind

__all__ = [
    "FEATURES",
    "CachedHashes",
    "KVFigures",
    "CacheCoordinator",
    "CacheKind",
    "ChunkKind",
    "Hit",
    "KVManager",
    "MirrorKV",
    "Prefix",
    "PrefixEvicted",
    "StateKind",
    "TailKind",
    "WindowKind",
    "kinds_of",
]
