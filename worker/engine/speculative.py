"""Draft tokens for speculative decoding: prompt lookup (n-gram) over a sequence's own tokens.

A decoding sequence whose last n tokens appeared earlier in its prompt or output proposes the
tokens that followed them there. The engine verifies the drafts in the decode forward itself:
each draft token is a one-token row of its own (as a MIXED step's folded prefill tokens are),
so rows that do not draft stay plain one-query decode rows, shared-prefix attention included.
It keeps the longest prefix the model agrees with plus the model's own next token, and rolls
rejected K/V back by bookkeeping alone (`num_computed`; the slots are simply overwritten later).

Which drafts a step verifies, where they pay, is the scheduler's choice
(`worker.engine.scheduler.choose_drafts`); this module is one sequence's drafting: its n-gram
proposals and how well they have done. A sequence whose acceptance falls below `MIN_ACCEPTANCE` stops proposing for `COOLDOWN_STEPS`
steps, so text that does not repeat costs next to nothing.
Only greedy sequences draft (their output is then identical to plain decoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
