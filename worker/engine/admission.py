"""Admission policy: the questions the scheduler asks before taking a waiting request (they
mutate nothing; the scheduler acts on the answers). The hit itself, and what each cache kind
takes and gives back, is the coordinator's (worker/engine/caches/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence
    from worker.kv.block_pool import BlockPool


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
