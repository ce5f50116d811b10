"""A step's plan: which sequences decode, which prefill chunks run, and how the step goes
through the model (its `StepKind`). The scheduler makes plans; the runner runs them, so the
types live here, below both (the runner imports nothing of the engine)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
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
