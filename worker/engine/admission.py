"""Admission policy: the questions the scheduler asks before taking a waiting request (they
mutate nothing; the scheduler acts on the answers). The hit itself, whether a prompt fits,
and what each cache kind takes and gives back, are the KV manager's (worker/engine/caches/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence


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
