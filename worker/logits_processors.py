"""What changes a row's logits before sampling: logit bias, penalties, a grammar's mask.

Each sequence that asks for any of these holds a `LogitsState`. Its device arrays are built
once, at admission, from host ints (the bias as a dense (V,) row; the prompt's token set for
repetition_penalty) and then advanced on the device by the step's own sampled token, like
the rng keys: a pipelined step whose input tokens are still on the device needs nothing from
the host. Per step the sampler gathers only the rows that have state, so a batch without
any pays nothing; with some, it costs one gather, a few (P, V) element-wise ops and one
scatter.

Penalty semantics: presence_penalty and frequency_penalty count generated tokens only
(OpenAI): logit -= frequency * count + presence * (count > 0). repetition_penalty (HF) counts
each distinct token of prompt + output once: a positive logit is divided by it, a negative
one multiplied.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from shared.sampling import InvalidRequest, SamplingParams
from worker.grammar import GrammarCompiler, GrammarMatcher

NEG_INF = -float("inf")


class LogitsState:
    """One sequence's logit processors: device rows for bias and penalties, a host matcher
    for its grammar."""

    def __init__(
        self,
        params: SamplingParams,
        bias: mx.array | None,
        counts: mx.array | None,
        seen: mx.array | None,
        grammar: GrammarMatcher | None,
    ):
        self.params = params
        self.bias = bias  # (V,) float32
        self.counts = counts  # (V,) float32: occurrences in the output so far
        self.seen = seen  # (V,) bool: in prompt or output so far
        self.grammar = grammar

    @classmethod
    def create(
        cls,
        params: SamplingParams,
        prompt: list[int],
        vocab_size: int,
        grammars: GrammarCompiler | None,
    ) -> LogitsState | None:
        """The state `params` needs (None when it needs none); InvalidRequest on a bad
        grammar or one this worker cannot serve. Host work only, no device reads."""
        if not params.processes_logits:
            return None
        earlier_output = prompt[len(prompt) - params.prior_output_tokens :]
        bias = counts = seen = None
        if params.logit_bias:
            ids = [b.token_id for b in params.logit_bias]
            row = np.zeros(vocab_size, dtype=np.float32)
            np.add.at(row, ids, [b.bias for b in params.logit_bias])
            bias = mx.array(row)
        if params.presence_penalty or params.frequency_penalty:
            counts = mx.array(np.bincount(earlier_output, minlength=vocab_size).astype(np.float32))
        if params.repetition_penalty != 1.0:
            present = np.zeros(vocab_size, dtype=np.bool_)
            present[np.asarray(prompt, dtype=np.int64)] = True
            seen = mx.array(present)
        grammar = None
        if params.grammar is not None:
            if grammars is None:
                raise InvalidRequest("this worker has no tokenizer for grammar-constrained output")
            grammar = grammars.compile(params.grammar, params.stop_token_ids)
            grammar.advance_all(list(earlier_output))
        return cls(params, bias, counts, seen, grammar)

    def fork(self) -> LogitsState:
        """An independent copy for another choice (device rows are immutable: shared)."""
        grammar = self.grammar.fork() if self.grammar is not None else None
        return LogitsState(self.params, self.bias, self.counts, self.seen, grammar)

    @property
    def penalized(self) -> bool:
        return self.counts is not None or self.seen is not None

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.counts, self.seen) if a is not None]


def apply_bias_and_penalties(logits: mx.array, states: list[LogitsState | None]) -> mx.array:
    """`logits` (B, V) float32 with each row's bias and penalties applied (rows without
    state untouched and not read)."""
    rows = [
        i for i, s in enumerate(states) if s is not None and (s.bias is not None or s.penalized)
    ]
    if not rows:
        return logits
    picked = [states[i] for i in rows]
    idx = mx.array(rows, dtype=mx.int32)
    sub = logits[idx]
    sub = _repetition(sub, picked)
    sub = _presence_frequency(sub, picked)
    with_bias = [j for j, s in enumerate(picked) if s.bias is not None]
    if with_bias:
        bias = _stack_rows(picked, with_bias, lambda s: s.bias, sub.shape[-1], mx.float32)
        sub = sub + bias
    logits[idx] = sub
    return logits


def _stack_rows(states, which: list[int], get, vocab: int, dtype) -> mx.array:
    """(len(states), V): get(state) for the rows in `which`, zeros for the others."""
    zero = mx.zeros((vocab,), dtype=dtype)
    chosen = set(which)
    return mx.stack([get(s) if j in chosen else zero for j, s in enumerate(states)])


def _repetition(sub: mx.array, picked: list[LogitsState]) -> mx.array:
    with_rep = [j for j, s in enumerate(picked) if s.seen is not None]
    if not with_rep:
        return sub
    seen = _stack_rows(picked, with_rep, lambda s: s.seen, sub.shape[-1], mx.bool_)
    penalty = mx.array([s.params.repetition_penalty for s in picked], dtype=mx.float32)[:, None]
    penalized = mx.where(sub > 0, sub / penalty, sub * penalty)
    return mx.where(seen, penalized, sub)


def _presence_frequency(sub: mx.array, picked: list[LogitsState]) -> mx.array:
    with_counts = [j for j, s in enumerate(picked) if s.counts is not None]
    if not with_counts:
        return sub
    counts = _stack_rows(picked, with_counts, lambda s: s.counts, sub.shape[-1], mx.float32)
    freq = mx.array([s.params.frequency_penalty for s in picked], dtype=mx.float32)[:, None]
    pres = mx.array([s.params.presence_penalty for s in picked], dtype=mx.float32)[:, None]
    return sub - freq * counts - pres * (counts > 0).astype(mx.float32)


def record_sampled(states: list[LogitsState | None], tokens: mx.array) -> None:
    """Mutates: each penalized row's counts/seen advanced by its sampled token (on the
    device, still lazy: the caller evaluates `LogitsState.arrays()` with the step)."""
    for i, s in enumerate(states):
        if s is None or not s.penalized:
            continue
        vocab = (s.counts if s.counts is not None else s.seen).shape[0]
        one_hot = mx.arange(vocab) == tokens[i]
        if s.counts is not None:
            s.counts = s.counts + one_hot.astype(mx.float32)
        if s.seen is not None:
            s.seen = s.seen | one_hot


def apply_grammar_masks(logits: mx.array, states: list[LogitsState | None]) -> mx.array:
    """Tokens the rows' grammars forbid set to -inf. The masks are computed on the host
    while the forward that produces `logits` already runs (queued first)."""
    rows = [i for i, s in enumerate(states) if s is not None and s.grammar is not None]
    if not rows:
        return logits
    mx.async_eval(logits)  # the device computes the logits while the host fills the masks
    packed = states[rows[0]].grammar.compiler.fill_masks([states[i].grammar for i in rows])
    vocab = logits.shape[-1]
    words = mx.array(packed.view(np.uint32))
    bits = mx.right_shift(words[:, :, None], mx.arange(32, dtype=mx.uint32)) & 1
    allowed = bits.reshape(len(rows), -1)[:, :vocab].astype(mx.bool_)
    idx = mx.array(rows, dtype=mx.int32)
    logits[idx] = mx.where(allowed, logits[idx], NEG_INF)
    return logits
