"""The sampler's logit processing and log-probabilities against numpy references."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from shared.sampling import InvalidRequest, LogitBias, SamplingParams
from worker.runner.logits_processors import LogitsState
from worker.runner.sampler import sample

V = 50


def _logits(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size=(batch, V)).astype(np.float32)


def _reference(row: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int]):
    """Bias and penalties as documented: HF repetition over prompt + output (distinct
    tokens), OpenAI presence/frequency over the output."""
    row = row.copy()
    if p.repetition_penalty != 1.0:
        for t in set(prompt + output):
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    counts = np.bincount(output, minlength=V)
    row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    for b in p.logit_bias:
        row[b.token_id] += b.bias
    return row


def _state(p: SamplingParams, prompt: list[int]) -> LogitsState | None:
    return LogitsState.create(p, prompt, V, None)


def _processed(logits: np.ndarray, params, states) -> np.ndarray:
    """The logits the sampler sampled from, recovered through full logprobs."""
    from worker.runner.logits_processors import PenaltyBatch

    return np.array(PenaltyBatch(states).apply(mx.array(logits)))


PARAMS = [
    SamplingParams(),  # untouched
    SamplingParams(logit_bias=(LogitBias(3, 5.0), LogitBias(7, -100.0))),
    SamplingParams(presence_penalty=1.5, frequency_penalty=0.5),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(
        repetition_penalty=0.8,
        presence_penalty=-1.0,
        frequency_penalty=2.0,
        logit_bias=(LogitBias(11, 2.5),),
    ),
]


def test_bias_and_penalties_match_numpy_rows_independent():
    logits = _logits(len(PARAMS))
    prompt = [1, 2, 3, 3, 40]
    params = PARAMS
    states = [_state(p, prompt) for p in params]
    got = _processed(logits, params, states)
    for i, p in enumerate(params):
        np.testing.assert_allclose(got[i], _reference(logits[i], p, prompt, []), rtol=1e-6)
    np.testing.assert_array_equal(got[0], logits[0])  # a row without processors is untouched


def test_penalty_state_advances_with_sampled_tokens():
    """Counts follow the tokens the sampler chose, on the device, step after step."""
    p = SamplingParams(presence_penalty=0.7, frequency_penalty=0.9, repetition_penalty=1.2)
    prompt = [5, 6]
    state = _state(p, prompt)
    output: list[int] = []
    for step in range(6):
        logits = _logits(1, seed=step)
        expected = _reference(logits[0], p, prompt, output)
        sampled, _ = sample(mx.array(logits), [p], [None], [state])
        mx.eval(sampled.arrays())
        token = sampled.tokens.item()
        assert token == int(np.argmax(expected))
        output.append(token)
    counts = np.array(state.counts.value())
    assert counts.sum() == 6 and all(counts[t] == output.count(t) for t in set(output))


def test_prior_output_tokens_count_as_output():
    p = SamplingParams(frequency_penalty=1.0, prior_output_tokens=3)
    state = _state(p, [9, 9, 4, 4, 4])  # the last three are earlier output
    logits = _logits(1)
    got = _processed(logits, [p], [state])[0]
    np.testing.assert_allclose(got, _reference(logits[0], p, [9, 9], [4, 4, 4]), rtol=1e-6)


def test_logit_bias_forces_a_token_in_a_sampled_batch():
    p = SamplingParams(temperature=1.0, logit_bias=(LogitBias(17, 100.0),))
    q = SamplingParams(temperature=1.0)
    keys = [mx.random.key(1), mx.random.key(2)]
    sampled, _ = sample(mx.array(_logits(2)), [p, q], keys, [_state(p, [0]), None])
    assert sampled.tokens.tolist()[0] == 17


def test_top_logprobs_match_numpy_and_only_rows_that_asked():
    logits = _logits(4, seed=3)
    params = [
        SamplingParams(logprobs=True, top_logprobs=5),
        SamplingParams(),
        SamplingParams(logprobs=True),
        SamplingParams(logprobs=True, top_logprobs=20, temperature=0.7, seed=1),
    ]
    keys = [None, None, None, mx.random.key(4)]
    sampled, _ = sample(mx.array(logits), params, keys)
    mx.eval(sampled.arrays())
    tokens = sampled.tokens.tolist()
    rows = sampled.logprobs.tolist()
    assert rows[1] is None
    for i in (0, 2, 3):
        ref = logits[i] - np.log(np.exp(logits[i] - logits[i].max()).sum()) - logits[i].max()
        assert rows[i].logprob == pytest.approx(ref[tokens[i]], abs=1e-5)
        assert rows[i].logprob <= 0
        k = params[i].top_logprobs
        assert len(rows[i].top) == k
        ref_top = np.argsort(-ref)[:k]
        assert [t for t, _ in rows[i].top] == ref_top.tolist()
        values = [v for _, v in rows[i].top]
        assert values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, ref[ref_top], atol=1e-5)


def test_sampled_rows_do_not_depend_on_their_neighbours():
    """A seeded row with processors gives the same token alone and in a batch."""
    p = SamplingParams(temperature=1.0, frequency_penalty=1.0, logit_bias=(LogitBias(2, 3.0),))
    logits = _logits(3, seed=7)
    alone, _ = sample(mx.array(logits[1:2]), [p], [mx.random.key(9)], [_state(p, [2, 2])])
    together, _ = sample(
        mx.array(logits),
        [SamplingParams(), p, SamplingParams(temperature=0.5)],
        [None, mx.random.key(9), mx.random.key(3)],
        [None, _state(p, [2, 2]), None],
    )
    assert alone.tokens.tolist()[0] == together.tokens.tolist()[1]


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(top_logprobs=21), "top_logprobs"),
        (SamplingParams(presence_penalty=2.5), "presence_penalty"),
        (SamplingParams(frequency_penalty=-3), "frequency_penalty"),
        (SamplingParams(repetition_penalty=0), "repetition_penalty"),
        (SamplingParams(logit_bias=(LogitBias(1, 101.0),)), "logit_bias"),
        (SamplingParams(logit_bias=(LogitBias(V, 1.0),)), "outside the vocabulary"),
    ],
)
def test_validation_names_the_bad_field(params, message):
    with pytest.raises(InvalidRequest, match=message):
        params.validate(V)
