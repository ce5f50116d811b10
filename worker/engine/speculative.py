"""Draft tokens for speculative decoding: prompt lookup (n-gram) over a sequence's own tokens.

A decoding sequence whose last n tokens appeared earlier in its prompt or output proposes the
tokens that followed them there. The engine verifies every sequence's drafts in one batched
forward over the paged KV (each decode row carries its last token plus its drafts), keeps the
longest prefix the model agrees with plus the model's own next token, and rolls rejected K/V
back by bookkeeping alone (`num_computed`; the slots are simply overwritten later).

Adaptive: a sequence whose recent acceptance rate falls below `MIN_ACCEPTANCE` stops drafting
for `COOLDOWN_STEPS` steps, so text that does not repeat costs next to nothing.
Only greedy sequences draft (their output is then identical to plain decoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.config import EngineConfig
    from worker.engine.scheduler import Scheduler
    from worker.engine.sequence import Sequence

NGRAM_SIZES = (3, 2)  # longest first: a longer match predicts better
MIN_ACCEPTANCE = 0.3
COOLDOWN_STEPS = 16
EMA = 0.7  # weight of the history in the acceptance average


@dataclass
class NgramIndex:
    """Where each n-gram of a growing token list last ended, excluding the trailing one."""

    n: int
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    next_end: int = 0

    def update(self, tokens: list[int]) -> None:
        for end in range(max(self.next_end, self.n), len(tokens)):
            self.ends[tuple(tokens[end - self.n : end])] = end
        self.next_end = max(self.next_end, len(tokens))

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        if len(tokens) < self.n:
            return []
        end = self.ends.get(tuple(tokens[-self.n :]))
        return tokens[end : end + k] if end is not None else []


@dataclass
class DraftState:
    """One sequence's drafting: its n-gram indexes and how well its drafts have done."""

    indexes: list[NgramIndex] = field(default_factory=lambda: [NgramIndex(n) for n in NGRAM_SIZES])
    acceptance: float = 1.0
    cooldown: int = 0
    proposed: int = 0
    accepted: int = 0

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` draft tokens to follow `tokens` (none while cooling down)."""
        if k <= 0 or self.cooldown > 0:
            return []
        for index in self.indexes:
            index.update(tokens)
            if draft := index.lookup(tokens, k):
                return draft
        return []

    def tick(self) -> None:
        """One decode step went by (a cooldown counts steps)."""
        if self.cooldown > 0:
            self.cooldown -= 1

    def record(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.acceptance = EMA * self.acceptance + (1 - EMA) * accepted / proposed
        if self.acceptance < MIN_ACCEPTANCE:
            self.cooldown, self.acceptance = COOLDOWN_STEPS, 0.5  # retry later, half trusted


def accepted_prefix(draft: list[int], targets: list[int]) -> int:
    """How many draft tokens the model agrees with: `targets[i]` is its choice after the
    last token and `draft[:i]`."""
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return n


def draft_budget(seq: Sequence, config: EngineConfig, max_context: int) -> int:
    """Most draft tokens `seq` may verify this step (its token and context limits)."""
    left = min(
        seq.sampling.max_tokens - seq.num_output - 1,
        max_context - len(seq.tokens) - 2,
    )
    return max(0, min(config.spec_tokens, left))


def would_draft(seqs: list[Sequence], config: EngineConfig, max_context: int) -> bool:
    """Whether any of the decoding `seqs` would propose a draft next step."""
    if config.speculative == "off" or len(seqs) > config.spec_max_batch:
        return False
    return any(
        s.drafting is not None
        and s.drafting.propose(s.tokens, draft_budget(s, config, max_context))
        for s in seqs
    )


def plan_drafts(scheduler: Scheduler, decode: list[Sequence]) -> None:
    """Mutates: this step's drafts of the decoding sequences, with blocks for them (only
    from free or evictable blocks: a draft never preempts anyone)."""
    config, max_context = scheduler.config, scheduler.max_context
    speculate = config.speculative != "off" and len(decode) <= config.spec_max_batch
    for seq in decode:
        seq.draft = []
        if seq.drafting is None:
            continue
        seq.drafting.tick()
        if not speculate:
            continue
        draft = seq.drafting.propose(seq.tokens, draft_budget(seq, config, max_context))
        end = seq.num_computed + 1 + len(draft)
        if draft and scheduler.make_room(scheduler.blocks_needed(seq, end)):
            scheduler.grow(seq, end)
            seq.draft = draft
