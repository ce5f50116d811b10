"""Sampling, stopping, bad requests, aborts and prefix sharing in the engine."""

from __future__ import annotations

import pytest

from shared.sampling import InvalidRequest, SamplingParams
from tests.support.engine_fixtures import (
    VOCAB,
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from tests.unit.worker.engine.test_engine import prompt


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


def collect(engine):
    outputs, finals = {}, {}
    while engine.has_work():
        for d in engine.step():
            outputs.setdefault(d.request_id, []).extend(d.token_ids)
            if d.finish_reason:
                finals[d.request_id] = d
    return outputs, finals


def test_seeded_sampling_is_reproducible_whatever_the_batch(model):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone = make_engine(model)
    alone.add_request("s", prompt(10, 1), params)
    crowd = make_engine(model)
    for i in range(5):
        crowd.add_request(
            f"o{i}", prompt(7 + i, 50 + i), SamplingParams(temperature=0.8, max_tokens=16)
        )
    crowd.add_request("s", prompt(10, 1), params)
    assert run_to_completion(alone)["s"] == run_to_completion(crowd)["s"]


def test_sampling_differs_from_greedy_and_top_k_1_is_greedy(model):
    p = prompt(10, 2)
    engine = make_engine(model)
    engine.add_request("hot", p, SamplingParams(temperature=5.0, seed=1, max_tokens=24))
    engine.add_request("k1", p, SamplingParams(temperature=1.0, top_k=1, seed=2, max_tokens=24))
    engine.add_request(
        "minp", p, SamplingParams(temperature=1.0, min_p=0.999, seed=3, max_tokens=24)
    )
    out = run_to_completion(engine)
    greedy = reference_greedy(model, p, 24)
    assert out["k1"] == greedy
    assert out["minp"] == greedy  # only the top token survives min_p close to 1
    assert out["hot"] != greedy


def test_stop_token_ends_the_request_without_emitting_it(model):
    p = prompt(12, 4)
    greedy = reference_greedy(model, p, 12)
    stop = greedy[5]
    engine = make_engine(model)
    engine.add_request("a", p, SamplingParams(max_tokens=12, stop_token_ids=(stop,)))
    outputs, finals = collect(engine)
    first = greedy.index(stop)
    assert outputs["a"] == greedy[:first]
    assert finals["a"].finish_reason == "stop"
    assert finals["a"].usage.completion_tokens == first + 1


def test_max_tokens_gives_length_and_usage(model):
    engine = make_engine(model)
    engine.add_request("a", prompt(9, 5), SamplingParams(max_tokens=4, logprobs=True))
    outputs, finals = collect(engine)
    assert len(outputs["a"]) == 4
    f = finals["a"]
    assert (f.finish_reason, f.usage.prompt_tokens, f.usage.completion_tokens) == ("length", 9, 4)
    assert f.logprobs is not None and all(lp <= 0 for lp in f.logprobs)


def test_context_limit_ends_with_length(model):
    engine = make_engine(model)
    p = prompt(508, 6)  # context is 512
    engine.add_request("a", p, SamplingParams(max_tokens=100))
    outputs, finals = collect(engine)
    assert len(outputs["a"]) == 4 and finals["a"].finish_reason == "length"


@pytest.mark.parametrize(
    ("tokens", "params", "message"),
    [
        ([], SamplingParams(), "empty"),
        ([1] * 512, SamplingParams(), "context"),
        ([1, 2, VOCAB], SamplingParams(), "token ids"),
        ([1, -1], SamplingParams(), "token ids"),
        ([1, 2], SamplingParams(max_tokens=-1), "max_tokens"),
        ([1, 2], SamplingParams(prompt_logprobs=21), "prompt_logprobs"),
        ([1, 2], SamplingParams(temperature=-1), "temperature"),
        ([1, 2], SamplingParams(top_p=0), "top_p"),
    ],
)
def test_bad_requests_are_refused_without_disturbing_others(model, tokens, params, message):
    engine = make_engine(model)
    good = prompt(10, 9)
    engine.add_request("good", good, SamplingParams(max_tokens=6))
    first = [t for d in engine.step() for t in d.token_ids]
    with pytest.raises(InvalidRequest, match=message):
        engine.add_request("bad", tokens, params)
    assert first + run_to_completion(engine)["good"] == reference_greedy(model, good, 6)
    engine.check_integrity()


def test_duplicate_request_id_is_refused(model):
    engine = make_engine(model)
    engine.add_request("a", [1, 2, 3], SamplingParams())
    with pytest.raises(InvalidRequest, match="already"):
        engine.add_request("a", [1, 2, 3], SamplingParams())


def test_prompt_larger_than_the_kv_pool_is_refused(model):
    engine = make_engine(model, num_blocks=4)
    with pytest.raises(InvalidRequest, match="KV memory"):
        engine.add_request("big", prompt(40, 1), SamplingParams())


def test_abort_frees_everything(model):
    engine = make_engine(model, prefill_chunk=16, step_token_budget=64)
    engine.add_request("long", prompt(200, 1), SamplingParams(max_tokens=50))
    engine.add_request("queued", prompt(30, 2), SamplingParams(max_tokens=50))
    engine.step()
    assert engine.abort("long") and engine.abort("queued")
    assert not engine.abort("long")
    assert not engine.has_work()
    stats = engine.stats()
    assert stats["held_blocks"] == 1  # only the scratch block
    engine.check_integrity()


def test_same_uncached_prefix_is_computed_once(model):
    shared = prompt(64, 11)
    engine = make_engine(model, prefill_chunk=16, step_token_budget=64)
    a, b = shared + [1, 2, 3], shared + [4, 5, 6]
    engine.add_request("a", a, SamplingParams(max_tokens=4))
    engine.add_request("b", b, SamplingParams(max_tokens=4))
    outputs, finals = collect(engine)
    assert finals["b"].usage.cached_tokens == 64
    assert engine.stats()["prefill_tokens"] == len(a) + (len(b) - 64)
    assert outputs["a"] == reference_greedy(model, a, 4)
    assert outputs["b"] == reference_greedy(model, b, 4)


def test_kv_events_replay_to_the_cached_blocks(model):
    engine = make_engine(model)
    for i in range(4):
        engine.add_request(f"r{i}", prompt(20 + 9 * i, i), SamplingParams(max_tokens=5))
    run_to_completion(engine)
    stored = {}
    for event in engine.drain_kv_events():
        if hasattr(event, "block_hash"):
            stored[event.block_hash] = event
        elif hasattr(event, "block_hashes"):
            for h in event.block_hashes:
                stored.pop(h)
    assert len(stored) == engine.cache.cached_blocks
    assert engine.drain_kv_events() == []


# ---- n > 1: choices forked after one prefill ------------------------------------------------


def _choices(engine, request_id: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    finished = set()
    while engine.has_work():
        for d in engine.step():
            assert d.request_id == request_id and d.error is None, d
            out.setdefault(d.index, []).extend(d.token_ids)
            if d.finish_reason:
                assert d.index not in finished
                finished.add(d.index)
    assert finished == set(out)
    return out


@pytest.mark.parametrize(
    "prompt_len", [17, 16, 6], ids=["aligned-tail", "copied-tail", "copied-first-block"]
)
def test_n_greedy_choices_fork_after_one_prefill(prompt_len):
    model = tiny_model("llama")
    engine = make_engine(model)
    prompt = [(3 * i + 1) % 97 for i in range(prompt_len)]
    engine.add_request("r", prompt, SamplingParams(max_tokens=6), n=3)
    choices = _choices(engine, "r")
    expected = reference_greedy(model, prompt, 6)
    assert choices == {0: expected, 1: expected, 2: expected}
    # one prefill: the prompt's tokens before the last were computed once, not three times
    assert engine.stats()["prefill_tokens"] <= prompt_len - 1 + 3
    engine.check_integrity()
    assert engine.pool.usage().held == 1  # only the scratch block


def test_n_sampled_choices_have_their_own_seed_streams():
    model = tiny_model("qwen2")
    sampling = SamplingParams(max_tokens=8, temperature=1.5, seed=11)
    prompt = list(range(20))
    engine = make_engine(model)
    engine.add_request("r", prompt, sampling, n=3)
    together = _choices(engine, "r")
    assert len({tuple(v) for v in together.values()}) > 1  # not three copies of one sample
    # choice i equals a lone request seeded with seed + i
    for i in range(3):
        alone = make_engine(model)
        alone.add_request("a", prompt, SamplingParams(max_tokens=8, temperature=1.5, seed=11 + i))
        assert run_to_completion(alone)["a"] == together[i]


def test_n_with_a_fully_cached_prompt_and_abort():
    model = tiny_model("llama")
    engine = make_engine(model)
    prompt = list(range(25))  # 24 cached (3 blocks of 8) + the last token
    engine.add_request("warm", prompt, SamplingParams(max_tokens=1))
    run_to_completion(engine)
    engine.add_request("r", prompt, SamplingParams(max_tokens=50), n=4)
    for _ in range(3):
        engine.step()
    assert len(engine.scheduler.sequences_of("r")) == 4
    assert engine.abort("r")
    assert not engine.scheduler.sequences_of("r") and not engine.abort("r")
    while engine.has_work():
        engine.step()
    engine.check_integrity()


def test_n_out_of_range_is_refused():
    engine = make_engine(tiny_model("llama"), max_running=8)
    with pytest.raises(InvalidRequest, match=r"n must be an integer in \[1, 8\]"):
        engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2), n=9)


