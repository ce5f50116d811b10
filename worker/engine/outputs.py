"""Output building: the token deltas a step hands out, and which choices are still open.

The scheduler changes sequence state (`append_token`, `drop`); this module turns what a step
produced into the protocol's `TokenDelta`s and keeps the count of each request's open
choices, so `Engine` knows when a request is done.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shared.protocol import TokenDelta, Usage
from worker.engine.sequence import Sequence, Status
from worker.kv.memory import OUT_OF_MEMORY, clear_cache, is_out_of_memory
from worker.runner.sampler import TokenLogprob, delta_logprob_fields, prompt_logprob_fields

if TYPE_CHECKING:
    from worker.engine.scheduler import Scheduler


log = logging.getLogger(__name__)


class OutputBuilder:
    """Deltas from sampled tokens; the request ids with choices not finished yet."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
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

    def advance(self, seq: Sequence, tokens: list[int], logprobs: list) -> TokenDelta:
        """`seq` produced `tokens` (one, or several when drafts were accepted); its delta.
        With max_tokens 0 it ends here ("length"), its prompt scored, nothing generated."""
        emitted: list[int] = []
        entries: list[TokenLogprob | None] = []
        reason = None
        if seq.sampling.max_tokens == 0:
            tokens, logprobs, reason = [], [], "length"
            self.scheduler.remove(seq)
        for token, logprob in zip(tokens, logprobs, strict=True):
            reason = self.scheduler.append_token(seq, token, logprob and logprob.logprob)
            # a stop token ends the text, unshown; a token that completed the grammar is shown
            if token not in seq.sampling.stop_token_ids:
                emitted.append(token)
                entries.append(logprob)
            if reason is not None:
                break
        lps = delta_logprob_fields(seq.sampling, entries)
        if seq.scores_prompt:
            lps.update(prompt_logprob_fields(seq.sampling, seq.prompt_logprobs))
            seq.prompt_logprobs_sent = True
        if reason is None:
            # the first tokens carry the prompt's usage: a stream's start reports its cached
            # tokens (Anthropic's message_start) before the reply is done
            first = seq.num_output <= len(tokens)
            usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached) if first else None
            return TokenDelta(seq.request_id, tuple(emitted), None, usage, index=seq.choice, **lps)
        self.close_choice(seq.request_id)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, tuple(emitted), reason, usage, index=seq.choice, **lps)

    def fail(self, seq: Sequence, message: str) -> TokenDelta:
        """End `seq`'s whole request with an error (every choice of it: one failed)."""
        self.forget(seq.request_id)
        for other in [seq, *self.scheduler.sequences_of(seq.request_id)]:
            if other.status is not Status.FINISHED:
                self.scheduler.drop(other)
        usage = Usage(seq.prompt_len, seq.num_output, seq.num_cached)
        return TokenDelta(seq.request_id, (), "error", usage, error=message, index=seq.choice)

    def fail_step(
        self, seqs: list[Sequence], exc: Exception, what: str = "the model step failed"
    ) -> list[TokenDelta]:
        """End the requests of a failed step (or of the part of it that failed: `what`) with
        an error (their blocks are the scheduler's to free); the others go on. An allocation
        failure also empties MLX's buffer cache."""
        if is_out_of_memory(exc):
            log.error("out of memory in a step of %d sequences: %s", len(seqs), exc)
            clear_cache()
            why = f"{OUT_OF_MEMORY}; retry it (another worker may take it), or ask for less: {exc}"
        else:
            log.exception("%s for %d sequences", what, len(seqs), exc_info=exc)
            why = f"{what}: {exc}"
        return self.fail_all(seqs, why)

    def fail_all(self, seqs: list[Sequence], message: str) -> list[TokenDelta]:
        """End the requests of `seqs` with an error: one delta per request still open (n > 1:
        its choices end together)."""
        seen: set[str] = set()
        live = [s for s in seqs if not (s.request_id in seen or seen.add(s.request_id))]
        return [self.fail(s, message) for s in live if self.is_open(s.request_id)]
