"""The KV manager: the only owner of KV memory (see the package docstring).

It holds the block pool, the radix tree, the disk tier, the cache pins and the cache kinds
(through the coordinator), and answers the scheduler in a few verbs, each with its
predicate (check, then change): the computed prefix a waiting sequence starts from (`hold`,
then `admit` or `give_up`), slots for more tokens (`allocate_slots`, room made by evicting
cached blocks, then pins; `fits` to ask first), what is computed enters the prefix cache
(`cache_prompt`), a fork (`fork`), and a sequence's end (`free`). The scheduler keeps the
queues, whom to preempt and how to chunk; it never touches the pool or the tree. vLLM v1's
KVCacheManager is the model.

Per running sequence (by its `RequestKey`), the manager keeps the tree node its hit locked,
and each kind what it lent (`WindowKind.released`; `SequenceStates`: snapshot points, kept
states). The `Sequence` still lists its blocks and its recurrent-state slot (the runner's block
table and state row, handed on as plain data) and the tokens handed to the tree; only this
package writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from shared.kv_events import BlockRemoved
from worker.engine.caches.coordinator import CacheCoordinator
from worker.kv.block_io import BlockLayout, block_layout, read_blocks, write_blocks
from worker.kv.errors import IntegrityError, KVCacheError, OutOfBlocksError
from worker.kv.radix_cache import MatchResult

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import numpy as np

    from shared.prefix.hit_rule import HitRule
    from worker.config import EngineConfig
    from worker.engine.caches.kinds import CacheKind, Hit
    from worker.engine.caches.states import States
    from worker.engine.sequence import Sequence
    from worker.kv.block_pool import BlockPool
    from worker.kv.disk_store import StoredBlock
    from worker.kv.disk_tier import DiskTier
    from worker.kv.pins import PrefixPins
    from worker.kv.radix_cache import RadixCache
    from worker.kv.radix_node import RadixNode
    from worker.runner.plan import RequestKey


# What the fleet may do with a model's KV, each refused where its caches cannot (`cannot`):
# the disk tier, peer transfers, speculative drafts, partial tails, tensor parallelism
FEATURES = ("disk", "peer", "drafts", "tails", "tp")


class KVFigures(NamedTuple):
    """The KV memory's counters, as plain data (the heartbeat's and the stats' figures); a
    few reads, no walk."""

    free_units: int  # free or spare (a new block takes `unit_cost` of them)
    total_blocks: int  # the pool's, the scratch block included
    cached_blocks: int  # full blocks in the tree
    cached_partial_units: int  # partial tails beside it, and their window pages
    evictable_blocks: int
    evicted_blocks: int  # cumulative
    hit_tokens: int  # admitted prompts' tokens served from the tree...
    miss_tokens: int  # ...and computed
    partial_hit_tokens: int  # served by copied partial tails
    disk_hit_tokens: int
    pinned_blocks: int  # blocks cache pins keep from LRU, and the pins
    pins: int


class CachedHashes(NamedTuple):
    """The blocks a worker holds, by hash: what the router's index is told (the inventory)."""

    blocks: list[int]  # the prefix cache's full blocks, then the disk tier's
    windowless: set[int]  # those whose window pages were taken back


class PrefixEvicted(KVCacheError):
    """Blocks to store follow a prefix the cache no longer holds (evicted meanwhile)."""


class Prefix(NamedTuple):
    """A waiting sequence's computed prefix, held (from eviction, its tail from reuse) until
    it is admitted on it (`KVManager.admit`) or gives it up (`KVManager.give_up`)."""

    hit: Hit  # what every kind agreed on (its match is the tree's own, for the hit counts)
    match: MatchResult  # the full blocks held: the hit's, then those loaded from disk

    @property
    def num_blocks(self) -> int:
        return len(self.match.block_ids)

    @property
    def num_tokens(self) -> int:
        """The prompt tokens it serves: its full blocks' and its partial tail's."""
        return self.match.num_tokens + self.hit.tail_tokens


