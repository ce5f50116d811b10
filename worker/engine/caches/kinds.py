"""The cache kinds a model's layers keep beside its full-attention blocks, each a `CacheKind`
(see worker/engine/caches/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from shared.prefix.hit_rule import HitRule

if TYPE_CHECKING:
    from collections.abc import Iterable

    from worker.engine.caches.states import States
    from worker.engine.sequence import Sequence
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_cache import MatchResult
    from worker.kv.radix_partial import PartialHit
    from worker.kv.window_pages import WindowPages
    from worker.runner.plan import RequestKey


class Hit(NamedTuple):
    match: MatchResult  # the full blocks the hit starts from (held once admitted)
    kv_tokens: int  # the tree's K/V match before any kind cut it (states plan from it)
    snapshot: int | None  # the recurrent states' snapshot it starts from (hybrids)
    tails: bool  # whether a partial tail may extend it (the match was not cut)
    tail: PartialHit | None = None  # the partial tail extending it, held until copied

    @property
    def tail_tokens(self) -> int:
        """The prompt tokens its partial tail serves after the full blocks (0 without)."""
        return self.tail.num_tokens if self.tail else 0


class CacheKind:
    """One kind of cache; every question answered as if it were not there."""

    name = "full attention"
    cannot: dict[str, str] = {}  # feature -> why not, for this kind

    def rule(self) -> HitRule:
        return HitRule()

    def gone(self, block_id: int) -> bool:
        """Whether this kind lost what a hit ending just after `block_id` reads."""
        return False

    def kept(self, block_hash: int) -> bool:
        """Whether this kind keeps what a hit ending after the block `block_hash` starts from."""
        return True

    def hold(self, match: MatchResult, end: int) -> None:
        """Mutates: keep what the hit ending at block `end` reads until it is admitted."""

    def tail(self, partial: PartialHit | None) -> PartialHit | None:
        """The partial tail a hit may copy: `partial`, or None if this kind cannot copy it
        (what it keeps of one it lets through is held, like `hold`)."""
        return partial

    def find_tail(
        self, prompt: list[int], match: MatchResult, kinds: list[CacheKind]
    ) -> PartialHit | None:
        """Mutates (holds it): a partial block this kind keeps that extends `match` along
        `prompt`, which every one of `kinds` can copy."""
        return None

    def room(self, seq: Sequence, running: list[Sequence]) -> bool:
        return True

    def plan(self, seq: Sequence, start: int, kv_tokens: int) -> None: ...

    def unplan(self, seq: Sequence) -> None:
        """Mutates: `seq`, planned, was not admitted after all (what `plan` kept goes)."""

    def chunk(self, seq: Sequence, n: int, start: int | None) -> int:
        return n

    def start(self, seq: Sequence, hit: Hit) -> None: ...

    def computed(self, seq: Sequence) -> None: ...

    def cached(self, seq: Sequence, known: int, running: bool) -> None:
        """Mutates: `seq`'s first `known` tokens are in the prefix cache (0: none), as its
        prompt is done and it runs on, or as it stops (`running` False, before `release`)."""

    def fork_blocks(self, parent: Sequence) -> int:
        """New blocks forking `parent`'s pending choices takes."""
        return 0

    def fork(self, parent: Sequence, child: Sequence) -> None: ...

    def release(self, seq: Sequence) -> None: ...

    def free(self, seq: Sequence) -> None: ...

    def give_up(self, block_ids: list[int], hit: Hit) -> None: ...

    def records(self) -> Iterable[RequestKey]:
        """The sequences this kind keeps something for (each must be running)."""
        return ()


