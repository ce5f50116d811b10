"""Admission policy: the questions the scheduler asks before taking a waiting request (they
mutate nothing; the scheduler acts on the answers), and the disk tier's extension of a hit.
The hit itself, and what each cache kind takes and gives back, is the coordinator's
(worker/engine/caches/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.engine.scheduler import Scheduler
    from worker.engine.sequence import Sequence
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_cache import MatchResult


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
