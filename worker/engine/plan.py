"""A step's plan: which sequences decode, which prefill chunks run, and how the step goes
through the model (its `StepKind`). The scheduler makes plans; the runner runs them."""

from __future__ import annotations

import enum
from typing import NamedTuple

from worker.engine.sequence import Sequence


class PrefillChunk(NamedTuple):
    seq: Sequence
    num_tokens: int


class StepKind(enum.Enum):
    """How one step's work goes through the model."""

    DECODE = "decode"  # one token per decoding sequence, one forward (pipelined when steady)
    MIXED = "mixed"  # decode rows + short prefill chunks as one-token rows, one forward
    SEPARATE = "separate"  # a decode forward, then a prefill forward (chunks too long to fold)
    PREFILL = "prefill"  # prefill chunks only, rows right-padded to a common length
    IDLE = "idle"  # nothing to run


class StepPlan(NamedTuple):
    kind: StepKind
    decode: list[Sequence]
    prefill: list[PrefillChunk]
    preempted: list[Sequence]

    def split(self) -> list[StepPlan]:
        """The forwards this plan runs, in order: a SEPARATE plan is a DECODE then a PREFILL."""
        if self.kind is not StepKind.SEPARATE:
            return [self]
        return [
            StepPlan(StepKind.DECODE, self.decode, [], self.preempted),
            StepPlan(StepKind.PREFILL, [], self.prefill, []),
        ]


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
