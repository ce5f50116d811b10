"""How prompts share a step: long attention one prompt at a time, oldest first.

A prefill chunk's attention reads, for each of its queries, every key before it: its work is
its tokens times its context after it. 256 queries over a 19k-token cached system prompt are
~4.9M query-key pairs; a fresh 256-token prompt, 66k. Every chunk in a step finishes when the
step does, so two long chunks side by side both take twice as long, where one after the other
the first finishes in half the time and the second no later. Two new coding-agent sessions
that arrive together (each ~1.5k tokens after the cached ~19k) are that case.

So a step's first chunk (the oldest prompt's: running prompts by arrival, then the queue in
order) runs whatever its work. A later chunk joins the step only while the step's work stays
within the first's plus `short`: what a step of short prompts reads
(`prefill_chunk` x `step_token_budget` pairs). Short prompts, and chunks early in a prompt,
still ride beside a long chunk; another long one waits for the next step.
"""

from __future__ import annotations


class PrefillWork:
    """One step's prefill work: query-key pairs its chunks read (mutated while planning)."""

    def __init__(self, short: int):
        self.short = short
        self.allowed: int | None = None  # set by the step's first chunk
        self.used = 0

    def fits(self, num_tokens: int, context: int) -> bool:
        """Whether a chunk of `num_tokens` ending at `context` tokens may join the step."""
        return self.allowed is None or self.used + num_tokens * context <= self.allowed

    def take(self, num_tokens: int, context: int) -> None:
        """Mutates: the chunk joins the step."""
        work = num_tokens * context
        if self.allowed is None:
            self.allowed = work + self.short
        self.used += work
