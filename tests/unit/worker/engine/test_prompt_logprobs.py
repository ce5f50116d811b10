"""Prompt logprobs (SamplingParams.prompt_logprobs) equal mlx-lm's own forward pass.

The reference is the model called as mlx-lm calls it, on the whole prompt at once, with no
cache: log_softmax of its logits at position i scores prompt token i + 1. The engine's must
match to 1e-4 however the prompt was computed: in one chunk or several, folded into a decode
step (MIXED one-token rows), or with the same prompt already in the prefix cache (a request
that scores its prompt computes all of it: cached_tokens is 0).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from shared.protocol import TokenDelta
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import VOCAB, make_engine, tiny_model
from worker.runner.plan import StepKind

PROMPT = [(i * 37 + 11) % VOCAB for i in range(45)]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def reference_logprobs(model, tokens: list[int]) -> np.ndarray:
    """(len - 1, V): log-probabilities of the next token at each prompt position, mlx-lm's."""
    logits = model(mx.array(tokens)[None])[0].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return np.array(logp[:-1])


def run(engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list]:
    """Add the requests in order, one step apart; every delta of each, until idle."""
    deltas: dict[str, list[TokenDelta]] = {}
    for rid, (tokens, params) in requests.items():
        engine.add_request(rid, tokens, params)
        for d in engine.step():
            deltas.setdefault(d.request_id, []).append(d)
    while engine.has_work():
        for d in engine.step():
            assert d.error is None, d.error
            deltas.setdefault(d.request_id, []).append(d)
    return deltas


def check_against_reference(model, deltas: list[TokenDelta], tokens: list[int], k: int) -> None:
    first = deltas[0]
    ref = reference_logprobs(model, tokens)
    expected = ref[np.arange(len(tokens) - 1), tokens[1:]]
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(tokens) - 1
    np.testing.assert_allclose(first.prompt_logprobs, expected, atol=1e-4)
    ranks = [int((row > row[t] + 1e-6).sum()) + 1 for row, t in zip(ref, tokens[1:], strict=True)]
    assert list(first.prompt_ranks) == ranks
    if k:
        for row, top in zip(ref, first.prompt_top_logprobs, strict=True):
            np.testing.assert_allclose(top.logprobs, np.sort(row)[::-1][:k], atol=1e-4)
            np.testing.assert_allclose(row[list(top.token_ids)], top.logprobs, atol=1e-4)
    else:
        assert first.prompt_top_logprobs is None
    assert all(d.prompt_logprobs is None for d in deltas[1:])  # sent once


@pytest.mark.parametrize("chunk", [64, 8], ids=["one-chunk", "chunked"])
@pytest.mark.parametrize("k", [0, 3])
def test_prompt_logprobs_match_mlx_lm(model, chunk, k):
    engine = make_engine(model, prefill_chunk=chunk, step_token_budget=max(chunk, 16))
    deltas = run(engine, {"a": (PROMPT, SamplingParams(max_tokens=3, prompt_logprobs=k))})
    check_against_reference(model, deltas["a"], PROMPT, k)
    assert sum(len(d.token_ids) for d in deltas["a"]) == 3


@pytest.mark.parametrize("chunk", [64, 8], ids=["one-chunk", "chunked"])
def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(model, chunk):
    engine = make_engine(model, prefill_chunk=chunk, step_token_budget=max(chunk, 16))
    run(engine, {"warm": (PROMPT, SamplingParams(max_tokens=2))})
    warm_again = run(engine, {"again": (PROMPT, SamplingParams(max_tokens=1))})["again"]
    assert warm_again[-1].usage.cached_tokens > 0  # the prefix is there to be hit
    deltas = run(engine, {"a": (PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=2))})["a"]
    assert deltas[-1].usage.cached_tokens == 0
    check_against_reference(model, deltas, PROMPT, 2)


def test_prompt_logprobs_folded_into_a_decode_step(model):
    """A short prompt admitted while another request decodes runs as one-token rows (MIXED)."""
    engine = make_engine(model)
    kinds, original = [], engine.runner.run

    def run_step(plan, *args):
        kinds.extend(plan.kind for r in plan.prefill if r.key.request_id == "a")
        return original(plan, *args)

    engine.runner.run = run_step
    short = PROMPT[:12]
    deltas = run(
        engine,
        {
            "busy": (PROMPT[5:30], SamplingParams(max_tokens=20)),
            "a": (short, SamplingParams(max_tokens=2, prompt_logprobs=1)),
        },
    )
    assert kinds == [StepKind.MIXED]
    check_against_reference(model, deltas["a"], short, 1)


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(model):
    engine = make_engine(model, prefill_chunk=16, step_token_budget=16)
    deltas = run(engine, {"a": (PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=0))})["a"]
    assert len(deltas) == 1
    (delta,) = deltas
    assert delta.token_ids == () and delta.finish_reason == "length"
    assert delta.usage.completion_tokens == 0 and delta.usage.prompt_tokens == len(PROMPT)
    check_against_reference(model, deltas, PROMPT, 0)
    assert engine.pool.num_free + engine.cache.evictable_blocks == engine.kv_capacity_blocks


def test_n_choices_each_carry_the_prompt_logprobs(model):
    engine = make_engine(model)
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=2, prompt_logprobs=0), n=2)
    firsts: dict[int, TokenDelta] = {}
    while engine.has_work():
        for d in engine.step():
            firsts.setdefault(d.index, d)
    assert set(firsts) == {0, 1}
    for d in firsts.values():
        check_against_reference(model, [d], PROMPT, 0)


def test_requests_without_prompt_logprobs_carry_none(model):
    engine = make_engine(model)
    deltas = run(engine, {"a": (PROMPT, SamplingParams(max_tokens=2))})["a"]
    assert all(d.prompt_logprobs is None and d.prompt_ranks is None for d in deltas)
