"""How batch lines (Batch API work, `Sequence.yields`) give way to interactive requests on one
worker (issue 50). Three rules, each costing the batch a little throughput for the first
token of a request someone is waiting on:

- **pause**: a step where an interactive prompt prefills carries no batch row
  (`yield_to_interactive`); the paused lines keep their blocks and resume intact;
- **hold**: when the last interactive sequence ends, batch work waits up to `hold_s` for the
  next one (`BatchHold.hold_left`). A chat client or an agent sends its next request as soon
  as a reply ends; without the hold, that request finds a batch step just started and waits
  for it (anticipatory scheduling, as disk schedulers wait for a process's next read);
- **no queue ahead**: while interactive work ran within `RECENT_S`, a step of batch rows
  only is not pipelined (`BatchHold.pipelines`): a request arriving then waits for the step
  in flight, not for the next one already queued behind it.

Measured on the default model, 2 workers, this 2-core box: a batch decode step takes
~150-200 ms; a back-to-back client's next request reaches the worker ~20-50 ms after its
last reply ended (docs/benchmarks.md, bench_batch)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence
    from worker.engine.step_kind import PrefillChunk

RECENT_S = 2.0  # interactive work this recent keeps batch-only steps unpipelined (the
# router's `batch_yield_s` default: how long it keeps a worker's batch room small after one)


def yield_to_interactive(
    decode: list[Sequence], prefill: list[PrefillChunk]
) -> tuple[list[Sequence], list[PrefillChunk]]:
    """A step's rows less its batch lines' when an interactive prompt prefills in it: that
    prompt's first token is not slowed by batch rows. The paused lines keep their blocks and
    computed tokens and resume, without recomputing anything, in the first step where no
    interactive prompt prefills. A prompt that only prefills never pauses them for ever: the
    pause needs an interactive chunk in the step, so each paused step moves one on."""
    if all(c.seq.yields for c in prefill):
        return decode, prefill
    return [s for s in decode if not s.yields], [c for c in prefill if not c.seq.yields]


class BatchHold:
    """When interactive work was last seen on this worker, and what that means for batch
    lines now (the hold after it ends; whether a batch-only step may be pipelined)."""

    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic):
        self.hold_s, self.clock = hold_s, clock
        self.ended_at: float | None = None  # when the last interactive sequence left

    def ended(self) -> None:
        """The last interactive sequence just left."""
        self.ended_at = self.clock()

    def hold_left(self, interactive: bool) -> float:
        """Seconds batch work still waits for the next interactive request (0: run it);
        `interactive`: whether interactive work is queued or running now (then no hold)."""
        if interactive or self.ended_at is None or self.hold_s <= 0:
            return 0.0
        return max(0.0, self.ended_at + self.hold_s - self.clock())

    def pipelines(self, interactive: bool) -> bool:
        """Whether a decode step may queue the next one behind it; `interactive`: whether
        interactive work is queued or running (its rows among the step's, then)."""
        if interactive:
            return True
        return self.ended_at is None or self.clock() - self.ended_at >= RECENT_S
