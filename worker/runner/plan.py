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
    MIXED = "mixed"  # decode rows + prefill chunks as one-token rows ("folded"), one forward
    SEPARATE = "separate"  # a decode forward (with the folded chunks), then prefill forwards
    PREFILL = "prefill"  # prefill forwards only, rows right-padded to their forward's longest
    IDLE = "idle"  # nothing to run


class StepPlan(NamedTuple):
    """A step: `decode` rows and `prefill` chunks, the first `folded` of them one-token rows
    of the decode forward (or of a flat forward of their own when nothing decodes); the rest
    in padded prefill forwards of `groups` chunks each, in order (no groups: one forward)."""

    kind: StepKind
    decode: list[Sequence]
    prefill: list[PrefillChunk]
    preempted: list[Sequence]
    folded: int = 0
    groups: tuple[int, ...] = ()

    def split(self) -> list[StepPlan]:
        """The forwards this plan runs, in order: the decode forward (DECODE, or MIXED with
        its folded chunks), then each PREFILL forward."""
        if self.kind in (StepKind.DECODE, StepKind.MIXED, StepKind.IDLE):
            return [self]
        folded, rest = self.prefill[: self.folded], self.prefill[self.folded :]
        parts = []
        if self.decode or folded:
            kind = StepKind.MIXED if folded else StepKind.DECODE
            parts.append(StepPlan(kind, self.decode, folded, []))
        at = 0
        for size in self.groups or (len(rest),):
            if size:
                parts.append(StepPlan(StepKind.PREFILL, [], rest[at : at + size], []))
            at += size
        return [parts[0]._replace(preempted=self.preempted), *parts[1:]] if parts else []
