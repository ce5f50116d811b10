"""The coordinator over a model's cache kinds (see the package docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.hashing import hash_blocks
from shared.prefix.hit_rule import HitRule
from worker.engine.caches.chunks import ChunkKind
from worker.engine.caches.kinds import CacheKind, Hit, StateKind, WindowKind
from worker.engine.caches.states import NO_STATES
from worker.engine.caches.tails import TailKind
from worker.kv.pins import PrefixPins

if TYPE_CHECKING:
    from worker.engine.caches.states import States
    from worker.engine.sequence import Sequence
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_cache import MatchResult, RadixCache


def kinds_of(pool: BlockPool, cache: RadixCache, states: States) -> list[CacheKind]:
    """The cache kinds a model has beside its full-attention blocks."""
    kinds: list[CacheKind] = []
    if pool.pages is not None:
        kinds.append((ChunkKind if pool.pages.chunked else WindowKind)(pool, pool.pages))
    if states.active:
        kinds.append(StateKind(states))
    kinds.append(TailKind(pool, cache))  # every model (a kind above may refuse its tails)
    return kinds


class CacheCoordinator:
    """Asks every kind (see the module docstring); owns the full blocks' reference counts and
    the cache pins (worker/kv/pins.py): a request's pins are taken as its prompt enters the
    prefix cache (`cached`), within `pin_share` of the pool (less the scratch block)."""

    def __init__(
        self, pool: BlockPool, cache: RadixCache, states: States | None, pin_share: float = 0.0
    ) -> None:
        """`states`: a hybrid model's (None: NO_STATES); `pin_share`: 0, no pins."""
        self.pool, self.cache, self.states = pool, cache, states or NO_STATES
        self.pins = PrefixPins(cache, int(pin_share * (pool.num_blocks - 1)))
        self.kinds: list[CacheKind] = []
        self.rule, self._hashes = HitRule(), False
        for kind in kinds_of(pool, cache, self.states):
            self.register(kind)

    def register(self, kind: CacheKind) -> None:
        """Mutates: one more kind asked; the hit rule is every kind's at once."""
        self.kinds.append(kind)
        rules = [k.rule() for k in self.kinds]
        self.rule = HitRule(
            max(r.window_blocks for r in rules),
            any(r.snapshots for r in rules),
            max(r.chunk_blocks for r in rules),
        )
        self._hashes = self._hashes or type(kind).kept is not CacheKind.kept

    def cannot(self, feature: str) -> str | None:
        """Why the model's caches rule `feature` out ("disk", "peer", "drafts", "tails"), or
        None when every kind allows it."""
        return next((k.cannot[feature] for k in self.kinds if feature in k.cannot), None)

    # ---- admission ----

    def hit(self, prompt: list[int]) -> Hit:
        """The prefix match cut to the deepest end every kind can serve; what it reads is
        held from being taken back. Mutates the tree's LRU (and may split a node)."""
        bs, match = self.cache.block_size, self.cache.match_prefix(prompt)
        ids, depth = match.block_ids, len(match.block_ids)
        hashes = hash_blocks(prompt[: depth * bs], bs) if self._hashes and depth else []
        end = self.rule.usable(
            depth,
            window_gone=lambda i: any(k.gone(ids[i]) for k in self.kinds),
            snapshot_after=lambda i: all(k.kept(hashes[i]) for k in self.kinds),
        )
        if end < depth:
            match = self.cache.match_prefix(prompt[: end * bs])
        for kind in self.kinds:
            kind.hold(match, end)
        snapshot = hashes[end - 1] if self.rule.snapshots and end else None
        tails = end == depth
        return Hit(match, depth * bs, snapshot, tails)

    def tail(self, prompt: list[int], hit: Hit, match: MatchResult) -> Hit:
        """Mutates: `hit` from `match` on (its own, or longer: loaded from disk), with the
        partial tail extending it if a kind keeps one every kind can copy (held until `start`
        copies it or `give_up`). A tail follows a node the tree matched: not after a cut or a
        disk load."""
        if not hit.tails or match is not hit.match:
            return hit
        found = (k.find_tail(prompt, match, self.kinds) for k in self.kinds)
        return hit._replace(tail=next((t for t in found if t is not None), None))

    def room(self, seq: Sequence, running: list[Sequence]) -> bool:
        return all(k.room(seq, running) for k in self.kinds)

    def plan(self, seq: Sequence, start: int, kv_tokens: int) -> None:
        for kind in self.kinds:
            kind.plan(seq, start, kv_tokens)

    def unplan(self, seq: Sequence) -> None:
        for kind in self.kinds:
            kind.unplan(seq)

    def chunk(self, seq: Sequence, n: int, start: int | None = None) -> int:
        for kind in self.kinds:
            n = kind.chunk(seq, n, start)
        return n

    def give_up(self, block_ids: list[int], hit: Hit) -> None:
        """Mutates: a hit not admitted gives its blocks (and what each kind held) back."""
        self.pool.decref(block_ids)
        for kind in self.kinds:
            kind.give_up(block_ids, hit)

    # ---- running sequences ----

    def start(self, seq: Sequence, hit: Hit) -> None:
        for kind in self.kinds:
            kind.start(seq, hit)

    def computed(self, seq: Sequence) -> None:
        for kind in self.kinds:
            kind.computed(seq)

    def cached(self, seq: Sequence, known: int, running: bool) -> None:
        """Mutates: `seq`'s first `known` tokens are in the prefix cache, as its prompt is
        done and it runs on, or as it stops (`running` False: before `release`); its pins on
        them are taken (0 with prefix caching off: none are)."""
        for kind in self.kinds:
            kind.cached(seq, known, running)
        if seq.pins:
            seq.pins = self.pins.take(seq.tokens, seq.pins, known)

    def fork_blocks(self, parent: Sequence) -> int:
        """New blocks forking `parent`'s pending choices takes (see `fork`)."""
        return sum(k.fork_blocks(parent) for k in self.kinds)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Mutates: `child` holds `parent`'s blocks, and whatever each kind gives a fork."""
        self.pool.incref(child.block_ids)
        for kind in self.kinds:
            kind.fork(parent, child)

    def release(self, seq: Sequence) -> None:
        """Mutates: `seq` finishes or is preempted, its blocks in the tree: each kind takes
        back what it lent (states: a snapshot at its last block is kept, then its slot goes)."""
        for kind in self.kinds:
            kind.release(seq)

    def check_integrity(self) -> None:
        """Raise IntegrityError unless the pins and the recurrent-state pool (hybrid models)
        keep their books; no mutation. (The pool and the tree check their own.)"""
        self.pins.check_integrity()
        if self.states.active:
            self.states.pool.check()

    def free(self, seq: Sequence) -> None:
        """Mutates: `seq`'s blocks go back (it may have been the last holder)."""
        self.pool.decref(seq.block_ids)
        for kind in self.kinds:
            kind.free(seq)
