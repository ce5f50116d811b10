"""Logit bias, penalties, logprobs and grammars through the engine, on tiny random models."""

from __future__ import annotations

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from shared.sampling import Grammar, InvalidRequest, LogitBias, SamplingParams
from tests.support.engine_fixtures import VOCAB, make_engine, reference_greedy, tiny_model
from worker.runner.grammar import GrammarCompiler

PROMPT = [5, 9, 11, 3, 7, 2, 8, 1, 4]


def _run(engine):
    outputs, deltas = {}, {}
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
            deltas.setdefault(delta.request_id, []).append(delta)
    return outputs, deltas


def _penalized_greedy(model, prompt, p: SamplingParams, max_tokens: int) -> list[int]:
    """Reference: a full forward per token, penalties applied in numpy, argmax."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        row = np.array(model(mx.array([tokens]))[0, -1].astype(mx.float32))
        for t in set(tokens):
            row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
        counts = np.bincount(out, minlength=len(row))
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        out.append(int(np.argmax(row)))
        tokens.append(out[-1])
    return out


def test_logit_bias_forces_a_token():
    engine = make_engine(tiny_model("llama"))
    p = SamplingParams(max_tokens=6, temperature=0.9, seed=1, logit_bias=(LogitBias(42, 100.0),))
    engine.add_request("a", PROMPT, p)
    engine.add_request("b", PROMPT, SamplingParams(max_tokens=6))
    outputs, _ = _run(engine)
    assert outputs["a"] == [42] * 6
    assert outputs["b"] == reference_greedy(engine.model, PROMPT, 6)  # its neighbour unbiased


@pytest.mark.parametrize("pipeline", [True, False])
def test_penalties_match_a_reference_decode(pipeline):
    """Also pipelined: the penalty state advances on the device with the in-flight token."""
    model = tiny_model("qwen2")
    engine = make_engine(model, pipeline_decode=pipeline)
    p = SamplingParams(
        max_tokens=16, presence_penalty=0.6, frequency_penalty=1.2, repetition_penalty=1.4
    )
    engine.add_request("pen", PROMPT, p)
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=16))
    outputs, _ = _run(engine)
    expected = _penalized_greedy(model, PROMPT, p, 16)
    assert outputs["pen"] == expected
    assert outputs["pen"] != outputs["plain"]  # the penalties changed something
    assert outputs["plain"] == reference_greedy(model, PROMPT, 16)


def test_logprobs_and_top_logprobs_per_token():
    model = tiny_model("llama")
    engine = make_engine(model)
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=5, logprobs=True, top_logprobs=4))
    engine.add_request("b", PROMPT, SamplingParams(max_tokens=5, logprobs=True))
    engine.add_request("c", PROMPT, SamplingParams(max_tokens=5))
    outputs, deltas = _run(engine)
    first = np.array(model(mx.array([PROMPT]))[0, -1].astype(mx.float32))
    ref = first - np.log(np.exp(first - first.max()).sum()) - first.max()
    a = [d for d in deltas["a"] if d.token_ids]
    assert len(a) == 5
    assert a[0].logprobs[0] == pytest.approx(ref[outputs["a"][0]], abs=1e-4)
    for d in a:
        (top,) = d.top_logprobs
        assert len(top.token_ids) == 4
        assert list(top.logprobs) == sorted(top.logprobs, reverse=True)
        assert top.token_ids[0] == d.token_ids[0]  # greedy: the most likely token
        assert d.logprobs[0] == pytest.approx(top.logprobs[0]) and d.logprobs[0] <= 0
    assert all(d.logprobs and d.top_logprobs is None for d in deltas["b"] if d.token_ids)
    assert all(d.logprobs is None for d in deltas["c"])


# ------------------------------------------------------------ grammars


@pytest.fixture(scope="module")
def grammar_setup(tiny_model_dir):
    """A real byte-level BPE tokenizer and a random model over the same vocabulary."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    vocab = len(hf)
    return GrammarCompiler.from_hf_tokenizer(hf, vocab), tiny_model("llama", vocab_size=vocab), hf


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "color": {"enum": ["red", "green", "blue"]},
        "sizes": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "maxItems": 3,
        },
        "inner": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "color", "sizes", "inner"],
    "additionalProperties": False,
}


def test_grammar_output_parses_and_matches_the_schema(grammar_setup):
    compiler, model, hf = grammar_setup
    engine = make_engine(model, grammars=compiler)
    eos = (hf.eos_token_id,)
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    for i in range(4):
        p = SamplingParams(
            max_tokens=120, temperature=1.0, seed=i, stop_token_ids=eos, grammar=grammar
        )
        engine.add_request(f"g{i}", [5, 6, 7], p)
    engine.add_request("free", [5, 6, 7], SamplingParams(max_tokens=20))  # shares the batch
    outputs, deltas = _run(engine)
    for i in range(4):
        assert deltas[f"g{i}"][-1].finish_reason == "stop"
        value = json.loads(hf.decode(outputs[f"g{i}"]))
        jsonschema.validate(value, SCHEMA)
    assert outputs["free"] == reference_greedy(model, [5, 6, 7], 20)


