"""Which kind of step a set of rows makes (`StepKind`): the scheduler's rule for folding
prefill chunks into a decode forward; and what is left of a part of a step to run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.engine.sequence import Status
from worker.runner.plan import PrefillChunk, StepKind, StepPlan

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


def still_running(part: StepPlan) -> StepPlan:
    """`part` of a step less the sequences no longer RUNNING: a failed earlier part (the decode
    half of a SEPARATE step) ended its requests, every choice of them, and freed their blocks.
    IDLE when nothing is left."""
    decode = [s for s in part.decode if s.status is Status.RUNNING]
    prefill = [c for c in part.prefill if c.seq.status is Status.RUNNING]
    kind = part.kind if decode or prefill else StepKind.IDLE
    return part._replace(kind=kind, decode=decode, prefill=prefill)
