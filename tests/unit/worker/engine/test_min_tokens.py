"""vLLM's min_tokens in the engine: stop tokens cannot end a reply before that many tokens,
for a lone request, a batch beside others, n choices, and a request resumed elsewhere."""

from __future__ import annotations

import pytest

from shared.sampling import InvalidRequest, SamplingParams
from tests.support.engine_fixtures import make_engine, reference_greedy, tiny_model
from tests.unit.worker.engine.test_engine import prompt
from tests.unit.worker.engine.test_engine_requests import collect


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


def _stop_at(model, p, position=1):
    greedy = reference_greedy(model, p, 16)
    return greedy, greedy[position]


def test_min_tokens_masks_stop_tokens_until_reached(model):
    p = prompt(12, 4)
    greedy, stop = _stop_at(model, p)
    first = greedy.index(stop)
    engine = make_engine(model)
    engine.add_request("plain", p, SamplingParams(max_tokens=16, stop_token_ids=(stop,)))
    engine.add_request(
        "min", p, SamplingParams(max_tokens=16, stop_token_ids=(stop,), min_tokens=first + 4)
    )
    engine.add_request("other", prompt(9, 7), SamplingParams(max_tokens=16))
    outputs, finals = collect(engine)
    assert outputs["plain"] == greedy[:first]  # stopped at once
    out = outputs["min"]
    assert len(out) >= first + 4
    assert stop not in out[: first + 4]  # masked while short of min_tokens
    assert out[:first] == greedy[:first]  # nothing else changed before the stop
    if finals["min"].finish_reason == "stop":  # a stop token may end it once allowed
        assert finals["min"].usage.completion_tokens == len(out) + 1
    else:
        assert len(out) == 16
    assert outputs["other"] == reference_greedy(model, prompt(9, 7), 16)  # unaffected


def test_min_tokens_equal_to_max_tokens_gives_exactly_max_tokens(model):
    p = prompt(10, 9)
    greedy = reference_greedy(model, p, 12)
    stops = tuple(dict.fromkeys(greedy[:6]))  # the model's first choices all stop it
    engine = make_engine(model)
    engine.add_request(
        "exact", p, SamplingParams(max_tokens=12, stop_token_ids=stops, min_tokens=12), n=2
    )
    outputs, finals = collect(engine)
    assert finals["exact"].finish_reason == "length"
    assert len(outputs["exact"]) == 24  # both choices, 12 tokens each
    assert not set(outputs["exact"]) & set(stops)


def test_min_tokens_counts_prior_output_of_a_resumed_request(model):
    p = prompt(10, 11)
    greedy, stop = _stop_at(model, p, 0)
    engine = make_engine(model)
    # 3 of its min_tokens were produced elsewhere: 2 more are masked here
    sampling = SamplingParams(
        max_tokens=10, stop_token_ids=(stop,), min_tokens=5, prior_output_tokens=3
    )
    engine.add_request("moved", p, sampling)
    outputs, _ = collect(engine)
    assert len(outputs["moved"]) >= 2 and stop not in outputs["moved"][:2]


def test_min_tokens_above_max_tokens_is_refused(model):
    engine = make_engine(model)
    with pytest.raises(InvalidRequest, match="min_tokens"):
        engine.add_request("bad", prompt(5, 1), SamplingParams(max_tokens=4, min_tokens=5))


def test_no_stop_tokens_runs_to_max_tokens(model):
    """What ignore_eos sends: stop_token_ids without EOS (here none at all)."""
    p = prompt(8, 2)
    engine = make_engine(model)
    engine.add_request("all", p, SamplingParams(max_tokens=20, stop_token_ids=()))
    outputs, finals = collect(engine)
    assert outputs["all"] == reference_greedy(model, p, 20)
    assert finals["all"].finish_reason == "length"