class WindowKind(CacheKind):
    """Sliding-window layers' pages (and chunked layers' beside them, as a window of a chunk;
    chunked layers alone: `ChunkKind`): released once every holder of a block is past it,
    kept for hits as spare until taken back; a hit needs them for the blocks just before its
    end."""

    name = "sliding window"
    cannot = {
        "disk": "the disk tier stores full blocks only, not window pages",
        "peer": "peer transfers carry full blocks only, not window pages",
    }

    def __init__(self, pool: BlockPool, pages: WindowPages):
        self.pool, self.pages = pool, pages
        # per running sequence: its leading blocks whose pages it gave up
        self.released: dict[RequestKey, int] = {}

    def rule(self) -> HitRule:
        return HitRule(window_blocks=self.pages.blocks_before_match)

    def gone(self, block_id: int) -> bool:
        return not self.pages.has_page(block_id)

    def hold(self, match: MatchResult, end: int) -> None:
        for block in match.block_ids[self.rule().pages_from(end) : end]:
            self.pages.unspare(block)  # read through the new sequence's window: not taken back

    def tail(self, partial: PartialHit | None) -> PartialHit | None:
        """A partial tail to copy, unless its page is gone (nothing to copy then); kept from
        being taken back until it is copied (room made for new blocks would reuse it)."""
        if partial is None or not self.pages.has_page(partial.block_id):
            return None
        self.pages.unspare(partial.block_id)
        return partial

    def computed(self, seq: Sequence) -> None:
        """Mutates: blocks behind every window of `seq`'s next query, that every holder is
        past, give their pages up as spare."""
        if seq.block_ids:
            end = min(self.pages.out_of_window(seq.num_computed), len(seq.block_ids))
            self._release_before(seq, end)

    def _release_before(self, seq: Sequence, end: int) -> None:
        """Mutates: `seq` gives up the pages of its blocks before `end` (every holder past)."""
        released = self.released.get(seq.key, 0)
        self.released[seq.key] = self.pages.release(
            seq.block_ids, released, end, self.pool.ref_count
        )

    def start(self, seq: Sequence, hit: Hit) -> None:
        self.released[seq.key] = 0

    def records(self) -> Iterable[RequestKey]:
        return self.released

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` is past what its parent is past (its queries come after the parent's)."""
        released = self.released[child.key] = self.released.get(parent.key, 0)
        self.pages.join(child.block_ids[:released])

    def free(self, seq: Sequence) -> None:
        """After `seq`'s blocks were given back: those every holder left is past release."""
        self.pages.leave(seq.block_ids, self.released.pop(seq.key, 0), self.pool.ref_count)

    def give_up(self, block_ids: list[int], hit: Hit) -> None:
        self.pages.settle(block_ids, self.pool.ref_count)


class StateKind(CacheKind):
    """Recurrent states (caches/states.py): a slot per running sequence, snapshots at
    block boundaries where the tree can use them."""

    name = "recurrent state"
    cannot = {
        "disk": "the disk tier carries no recurrent states yet",
        "peer": "peer transfers carry no recurrent states yet",
        "drafts": "recurrent states cannot take back rejected drafts",
        "tp": "its recurrent layers' states are not sharded yet",
        "tails": "a partial tail's states are not kept",
    }

    def __init__(self, states: States):
        self.states = states

    def rule(self) -> HitRule:
        return HitRule(snapshots=True)

    def kept(self, block_hash: int) -> bool:
        return self.states.has_snapshot(block_hash)

    def room(self, seq: Sequence, running: list[Sequence]) -> bool:
        return self.states.room(seq, running)

    def plan(self, seq: Sequence, start: int, kv_tokens: int) -> None:
        self.states.plan(seq, start, kv_tokens)

    def unplan(self, seq: Sequence) -> None:
        self.states.unplan(seq)

    def chunk(self, seq: Sequence, n: int, start: int | None) -> int:
        return self.states.chunk(seq, n, start)

    def start(self, seq: Sequence, hit: Hit) -> None:
        self.states.start(seq, hit.snapshot)

    def computed(self, seq: Sequence) -> None:
        self.states.computed(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.states.fork(parent, child)

    def release(self, seq: Sequence) -> None:
        self.states.release(seq)

    def records(self) -> Iterable[RequestKey]:
        return self.states.records()