class KVManager:
    """The pool, the radix tree, the disk tier, the pins and the cache kinds, asked as one
    (see the module docstring). What the model's caches cannot do is decided here, once."""

    def __init__(
        self,
        pool: BlockPool,
        cache: RadixCache,
        config: EngineConfig,
        states: States | None = None,
        open_disk: Callable[[str | None], DiskTier | None] | None = None,
    ) -> None:
        """`config`: whether prefix caching is on, the pins' share of the pool; `states`: a
        hybrid model's (None: none); `open_disk(refused)`: the disk tier, if configured, told
        why the model's caches rule it out (None: it may open), or None."""
        self.pool, self.cache = pool, cache
        self.coordinator = CacheCoordinator(pool, cache, states, config.pin_share)
        self.block_size, self.prefix_caching = pool.block_size, config.enable_prefix_cache
        self._refused = self._refusals()
        # blocks evicted (and pins released for room) go to the disk tier, and prompts'
        # blocks it holds come back from it
        self.disk = open_disk(self.cannot("disk")) if open_disk is not None else None
        if self.disk is not None:
            self.cache.set_evict_listener(self.disk.save)
            self.pins.spill = self.disk.save
        # per running sequence: the tree node its prefix hit ended at, locked while it runs
        self._locks: dict[RequestKey, RadixNode] = {}

    # ---- what the model's caches are -------------------------------------------------

    @property
    def kinds(self) -> list[CacheKind]:
        """The cache kinds the model has beside its full-attention blocks."""
        return self.coordinator.kinds

    @property
    def pins(self) -> PrefixPins:
        return self.coordinator.pins

    @property
    def states(self) -> States:
        return self.coordinator.states

    @property
    def rule(self) -> HitRule:
        """The hit rule every kind agrees on (the router's index applies it too)."""
        return self.coordinator.rule

    def register(self, kind: CacheKind) -> None:
        """Mutates: one more cache kind asked (a test's made-up kind)."""
        self.coordinator.register(kind)
        self._refused = self._refusals()

    def cannot(self, feature: str) -> str | None:
        """Why the model's caches rule `feature` (one of `FEATURES`) out, or None: decided
        at construction (and as a kind registers), asked wherever the feature is set up."""
        return self._refused.get(feature)

    def _refusals(self) -> dict[str, str]:
        """Every refused feature with its reason: a kind's, else the pool's layer shapes
        (blocks of one shape in every layer are what the disk tier and transfers carry)."""
        refused = {f: why for f in FEATURES if (why := self.coordinator.cannot(f)) is not None}
        if not self.pool.uniform:
            shapes = sorted(set(self.pool.layer_shapes))
            refused.setdefault(
                "disk",
                f"this model's layers keep K/V of different shapes ({shapes}), which the disk "
                "tier's block format does not carry yet",
            )
            refused.setdefault(
                "peer",
                "this model's layers keep K/V in more than one shape, which block transfers "
                "do not carry yet",
            )
        return refused

    # ---- questions (none of these mutate) ---------------------------------------------

    def prefix_length(self, prompt: list[int]) -> int:
        """Tokens of `prompt`'s longest cached block-aligned prefix (the tree's alone)."""
        return self.cache.peek_prefix_length(prompt)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks `seq` needs to hold `num_tokens` tokens (0 when it has them)."""
        return max(0, self.pool.blocks_for_tokens(num_tokens) - len(seq.block_ids))

    @property
    def max_prompt_units(self) -> int:
        """The units one prompt may take: the pool's, less the scratch block's."""
        return self.pool.num_blocks - self.pool.unit_cost

    def prompt_units(self, num_tokens: int) -> int:
        """The units `num_tokens` take: their blocks, and window pages for those a window or
        a chunk sees at once."""
        return self.pool.units_for(self.pool.blocks_for_tokens(num_tokens))

    def fits(self, num_blocks: int) -> bool:
        """Whether `num_blocks` new blocks fit in the free, spare and evictable units (no pin
        released)."""
        return num_blocks * self.pool.unit_cost <= self._room()

    def prompt_fits(self, seq: Sequence, matched_blocks: int, running: list[Sequence]) -> bool:
        """Whether `seq`'s whole prompt (and its first output token) fits beside what the
        running sequences still need for theirs, in the free, spare and evictable units, its
        `matched_blocks` cached already. Admitting on the first chunk alone overcommits the
        pool under KV pressure: the later chunks then preempt newer sequences, whose
        recomputation evicts the cached prefixes that waiting requests would have hit. With
        nothing running, a prompt is admitted anyway (alone)."""
        if not running:
            return True
        pool = self.pool
        need = pool.units_for(pool.blocks_for_tokens(len(seq.tokens) + 1) - matched_blocks)
        pending = sum(
            pool.units_for(max(0, pool.blocks_for_tokens(len(s.tokens) + 1) - len(s.block_ids)))
            for s in running
        )
        return need + pending <= self._room()

    def chunk_that_fits(self, prefix: Prefix, n: int) -> int:
        """`n` prefill tokens after `prefix`, cut so the chunk's new blocks fit in the free,
        spare and evictable units: for a sequence admitted when nothing runs, as nothing will
        free more, and a chunk that does not fit would leave it waiting for ever (a long
        prompt near the pool's size, beside a held partial hit). At least one token: the
        intake already checked that the prompt fits."""
        fit = (prefix.num_blocks + self._room() // self.pool.unit_cost) * self.block_size
        return min(n, max(1, fit - prefix.num_tokens))

    def room(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Whether every kind has room for `seq` now (recurrent-state slots)."""
        return self.coordinator.room(seq, running)

    def fork_blocks(self, parent: Sequence) -> int:
        """New blocks forking `parent`'s pending choices takes (see `fork`)."""
        return self.coordinator.fork_blocks(parent)

    def _room(self) -> int:
        return self.pool.room(self.cache.evictable_blocks)

    # ---- admission --------------------------------------------------------------------

    def hold(self, prompt: list[int]) -> Prefix:
        """Mutates: `prompt`'s computed prefix, held: the hit every kind agrees on (the
        router's index predicts the same), the blocks after it the disk tier holds (loaded),
        or else a partial tail past it. Touches the tree's LRU (and may split a node)."""
        hit = self.coordinator.hit(prompt)
        # hold the match before making room, or the eviction could take it
        self.cache.lock(hit.match.node)
        self.pool.incref(hit.match.block_ids)
        match = self._from_disk(prompt, hit.match)
        return Prefix(self.coordinator.tail(prompt, hit, match), match)

    def plan(self, seq: Sequence, prefix: Prefix) -> None:
        """Mutates: where `seq`, to start on `prefix`, stops its prefill chunks (snapshots)."""
        self.coordinator.plan(seq, prefix.num_tokens, prefix.hit.kv_tokens)

    def chunk(self, seq: Sequence, n: int, start: int | None = None) -> int:
        """`n` prefill tokens from `start` (`seq.num_computed`), cut where a kind must stop."""
        return self.coordinator.chunk(seq, n, start)

    def admit(
        self, seq: Sequence, prefix: Prefix, num_tokens: int, running: list[Sequence]
    ) -> bool:
        """Mutates: `seq` starts on `prefix` with blocks for `num_tokens`, if its whole
        prompt fits beside the `running` ones (`prompt_fits`) and room is made; else the
        prefix is given up (False)."""
        need = self.pool.blocks_for_tokens(num_tokens) - prefix.num_blocks
        if not self.prompt_fits(seq, prefix.num_blocks, running) or not self.make_room(need):
            self.give_up(prefix)
            self.coordinator.unplan(seq)
            return False
        match = prefix.match
        self._locks[seq.key] = match.node
        seq.block_ids, seq.num_computed = list(match.block_ids), match.num_tokens
        seq.inserted_tokens = match.num_tokens
        self.coordinator.start(seq, prefix.hit)
        self.grow(seq, num_tokens)
        prompt_tokens = len(seq.tokens) - 1 if self.uses_cache(seq) else 0
        self.cache.admitted(prefix.hit.match, prompt_tokens)  # once in, not per attempt
        return True

    def give_up(self, prefix: Prefix) -> None:
        """Mutates: a prefix not admitted on gives its blocks (and what each kind held) back."""
        self.cache.unlock(prefix.match.node)
        self.coordinator.give_up(prefix.match.block_ids, prefix.hit)

    def uses_cache(self, seq: Sequence) -> bool:
        """Whether `seq` starts from the prefix cache (a prompt to score is computed whole)."""
        return self.prefix_caching and not seq.scores_prompt

    def _from_disk(self, prompt: list[int], match: MatchResult) -> MatchResult:
        """Mutates: the prompt's blocks after `match` that the disk tier holds, loaded into new
        blocks (held, like the match's) and put back in the prefix cache; the longer match."""
        bs, start = self.block_size, len(match.block_ids)
        wanted = len(prompt) // bs - start
        if self.disk is None or wanted <= 0 or not self.prefix_caching:
            return match
        hits = self.disk.find(prompt, start, wanted)
        if not hits or not self.make_room(len(hits)):
            return match
        loaded = self.pool.allocate(len(hits))
        self.disk.load(loaded, hits)
        block_ids = match.block_ids + loaded
        self.cache.insert(prompt[: len(block_ids) * bs], block_ids)
        return MatchResult(match.node, block_ids, len(block_ids) * bs)

    # ---- running sequences ------------------------------------------------------------

    def make_room(self, need: int) -> bool:
        """Mutates: evict cached blocks, then pins, till `need` can be allocated; whether it can."""
        pool = self.pool
        if need <= 0 or pool.can_allocate(need):
            return True
        self.pins.expire()  # (due pins are evicted by LRU like the rest)
        self.cache.evict(pool.shortfall(need))
        while not pool.can_allocate(need) and self.pins.release_oldest():
            self.cache.evict(pool.shortfall(need))
        return pool.can_allocate(need)

    def allocate_slots(self, seq: Sequence, num_tokens: int) -> bool:
        """Mutates: blocks for `seq` to hold `num_tokens`, room made for them (`make_room`);
        False, changing nothing of `seq`, when there is none."""
        if not self.make_room(self.blocks_needed(seq, num_tokens)):
            return False
        self.grow(seq, num_tokens)
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Mutates: give `seq` blocks for `num_tokens`; the caller made room (`make_room`)."""
        if need := self.blocks_needed(seq, num_tokens):
            seq.block_ids += self.pool.allocate(need)

    def computed(self, seq: Sequence) -> None:
        """Mutates: `seq`'s computed tokens moved on; each kind lets go of what it is past."""
        self.coordinator.computed(seq)

    def cache_prompt(self, seq: Sequence) -> None:
        """Mutates: `seq`'s computed prompt enters the prefix cache as it runs on, once (its
        partial last block lent, copied), so waiting requests can share it; its pins taken."""
        if seq.num_computed >= seq.prompt_len and seq.inserted_tokens < seq.prompt_len:
            self.coordinator.cached(seq, self._cache_blocks(seq), running=True)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Mutates: `child` holds `parent`'s blocks and prefix lock, and whatever each kind
        gives a fork (a copy of a partial last block); the caller made room (`fork_blocks`)."""
        self.coordinator.fork(parent, child)
        node = self._locks.get(parent.key)
        if node is not None:
            self.cache.lock(node)
            self._locks[child.key] = node

    def free(self, seq: Sequence) -> None:
        """Mutates: `seq` stops (finished, aborted or preempted): its computed blocks enter
        the prefix cache (a partial tail kept, its pins taken), each kind takes back what it
        lent, its lock goes and its blocks are given back."""
        self.coordinator.cached(seq, self._cache_blocks(seq), running=False)
        self.coordinator.release(seq)  # (after its blocks: a state kept at the last one is kept)
        node = self._locks.pop(seq.key, None)
        if node is not None:
            self.cache.unlock(node)
        self.coordinator.free(seq)
        seq.block_ids = []

    def distrust(self, seq: Sequence) -> None:
        """Mutates: nothing more of `seq`'s computed K/V enters the prefix cache (a failed
        step may have left garbage in it); `free` it next."""
        seq.inserted_tokens = max(seq.inserted_tokens, seq.num_computed)

    def _cache_blocks(self, seq: Sequence) -> int:
        """Mutates: hand `seq`'s computed full blocks to the prefix cache (they stay held by
        `seq`). Only known tokens written for sure: not those of a step still in flight (its
        input token may be unread, and it may fail, leaving garbage); a block short waits.
        Returns the known tokens when all their full blocks are in the cache (else 0)."""
        known = min(seq.num_computed - seq.num_in_flight, len(seq.tokens))
        full = known // self.block_size * self.block_size
        if full > seq.inserted_tokens and self.prefix_caching:
            self.cache.insert(seq.tokens[:full], seq.block_ids)
            seq.inserted_tokens = full
        return known if self.prefix_caching and seq.inserted_tokens == full else 0

    # ---- blocks from and for peers -------------------------------------------------------

    def block_layout(self) -> BlockLayout:
        """How one block travels (worker/kv/block_io.py): its shape, dtype, quantization."""
        return block_layout(self.pool)

    def read_cached(self, tokens: list[int], start: int) -> list[np.ndarray]:
        """Host copies of the cached blocks of `tokens` (whole blocks, all cached: see
        `prefix_length`) from block `start` on. Touches the tree's LRU (and may split)."""
        return read_blocks(self.pool, self.cache.match_prefix(tokens).block_ids[start:])

    def import_blocks(self, tokens: list[int], start: int, payloads: list[np.ndarray]) -> int:
        """Mutates: the blocks of `tokens` (whole blocks) from block `start` on, whose K/V
        are `payloads`, stored and cached, those the cache does not hold already (it may have
        changed since they were asked for); the number stored. The cache holds them, not the
        caller: they are evictable. Raises PrefixEvicted when the cache lost a block before
        `start`, OutOfBlocksError when there is no room."""
        bs = self.block_size
        match = self.cache.match_prefix(tokens)  # what the cache holds now, locked below
        have = len(match.block_ids)
        if have >= len(tokens) // bs:
            return 0
        if have < start:
            raise PrefixEvicted("the prefix before the blocks was evicted meanwhile")
        need = len(tokens) // bs - have
        self.cache.lock(match.node)
        try:
            if not self.make_room(need):
                raise OutOfBlocksError(f"no room for {need} blocks")
            new = self.pool.allocate(need)
            try:
                write_blocks(self.pool, new, payloads[have - start :])
                self.cache.insert(tokens, match.block_ids + new)
            finally:
                self.pool.decref(new)  # the prefix cache holds them now (or they are free)
        finally:
            self.cache.unlock(match.node)
        return need

    # ---- figures (none of these mutate) -------------------------------------------------

    def figures(self) -> KVFigures:
        pool, cache, partials = self.pool, self.cache, self.cache.partials
        tails = pool.pages.kept_units(partials.block_ids) if pool.pages else 0
        return KVFigures(
            free_units=pool.room(0),
            total_blocks=pool.num_blocks,
            cached_blocks=cache.cached_blocks,
            cached_partial_units=len(partials) + tails,
            evictable_blocks=cache.evictable_blocks,
            evicted_blocks=cache.evicted_blocks,
            hit_tokens=cache.hit_tokens,
            miss_tokens=cache.miss_tokens,
            partial_hit_tokens=partials.hit_tokens,
            disk_hit_tokens=self.disk.hit_tokens if self.disk else 0,
            pinned_blocks=self.pins.pinned_blocks,
            pins=len(self.pins),
        )

    def cached_hashes(self) -> CachedHashes:
        """Every block the tree and the disk tier hold, by hash (a walk of the tree)."""
        pages = self.pool.pages
        blocks, windowless = [], set()
        for node in self.cache.root.walk():
            for block_id, block_hash in zip(node.block_ids, node.block_hashes, strict=True):
                blocks.append(block_hash)
                if pages is not None and not pages.has_page(block_id):
                    windowless.add(block_hash)
        if self.disk is not None:  # evicted to disk: still this worker's (kv_event_log.py)
            in_tree = set(blocks)
            blocks += sorted(self.disk.store.hashes() - in_tree)
        return CachedHashes(blocks, windowless)

    def held_blocks(self) -> int:
        """Blocks some sequence holds (and window pages held): counted, O(pool)."""
        return self.pool.usage().held

    def disk_blocks(self) -> int:
        """Blocks the disk tier holds (0 without one): its index listed."""
        return len(self.disk.store.blocks()) if self.disk else 0

    # ---- what the router hears (worker/engine/kv_event_log.py) -------------------------

    def left_the_worker(self, event: BlockRemoved) -> BlockRemoved | None:
        """What of the tree's removal `event` this worker no longer holds: blocks evicted to
        the disk tier are still its own (a later request reads them back). None: nothing."""
        if self.disk is None:
            return event
        gone = tuple(h for h in event.block_hashes if h not in self.disk.store)
        return BlockRemoved(gone) if gone else None

    def stored_on_disk(self) -> list[StoredBlock]:
        """The disk tier's blocks (from an earlier run, at start), for the router to hear."""
        return self.disk.store.blocks() if self.disk is not None else []

    def dropped_from_disk(self) -> list[int]:
        """Mutates: the hashes the disk tier dropped since the last call (its own eviction)."""
        return self.disk.store.drain_removed() if self.disk is not None else []

    def usable_units(self, scratch_block: int) -> int:
        """The units requests can use: the pool's less the scratch block's (and its pages)."""
        pages = self.pool.pages
        return self.pool.num_blocks - 1 - (pages.kept_units([scratch_block]) if pages else 0)

    # ---- upkeep -----------------------------------------------------------------------

    def take_copies(self) -> list[tuple[int, int]]:
        """Mutates: the blocks copied on write since the last call, (source, copy), for the
        next forward (a tensor-parallel follower makes them on its shard first)."""
        return self.pool.take_copies()

    def take_scratch_block(self) -> int:
        """Mutates: a block of its own for the runner's padding rows to write (held for ever)."""
        return self.pool.allocate(1)[0]

    def reset(self) -> None:
        """Mutates: the prefix cache dropped (after the start-up checks' own requests)."""
        self.cache.reset()

    def check_integrity(self, running: Iterable[RequestKey] = ()) -> None:
        """Raise IntegrityError unless the pool, the tree, the pins and the recurrent-state
        pool (hybrid models) keep their books, and nothing is kept for a sequence that is
        not `running` (a lock, pages released, snapshot points); no mutation."""
        self.pool.check_integrity()
        self.cache.check_integrity()
        self.coordinator.check_integrity()
        running = set(running)
        for kept in (self._locks, *(k.records() for k in self.kinds)):
            if stray := set(kept) - running:
                raise IntegrityError(f"KV records kept for sequences not running: {stray}")
