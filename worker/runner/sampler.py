"""Turn a batch of logits into next tokens, each row with its own sampling parameters.

Order per row: logit bias and penalties, the grammar's mask, min_tokens' stop mask
(`worker.runner.logits_processors`),
then greedy or random sampling. Greedy rows are one batched argmax. Random rows are sampled
one by one with the request's own key (split each step), so a seeded request gives the same
tokens whatever else shares its batch. Log-probabilities are those of the processed logits
before temperature and truncation (the distribution the request's processors leave), for the
rows that asked only: one logsumexp and one top-k over those rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import mlx.core as mx

from shared.protocol import TopLogprobs
from worker.runner.logits_processors import (
    LogitsState,
    PenaltyBatch,
    apply_grammar_masks,
    mask_early_stops,
)

if TYPE_CHECKING:
    from shared.sampling import SamplingParams


class TokenLogprob(NamedTuple):
    """Host values for one sampled token."""

    logprob: float
    top: tuple[tuple[int, float], ...]  # most likely first; empty unless top_logprobs > 0


class TokenLogprobs(NamedTuple):
    """Device log-probabilities of the rows that asked for them."""

    batch: int  # rows in the batch
    rows: list[int]  # the rows that asked, host ints
    top_counts: list[int]  # each row's top_logprobs
    chosen: mx.array  # (R,) float32
    top_ids: mx.array | None  # (R, K) int32, K = max(top_counts), most likely first
    top_values: mx.array | None  # (R, K) float32

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.chosen, self.top_ids, self.top_values) if a is not None]

    def tolist(self) -> list[TokenLogprob | None]:
        """Per batch row (reads the device): its TokenLogprob, or None if it did not ask."""
        out: list[TokenLogprob | None] = [None] * self.batch
        chosen = self.chosen.tolist()
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        values = self.top_values.tolist() if self.top_values is not None else None
        for j, row in enumerate(self.rows):
            top: tuple[tuple[int, float], ...] = ()
            if ids is not None and self.top_counts[j]:
                n = self.top_counts[j]
                pairs = zip(ids[j][:n], values[j][:n], strict=True)
                top = tuple((t, v) for t, v in pairs if v != -float("inf"))  # masked tokens
            out[row] = TokenLogprob(chosen[j], top)
        return out


class Sampled(NamedTuple):
    tokens: mx.array  # (B,) int32
    logprobs: TokenLogprobs | None
    state_arrays: list[mx.array]  # processors' device state, advanced by this step

    def arrays(self) -> list[mx.array]:
        """Everything the step must evaluate."""
        logprobs = self.logprobs.arrays() if self.logprobs is not None else []
        return [self.tokens, *logprobs, *self.state_arrays]


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
    logits: mx.array,
    params: list[SamplingParams],
    keys: list[mx.array | None],
    states: list[LogitsState | None] | None = None,
) -> tuple[Sampled, list[mx.array | None]]:
    """Next token per row of `logits` (B, V); returns the samples and the advanced keys.

    `states`: each row's logit processors (None for a row without); mutated: penalty state
    advanced by the sampled token. Rows with a grammar need their matcher current (host).
    """
    penalties = None
    if states is not None and any(s is not None for s in states):
        penalties = PenaltyBatch(states)
        logits = penalties.apply(logits.astype(mx.float32))
        logits = apply_grammar_masks(logits, states)
        logits = mask_early_stops(logits, states)
    chosen, new_keys = _choose(logits, params, keys)
    logprobs = _logprobs(logits, chosen, params)
    state_arrays = penalties.record(chosen) if penalties is not None else []
    return Sampled(chosen, logprobs, state_arrays), new_keys


def _choose(
    logits: mx.array, params: list[SamplingParams], keys: list[mx.array | None]
) -> tuple[mx.array, list[mx.array | None]]:
    greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    new_keys = list(keys)
    if not rows:
        return greedy, new_keys
    tokens = [greedy[i] for i in range(len(params))]
    for i in rows:
        key, sub = mx.random.split(keys[i])
        new_keys[i] = key
        tokens[i] = mx.random.categorical(_filtered_logits(logits[i], params[i]), key=sub).astype(
            mx.int32
        )
    return mx.stack(tokens), new_keys


def _logprobs(
    logits: mx.array, chosen: mx.array, params: list[SamplingParams]
) -> TokenLogprobs | None:
    rows = [i for i, p in enumerate(params) if p.logprobs]
    if not rows:
        return None
    top_counts = [params[i].top_logprobs for i in rows]
    if len(rows) == len(params):
        sub, sub_chosen = logits.astype(mx.float32), chosen
    else:
        idx = mx.array(rows, dtype=mx.int32)
        sub, sub_chosen = logits[idx].astype(mx.float32), chosen[idx]
    logp = sub - mx.logsumexp(sub, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logp, sub_chosen[:, None], axis=-1)[:, 0]
    k = max(top_counts)
    if k == 0:
        return TokenLogprobs(len(params), rows, top_counts, picked, None, None)
    k = min(k, logp.shape[-1])
    candidates = mx.argpartition(-logp, kth=k - 1, axis=-1)[:, :k]
    values = mx.take_along_axis(logp, candidates, axis=-1)
    order = mx.argsort(-values, axis=-1)
    top_ids = mx.take_along_axis(candidates, order, axis=-1).astype(mx.int32)
    top_values = mx.take_along_axis(values, order, axis=-1)
    return TokenLogprobs(len(params), rows, top_counts, picked, top_ids, top_values)


class PromptLogprobs(NamedTuple):
    """Device log-probabilities of prompt tokens (for the requests that asked): point i
    scores token `positions[i]` of `requests[i]` from the logits of the position before it."""

    requests: list  # list[RequestKey]
    positions: list[int]
    top_counts: list[int]  # each point's sampling.prompt_logprobs
    chosen: mx.array  # (N,) float32
    ranks: mx.array  # (N,) int32, 1 = the most likely token
    top_ids: mx.array | None  # (N, K) most likely first
    top_values: mx.array | None

    def arrays(self) -> list[mx.array]:
        return [
            a for a in (self.chosen, self.ranks, self.top_ids, self.top_values) if a is not None
        ]

    def tolist(self) -> list[tuple]:
        """(request, position, logprob, rank, top pairs) per point (reads the device)."""
        chosen, ranks = self.chosen.tolist(), self.ranks.tolist()
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        values = self.top_values.tolist() if self.top_values is not None else None
        out = []
        for i, (request, pos, k) in enumerate(
            zip(self.requests, self.positions, self.top_counts, strict=True)
        ):
            top = tuple(zip(ids[i][:k], values[i][:k], strict=True)) if k and ids else ()
            out.append((request, pos, chosen[i], ranks[i], top))
        return out


def prompt_logprobs(
    logits: mx.array, targets: list[int], requests: list, positions: list[int], counts: list[int]
) -> PromptLogprobs:
    """Log-probabilities of `targets` under the raw `logits` (N, V) (no processors: the
    prompt was not sampled), their ranks and each point's top `counts` alternatives."""
    logits = logits.astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logp, mx.array(targets, dtype=mx.int32)[:, None], axis=-1)
    ranks = (mx.sum(logp > picked, axis=-1) + 1).astype(mx.int32)
    k = min(max(counts), logp.shape[-1])
    top_ids = top_values = None
    if k:
        candidates = mx.argpartition(-logp, kth=k - 1, axis=-1)[:, :k]
        values = mx.take_along_axis(logp, candidates, axis=-1)
        order = mx.argsort(-values, axis=-1)
        top_ids = mx.take_along_axis(candidates, order, axis=-1).astype(mx.int32)
        top_values = mx.take_along_axis(values, order, axis=-1)
    return PromptLogprobs(requests, positions, counts, picked[:, 0], ranks, top_ids, top_values)


def delta_logprob_fields(params: SamplingParams, entries: list[TokenLogprob | None]) -> dict:
    """TokenDelta's `logprobs` / `top_logprobs` fields for a delta's sampled tokens."""
    if not params.logprobs or not entries or any(e is None for e in entries):
        return {}
    fields: dict = {"logprobs": tuple(e.logprob for e in entries)}
    if params.top_logprobs:
        fields["top_logprobs"] = tuple(
            TopLogprobs(tuple(t for t, _ in e.top), tuple(v for _, v in e.top)) for e in entries
        )
    return fields


def prompt_logprob_fields(params: SamplingParams, entries: list[tuple]) -> dict:
    """TokenDelta's `prompt_*` fields from a sequence's (logprob, rank, top) entries."""
    fields: dict = {
        "prompt_logprobs": tuple(lp for lp, _, _ in entries),
        "prompt_ranks": tuple(rank for _, rank, _ in entries),
    }
    if params.prompt_logprobs:
        fields["prompt_top_logprobs"] = tuple(
            TopLogprobs(tuple(t for t, _ in top), tuple(v for _, v in top)) for _, _, top in entries
        )
    return fields
