"""Which kind of step a set of rows makes (`StepKind`): the scheduler's rule for folding
prefill chunks into a decode forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.runner.plan import PrefillChunk, StepKind

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence


# Most context slots that folded prefill rows may gather in one step: each one-token row of a
# MIXED forward gathers its whole context, so only short chunks are worth folding.
FOLD_CONTEXT_SLOTS = 16384


def plan_kind(decode: list[Sequence], prefill: list[PrefillChunk]) -> StepKind:
    if not decode:
        return StepKind.PREFILL if prefill else StepKind.IDLE
    if not prefill:
        return StepKind.DECODE
    folded = sum(c.num_tokens * (c.seq.num_computed + c.num_tokens) for c in prefill)
    return StepKind.MIXED if folded <= FOLD_CONTEXT_SLOTS else StepKind.SEPARATE