def test_grammar_choices_fork_and_resume(grammar_setup):
    """n > 1 forks the matcher; a resumed request's earlier output is consumed first."""
    compiler, model, hf = grammar_setup
    engine = make_engine(model, grammars=compiler)
    schema = {
        "type": "object",
        "properties": {"c": {"enum": ["red", "green"]}},
        "required": ["c"],
        "additionalProperties": False,
    }
    grammar = Grammar("json_schema", json.dumps(schema))
    p = SamplingParams(max_tokens=30, temperature=1.0, seed=3, grammar=grammar)
    engine.add_request("n", [5, 6], p, n=3)
    earlier = hf.encode('{"c":"gr', add_special_tokens=False)
    resumed = SamplingParams(max_tokens=30, grammar=grammar, prior_output_tokens=len(earlier))
    engine.add_request("resumed", [5, 6, *earlier], resumed)
    outputs, deltas = _run(engine)
    texts = {}
    for d in deltas["n"]:
        texts[d.index] = texts.get(d.index, []) + list(d.token_ids)
    assert len(texts) == 3
    for toks in texts.values():
        assert json.loads(hf.decode(toks))["c"] in ("red", "green")
    assert json.loads('{"c":"gr' + hf.decode(outputs["resumed"])) == {"c": "green"}


def _pipelined_steps(engine, requests) -> int:
    """Run `requests` (id -> (prompt, params)); how many steps were built pipelined."""
    original, pipelined = engine.runner.run, []

    def run(plan, device_tokens=None, times=None):
        pipelined.append(device_tokens is not None)
        return original(plan, device_tokens, times)

    engine.runner.run = run
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    _run(engine)
    return sum(pipelined)


def test_grammar_rows_are_not_pipelined_and_others_still_are(grammar_setup):
    compiler, model, _ = grammar_setup
    grammar = Grammar("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}}))
    plain = {"p": ([1, 2, 3], SamplingParams(max_tokens=12))}
    constrained = {"g": ([1, 2, 3], SamplingParams(max_tokens=12, grammar=grammar))}
    assert _pipelined_steps(make_engine(model, grammars=compiler), plain) >= 8
    assert _pipelined_steps(make_engine(model, grammars=compiler), constrained) == 0


def test_bad_grammars_are_refused_at_add_request(grammar_setup):
    compiler, model, _ = grammar_setup
    engine = make_engine(model, grammars=compiler)
    bad = Grammar("json_schema", json.dumps({"type": "objekt"}))
    with pytest.raises(InvalidRequest, match="objekt"):
        engine.add_request("bad", [1, 2], SamplingParams(grammar=bad))
    assert not engine.has_work()
    no_tokenizer = make_engine(tiny_model("llama"))
    ok = Grammar("json_schema", "{}")
    with pytest.raises(InvalidRequest, match="no tokenizer"):
        no_tokenizer.add_request("g", [1, 2], SamplingParams(grammar=ok))


def test_out_of_vocabulary_bias_is_refused():
    engine = make_engine(tiny_model("llama"))
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        engine.add_request("x", [1], SamplingParams(logit_bias=(LogitBias(VOCAB, 1.0),)))


def test_penalized_and_grammar_steps_build_without_host_reads(grammar_setup):
    """Penalty state advances on the device and masks come from the host matcher: building
    a step (pipelined or not) reads no device data."""
    from tests.unit.worker.engine.test_no_host_sync import counting_host_reads

    compiler, model, _ = grammar_setup
    engine = make_engine(model, grammars=compiler)
    original, reads, pipelined = engine.runner.run, [], []

    def run(plan, device_tokens=None, times=None):
        pipelined.append(device_tokens is not None)
        with counting_host_reads(reads):
            return original(plan, device_tokens, times)

    engine.runner.run = run
    grammar = Grammar("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}}))
    penalized = SamplingParams(
        max_tokens=16,
        frequency_penalty=1.0,
        repetition_penalty=1.3,
        logit_bias=(LogitBias(3, 2.0),),
    )
    engine.add_request("pen", [1, 2, 3], penalized)
    _run(engine)
    assert sum(pipelined) >= 8  # penalties alone keep the pipelined decode
    engine.add_request("g", [1, 2, 3], SamplingParams(max_tokens=16, grammar=grammar))
    engine.add_request("pen2", [4, 5, 6], penalized)
    _run(engine)
    assert reads == []


def test_requests_with_processors_do_not_draft_but_match_the_reference():
    """Speculation samples several points per sequence in one step; penalty state advances
    once per step, so penalized requests never draft (and stay exact)."""
    model = tiny_model("qwen2")
    engine = make_engine(model, speculative="ngram", spec_tokens=4)
    p = SamplingParams(max_tokens=16, frequency_penalty=1.2, repetition_penalty=1.4)
    engine.add_request("pen", PROMPT, p)
    (seq,) = engine.scheduler.sequences_of("pen")
    assert seq.drafting is None
    outputs, _ = _run(engine)
    assert outputs["pen"] == _penalized_greedy(model, PROMPT, p, 16)
