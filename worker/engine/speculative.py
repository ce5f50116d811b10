"""Draft tokens for speculative decoding: prompt lookup (n-gram) over a sequence's own tokens.

A decoding sequence whose last n tokens appeared earlier in its prompt or output proposes the
tokens that followed them there. The engine verifies the drafts in the decode forward itself:
each draft token is a one-token row of its own (as a MIXED step's folded prefill tokens are),
so rows that do not draft stay plain one-query decode rows, shared-prefix attention included.
It keeps the longest prefix the model agrees with plus the model's own next token, and rolls
rejected K/V back by bookkeeping alone (`num_computed`; the slots are simply overwritten later).

Per row, where it pays (`choose_drafts`): a draft's rows gather keys (priced as the fold rule
prices folded rows, `ForwardCosts` over `gathered_keys`, the shared prefix once per group) and
go through the weights' matmuls; what it buys is its expected accepted tokens (the row's
acceptance estimate, an EWMA of accepted/drafted, times the draft's length), each a decode
tick's cost per row saved. So a small batch drafts freely, a large one only rows whose drafts
are usually accepted, and a step where no row drafts stays pipelined.
A sequence whose acceptance falls below `MIN_ACCEPTANCE` stops proposing for `COOLDOWN_STEPS`
steps, so text that does not repeat costs next to nothing.
Only greedy sequences draft (their output is then identical to plain decoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker.attention.shared_prefix import gathered_keys

if TYPE_CHECKING:
    from worker.config import EngineConfig
    from worker.engine.scheduler import Scheduler
    from worker.engine.sequence import Sequence
    from worker.engine.step_kind import ForwardCosts

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


def choose_drafts(
    seqs: list[Sequence],
    config: EngineConfig,
    max_context: int,
    costs: ForwardCosts,
    block_size: int,
    first_only: bool = False,
) -> dict[int, list[int]]:
    """The drafts (by `id(seq)`) worth verifying next step among the decoding `seqs`: those
    whose expected accepted tokens, each a decode tick's cost per row, outweigh the keys their
    one-token rows add to the forward's gather and their token slots. The likeliest first
    (`first_only`: stop at the first that pays). Does not mutate (but for the n-gram indexes
    catching up with the tokens). Host ints only: ~12 ms at 64 rows that all draft."""
    if config.speculative == "off" or not seqs:
        return {}
    proposals = []
    for seq in seqs:
        if seq.drafting is not None:
            draft = seq.drafting.propose(seq.tokens, draft_budget(seq, config, max_context))
            if draft:
                proposals.append((seq, draft))
    if not proposals:
        return {}
    tables = [_table(s, s.num_computed + 1, block_size) for s in seqs]
    lengths = [s.num_computed + 1 for s in seqs]
    keys = gathered_keys(tables, lengths, block_size)
    tick = costs.weight_pass_s + keys * costs.key_s + len(seqs) * costs.token_s
    per_row = tick / len(seqs)  # what a decode tick costs each of its rows
    chosen: dict[int, list[int]] = {}
    for seq, draft in sorted(proposals, key=lambda p: -p[0].drafting.acceptance):
        start, k = seq.num_computed + 1, len(draft)
        table = _table(seq, start + k, block_size)
        with_draft = gathered_keys(
            tables + [table] * k, lengths + list(range(start + 1, start + k + 1)), block_size
        )
        cost = (with_draft - keys) * costs.key_s + k * costs.token_s
        if seq.drafting.acceptance * k * per_row > cost:
            chosen[id(seq)] = draft
            tables += [table] * k
            lengths += range(start + 1, start + k + 1)
            keys = with_draft
            if first_only:
                break
    return chosen


def _table(seq: Sequence, num_tokens: int, block_size: int) -> list[int]:
    """`seq`'s block ids for `num_tokens` tokens: blocks it does not have yet stand in as ids
    no other row has (a new block is never shared)."""
    missing = -(-num_tokens // block_size) - len(seq.block_ids)
    return seq.block_ids + [-1 - id(seq) * 64 - i for i in range(max(0, missing))]


def would_draft(scheduler: Scheduler, seqs: list[Sequence]) -> bool:
    """Whether any of the decoding `seqs` would verify a draft next step."""
    s = scheduler
    return bool(choose_drafts(seqs, s.config, s.max_context, s.costs, s.block_size, True))


def plan_drafts(scheduler: Scheduler, decode: list[Sequence]) -> None:
    """Mutates: this step's drafts of the decoding sequences, with blocks for them (only
    from free or evictable blocks: a draft never preempts anyone)."""
    s = scheduler
    for seq in decode:
        seq.draft = []
        if seq.drafting is not None:
            seq.drafting.tick()
    chosen = choose_drafts(decode, s.config, s.max_context, s.costs, s.block_size)
    for seq in decode:
        draft = chosen.get(id(seq))
        end = seq.num_computed + 1 + len(draft or ())
        if draft and s.make_room(s.blocks_needed(seq, end)):
            s.grow(seq, end)
            seq.draft = draft
