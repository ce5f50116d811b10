"""Admission policy: the questions the scheduler asks before taking a waiting request (they
mutate nothing; the scheduler acts on the answers), the hit every cache kind agrees on
(`usable_hit`, shared/prefix/hit_rule.py), and the sliding-window rules for running sequences
(`worker.kv.window_pages`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.hashing import hash_blocks
from shared.prefix.hit_rule import HitRule

if TYPE_CHECKING:
    from worker.engine.scheduler import Scheduler
    from worker.engine.sequence import Sequence
    from worker.engine.states import States
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_cache import MatchResult, RadixCache
    from worker.kv.radix_partial import PartialHit


def fits_whole_prompt(
    seq: Sequence, matched_blocks: int, running: list[Sequence], pool: BlockPool, room: int
) -> bool:
    """Whether `seq`'s whole prompt (and its first output token) fits beside what the
    running sequences still need for theirs, in `room` (free and evictable units), its
    `matched_blocks` cached already. Admitting on the first chunk alone overcommits the pool
    under KV pressure: the later chunks then preempt newer sequences, whose recomputation
    evicts the cached prefixes that waiting requests would have hit. With nothing running, a
    prompt is admitted anyway (alone)."""
    if not running:
        return True
    need = pool.units_for(pool.blocks_for_tokens(len(seq.tokens) + 1) - matched_blocks)
    pending = sum(
        pool.units_for(max(0, pool.blocks_for_tokens(len(s.tokens) + 1) - len(s.block_ids)))
        for s in running
    )
    return need + pending <= room


def shares_pending_prefill(seq: Sequence, end: int, running: list[Sequence]) -> bool:
    """Whether a running prefill will cache `seq`'s prompt up to `end` (one block past what
    is cached now): then `seq` waits for it and hits those blocks instead of computing them."""
    if len(seq.tokens) <= end:
        return False
    head = seq.tokens[:end]
    return any(
        p.num_computed < p.prompt_len and p.prompt_len >= end and p.tokens[:end] == head
        for p in running
    )


def usable_hit(
    cache: RadixCache, pool: BlockPool, states: States, prompt: list[int]
) -> tuple[MatchResult, int, int | None, bool]:
    """(the prefix match as a hit can use it, the K/V match's length in tokens, the block hash
    of the snapshot it starts from or None, whether a partial tail may extend it).

    The tree's match is cut to the deepest end every cache kind of the model can serve
    (shared/prefix/hit_rule.py, the rule the router's index applies too): window layers need their
    pages for the blocks just before the end, recurrent states a snapshot at it. A partial
    tail follows only an uncut match. Mutates the tree's LRU (and may split a node), and keeps
    the pages the hit reads from being taken back."""
    bs = cache.block_size
    match = cache.match_prefix(prompt)
    depth, pages = len(match.block_ids), pool.pages
    rule = HitRule(pages.blocks_before_match if pages is not None else 0, states.active)
    ids = match.block_ids
    hashes = hash_blocks(prompt[: depth * bs], bs) if states.active else []
    end = rule.usable(
        depth,
        window_gone=lambda i: pages is not None and not pages.has_page(ids[i]),
        snapshot_after=lambda i: states.has_snapshot(hashes[i]),
    )
    if end < depth:
        match = cache.match_prefix(prompt[: end * bs])
    if pages is not None:
        for block in match.block_ids[max(0, end - pages.blocks_before_match) :]:
            pages.unspare(block)  # read through the new sequence's window: not to be taken back
    snapshot = hashes[end - 1] if states.active and end else None
    return match, depth * bs, snapshot, end == depth


def window_tail(pool: BlockPool, partial: PartialHit | None) -> PartialHit | None:
    """A partial tail to copy, unless window layers lost its page (nothing to copy then).
    Mutates: its pages are kept from being taken back until it is copied (making room for
    the new blocks first would otherwise reuse them, and the copy would read another's)."""
    if partial is None or pool.pages is None:
        return partial
    if pool.pages.has_page(partial.block_id):
        pool.pages.unspare(partial.block_id)
        return partial
    return None


def release_windows(pool: BlockPool, seq: Sequence) -> None:
    """Mutates: `seq` is past its blocks behind every window of its next query; those every
    holder is past give their window pages up as spare (kept for hits until taken back)."""
    pages = pool.pages
    if pages is not None and seq.block_ids:
        end = min(pages.out_of_window(seq.num_computed), len(seq.block_ids))
        seq.window_released = pages.release(seq.block_ids, seq.window_released, end, pool.ref_count)


def hold_fork(pool: BlockPool, parent: Sequence, child: Sequence) -> None:
    """Mutates: `child` holds `parent`'s blocks, and is past what its parent is past (its
    queries come after the parent's), so those blocks stay released."""
    pool.incref(child.block_ids)
    child.window_released = parent.window_released
    if pool.pages is not None:
        pool.pages.join(child.block_ids[: child.window_released])


def let_go(pool: BlockPool, seq: Sequence) -> None:
    """Mutates: `seq` gives its blocks back; those every holder left is past are released
    (`seq` may have been the last holder not past a shared block)."""
    pool.decref(seq.block_ids)
    if pool.pages is not None:
        pool.pages.leave(seq.block_ids, seq.window_released, pool.ref_count)
    seq.window_released = 0


def give_up_hit(pool: BlockPool, block_ids: list[int], partial: PartialHit | None) -> None:
    """Mutates: a hit not admitted gives its blocks (and its partial tail's) back; the pages
    it kept from going spare (`usable_hit`) go spare again where every holder is past them."""
    pool.decref(block_ids + ([partial.block_id] if partial else []))
    if pool.pages is not None:
        pool.pages.settle(block_ids, pool.ref_count)


def from_disk(sched: Scheduler, prompt: list[int], match: MatchResult) -> MatchResult:
    """Mutates: the prompt's blocks after `match` that the disk tier holds, loaded into new
    blocks (held, like the match's) and put back in the prefix cache; the longer match."""
    from worker.kv.radix_cache import MatchResult

    bs, start = sched.block_size, len(match.block_ids)
    wanted = len(prompt) // bs - start
    if sched.disk is None or wanted <= 0 or not sched.config.enable_prefix_cache:
        return match
    hits = sched.disk.find(prompt, start, wanted)
    if not hits or not sched.make_room(len(hits)):
        return match
    loaded = sched.pool.allocate(len(hits))
    sched.disk.load(loaded, hits)
    block_ids = match.block_ids + loaded
    sched.cache.insert(prompt[: len(block_ids) * bs], block_ids)
    return MatchResult(match.node, block_ids, len(block_ids) * bs)


def chunk_that_fits(sched: Scheduler, room: int, matched_blocks: int, done: int, n: int) -> int:
    """`n`, cut so the chunk's new blocks fit in `room` units (free, spare, evictable), when
    nothing runs: then nothing will free more, and a chunk that does not fit would leave the
    request waiting for ever (a long prompt near the pool's size, beside a held partial
    hit). At least one token: the intake already checked that the prompt fits."""
    if sched.running:
        return n
    pool = sched.pool
    fit = (matched_blocks + room // pool.unit_cost) * pool.block_size - done
    return min(n, max(1, fit))
