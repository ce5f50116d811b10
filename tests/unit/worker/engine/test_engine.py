"""The engine's greedy output equals mlx-lm's, alone, batched, with and without cache hits."""

from __future__ import annotations

import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    ARCHS,
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from tests.support.engine_fixtures import random_prompt as prompt

GREEDY = SamplingParams(max_tokens=12)


@pytest.fixture(scope="module", params=list(ARCHS))
def model(request):
    return tiny_model(request.param)


def test_single_request_matches_mlx_lm(model):
    engine = make_engine(model)
    p = prompt(21, 1)
    engine.add_request("a", p, GREEDY)
    assert run_to_completion(engine)["a"] == reference_greedy(model, p, 12)
    engine.check_integrity()


def test_batch_joining_at_different_steps_matches(model):
    engine = make_engine(model)
    prompts = {f"r{i}": prompt(n, i) for i, n in enumerate([3, 8, 9, 17, 30, 41, 64, 5])}
    joins = {"r0": 0, "r1": 0, "r2": 1, "r3": 2, "r4": 2, "r5": 4, "r6": 5, "r7": 9}
    outputs: dict[str, list[int]] = {}
    step = 0
    while step < 2000 and (engine.has_work() or any(j >= step for j in joins.values())):
        for rid, j in joins.items():
            if j == step:
                engine.add_request(rid, prompts[rid], GREEDY)
        for d in engine.step():
            outputs.setdefault(d.request_id, []).extend(d.token_ids)
        step += 1
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 12), rid
    engine.check_integrity()


@pytest.mark.parametrize("shared_len", [16, 20, 24], ids=["block-aligned", "mid-block", "3-blocks"])
def test_prefix_cache_hits_give_identical_output(model, shared_len):
    engine = make_engine(model)
    base = prompt(shared_len, 7)
    first, second = base + prompt(5, 8), base + prompt(9, 9)
    engine.add_request("first", first, GREEDY)
    run_to_completion(engine)
    engine.add_request("second", second, GREEDY)
    engine.add_request("again", first, GREEDY)  # full hit of a finished sequence
    outputs, usage = {}, {}
    while engine.has_work():
        for d in engine.step():
            outputs.setdefault(d.request_id, []).extend(d.token_ids)
            if d.usage:
                usage[d.request_id] = d.usage
    assert outputs["second"] == reference_greedy(model, second, 12)
    assert outputs["again"] == reference_greedy(model, first, 12)
    # full blocks shared, then the rest of the shared run copied from a partial block (CoW)
    assert usage["second"].cached_tokens == shared_len
    assert usage["again"].cached_tokens == len(first) - 1
    assert engine.stats()["partial_hit_tokens"] == shared_len % 8 + (len(first) - 1) % 8
    engine.check_integrity()


def test_chunked_prefill_matches_whole_prefill(model):
    p = prompt(150, 3)
    whole = make_engine(model, prefill_chunk=256, step_token_budget=256)
    chunked = make_engine(model, prefill_chunk=16, step_token_budget=64)
    for e in (whole, chunked):
        e.add_request("x", p, GREEDY)
    expected = reference_greedy(model, p, 12)
    assert run_to_completion(whole)["x"] == expected
    assert run_to_completion(chunked)["x"] == expected


def test_preemption_under_a_small_kv_budget(model):
    engine = make_engine(model, num_blocks=14, max_running=8)  # 13 usable blocks of 8 tokens
    prompts = {f"p{i}": prompt(20 + 3 * i, 100 + i) for i in range(6)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(max_tokens=20))
    outputs = run_to_completion(engine)
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 20), rid
    assert engine.stats()["preemptions"] > 0
    engine.check_integrity()
