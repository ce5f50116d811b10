"""Output building: the token deltas a step hands out, and which choices are still open.

The scheduler changes sequence state (`append_token`, `drop`; the engine applies a step's
results through it); this module turns what a step produced into the protocol's
`TokenDelta`s and keeps the count of each request's open choices, so `Engine` knows when a
request is done.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shared.protocol import TokenDelta, Usage
from worker.kv.memory import OUT_OF_MEMORY, clear_cache, is_out_of_memory
from worker.runner.sampler import delta_logprob_fields, prompt_logprob_fields

if TYPE_CHECKING:
    from worker.engine.sequence import Sequence


log = logging.getLogger(__name__)


class OutputBuilder:
    """Deltas from sampled tokens; the request ids with choices not finished yet."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}  # request id -> its choices not finished yet

    def is_open(self, request_id: str) -> bool:
        return request_id in self._open

    def open(self, request_id: str, choices: int) -> None:
        self._open[request_id] = choices

    def forget(self, request_id: str) -> None:
        """The whole request is over (aborted): no choice of it is open any more."""
        self._open.pop(request_id, None)

    def close_choice(self, request_id: str) -> None:
        left = self._open.get(request_id, 0) - 1
        if left > 0:
            self._open[request_id] = left
        else:
            self._open.pop(request_id, None)

    @staticmethod
    def record_prompt(scored: list[tuple]) -> None:
        """Mutates: the prompt logprobs a step computed, kept on their sequences by position
        (a recomputed chunk, after a preemption, replaces what it had)."""
        for seq, position, logprob, rank, top in scored:
            del seq.prompt_logprobs[position - 1 :]
            seq.prompt_logprobs.append((logprob, rank, top))

    def delta(
        self, seq: Sequence, emitted: list[int], entries: list, reason: str | None, produced: int
    ) -> TokenDelta:
        """`seq`'s delta for the `produced` tokens of a step, of which it shows `emitted` (with
        their logprob `entries`); `reason` when they ended it (its choice is then closed).
        Mutates: its prompt logprobs are marked sent with the first delta."""
        lps = delta_logprob_fields(seq.sampling, entries)
        if seq.scores_prompt:
            lps.update(prompt_logprob_fields(seq.sampling, seq.prompt_logprobs))
            seq.prompt_logprobs_sent = True
        if reason is None:
            # the first tokens carry the prompt's usage: a stream's start reports its cached
            # tokens (Anthropic's message_start) before the reply is done
            first = seq.num_output <= produced
            usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached) if first else None
            return TokenDelta(seq.request_id, tuple(emitted), None, usage, index=seq.choice, **lps)
        self.close_choice(seq.request_id)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, tuple(emitted), reason, usage, index=seq.choice, **lps)

    @staticmethod
    def error(seq: Sequence, message: str) -> TokenDelta:
        """The delta that ends `seq`'s request with an error."""
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, (), "error", usage, error=message, index=seq.choice)

    @staticmethod
    def failure(seqs: list[Sequence], exc: Exception, what: str = "the model step failed") -> str:
        """What the requests of a failed step are told (logged here). An allocation failure
        also empties MLX's buffer cache."""
        if is_out_of_memory(exc):
            log.error("out of memory in a step of %d sequences: %s", len(seqs), exc)
            clear_cache()
            return f"{OUT_OF_MEMORY}; retry it (another worker may take it), or ask for less: {exc}"
        log.exception("%s for %d sequences", what, len(seqs), exc_info=exc)
        return f"{what}: {exc}"
