"""Turn a batch of logits into next tokens, each row with its own sampling parameters.

Greedy rows are one batched argmax. Random rows are sampled one by one with the request's
own key (split each step), so a seeded request gives the same tokens whatever else shares
its batch.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from shared.sampling import SamplingParams


class Sampled(NamedTuple):
    tokens: mx.array  # (B,) int32
    logprobs: mx.array | None  # (B,) float32, log-prob of each chosen token


def _filtered_logits(logits: mx.array, p: SamplingParams) -> mx.array:
    """Temperature, then top-k, top-p and min-p filters, on one row (V,)."""
    logits = logits.astype(mx.float32) / p.temperature
    neg_inf = mx.array(-float("inf"), dtype=mx.float32)
    if 0 < p.top_k < logits.shape[-1]:
        kth = mx.sort(logits)[-p.top_k]
        logits = mx.where(logits < kth, neg_inf, logits)
    if p.min_p > 0:
        probs = mx.softmax(logits)
        logits = mx.where(probs < p.min_p * probs.max(), neg_inf, logits)
    if p.top_p < 1.0:
        order = mx.argsort(-logits)
        sorted_probs = mx.softmax(logits[order])
        # keep the smallest head of the distribution whose mass reaches top_p
        before = mx.cumsum(sorted_probs) - sorted_probs
        keep_sorted = before < p.top_p
        keep = mx.zeros(logits.shape, dtype=mx.bool_)
        keep[order] = keep_sorted
        logits = mx.where(keep, logits, neg_inf)
    return logits


def sample(
    logits: mx.array, params: list[SamplingParams], keys: list[mx.array | None]
) -> tuple[Sampled, list[mx.array | None]]:
    """Next token per row of `logits` (B, V); returns the samples and the advanced keys."""
    greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    new_keys = list(keys)
    if rows:
        tokens = [greedy[i] for i in range(len(params))]
        for i in rows:
            key, sub = mx.random.split(keys[i])
            new_keys[i] = key
            tokens[i] = mx.random.categorical(
                _filtered_logits(logits[i], params[i]), key=sub
            ).astype(mx.int32)
        chosen = mx.stack(tokens)
    else:
        chosen = greedy
    logprobs = None
    if any(p.logprobs for p in params):
        logp = logits.astype(mx.float32) - mx.logsumexp(
            logits.astype(mx.float32), axis=-1, keepdims=True
        )
        logprobs = mx.take_along_axis(logp, chosen[:, None], axis=-1)[:, 0]
    return Sampled(chosen, logprobs), new_keys