def test_a_finished_reply_s_blocks_serve_the_next_turn(model):
    """The next turn of a conversation (prompt + reply + stop token + more) finds every full
    block of the last turn's prompt and reply cached. With a decode step in flight, the
    prompt's last partial block used to be inserted before its generated tokens were known
    (a block short), and was never inserted whole: the next turn missed it."""
    first = prompt(30, 4)  # block size 8: 3 full blocks and 6 tokens of a fourth
    greedy = reference_greedy(model, first, 24)
    # the reply ends at the first token (from the 3rd on) not seen before in it: the stop token
    reply_tokens = next(k for k in range(2, 24) if greedy[k] not in greedy[:k])
    stop = greedy[reply_tokens]
    engine = make_engine(model)
    engine.add_request("turn1", first, SamplingParams(max_tokens=12, stop_token_ids=(stop,)))
    outputs, _ = collect(engine)
    assert outputs["turn1"] == greedy[:reply_tokens]
    # prompt, reply and stop token: 31+ tokens whose K/V is computed, so the 4th block is full
    nxt = first + outputs["turn1"] + [stop] + prompt(9, 5)
    engine.add_request("turn2", nxt, SamplingParams(max_tokens=1))
    _, finals = collect(engine)
    assert finals["turn2"].usage.cached_tokens >= 32
