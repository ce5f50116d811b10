"""Speculative decoding (prompt-lookup drafts verified in the batch): output identical to
plain greedy decoding, limits honoured, drafting backs off where it does not pay."""

from __future__ import annotations

import random

import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    ARCHS,
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from worker.engine.speculative import COOLDOWN_STEPS, DraftState, NgramIndex, accepted_prefix


def test_ngram_index_proposes_what_followed_the_last_occurrence():
    index = NgramIndex(2)
    tokens = [1, 2, 3, 4, 1, 2]
    index.update(tokens)
    assert index.lookup(tokens, 3) == [3, 4, 1]
    tokens += [9]
    index.update(tokens)
    assert index.lookup(tokens, 3) == []  # (2, 9) never appeared before


def test_accepted_prefix():
    assert accepted_prefix([5, 6, 7], [5, 6, 8, 1]) == 2
    assert accepted_prefix([5, 6, 7], [4, 6, 7, 1]) == 0
    assert accepted_prefix([5, 6, 7], [5, 6, 7, 1]) == 3


def test_low_acceptance_cools_down_then_retries():
    state = DraftState()
    tokens = [1, 2, 3, 1, 2]
    assert state.propose(tokens, 2) == [3, 1]
    for _ in range(6):
        state.record(4, 0)
    assert state.cooldown == COOLDOWN_STEPS and state.propose(tokens, 2) == []
    for _ in range(COOLDOWN_STEPS):
        state.tick()
    assert state.propose(tokens, 2) == [3, 1]


def repetitive(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    motif = [rng.randrange(97) for _ in range(5)]
    return (motif * (length // 5 + 1))[:length]


@pytest.fixture(scope="module", params=list(ARCHS))
def model(request):
    return tiny_model(request.param)


def test_greedy_output_is_identical_with_drafts(model):
    engine = make_engine(model, speculative="ngram", spec_tokens=4)
    prompts = {f"r{i}": repetitive(i, 12 + 7 * i) for i in range(4)}
    prompts["plain"] = [random.Random(9).randrange(97) for _ in range(30)]
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=20))
    outputs = run_to_completion(engine)
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 20), rid
    stats = engine.stats()
    assert stats["spec_drafted"] > 0  # the verify path ran
    assert stats["spec_accepted"] > 0  # and kept drafts: several tokens in one step
    engine.check_integrity()


def test_stop_tokens_and_max_tokens_inside_accepted_drafts():
    model = tiny_model("llama")
    prompt = repetitive(3, 40)
    plain = make_engine(model)
    plain.add_request("x", prompt, SamplingParams(max_tokens=40))
    expected = run_to_completion(plain)["x"]
    stop = expected[7]  # a token the greedy output reaches
    for params in (
        SamplingParams(max_tokens=40, stop_token_ids=(stop,)),
        SamplingParams(max_tokens=9),
    ):
        ref, spec = make_engine(model), make_engine(model, speculative="ngram")
        for engine in (ref, spec):
            engine.add_request("x", prompt, params)
        assert run_to_completion(spec)["x"] == run_to_completion(ref)["x"]
        spec.check_integrity()


def test_sampled_requests_do_not_draft():
    engine = make_engine(tiny_model("qwen2"), speculative="ngram")
    engine.add_request(
        "s", repetitive(1, 30), SamplingParams(max_tokens=12, temperature=0.9, seed=1)
    )
    run_to_completion(engine)
    assert engine.stats()["spec_drafted"] == 0
