"""The new step shapes give mlx-lm's greedy tokens: a chat admission folded into the decode
forward (which the old fold rule sent to a second forward), prefill chunks of unequal lengths
packed into forwards by length; and top-up: the decode batch keeps its pipeline while a
waiting request cannot be admitted, and takes it in as soon as it can."""

from __future__ import annotations

import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from tests.support.engine_fixtures import random_prompt as tokens
from worker.runner.plan import StepKind

GREEDY = SamplingParams(max_tokens=12)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return tiny_model(request.param)


def watch(engine) -> list:
    """Every forward the runner is given: (kind, its chunks as (request, tokens), decode
    rows, whether its inputs are the previous step's tokens still on the device)."""
    seen, original = [], engine.runner.run

    def run(plan, device_tokens=None, times=None):
        chunks = [(r.key.request_id, len(r.tokens)) for r in plan.prefill]
        seen.append((plan.kind, chunks, len(plan.decode), device_tokens is not None))
        return original(plan, device_tokens, times)

    engine.runner.run = run
    return seen


def test_a_chat_admission_folds_into_the_decode_forward(model):
    """A 45-token suffix after a cached 400-token system prompt, admitted while a request of
    the same tenant decodes: 45 x 445 context slots, over the old rule's 16,384, so it used
    to be a second forward. Now its rows join the decode forward, and the tokens still
    match mlx-lm's."""
    engine = make_engine(model, prefill_chunk=256, step_token_budget=512)
    system = tokens(400, 1)
    first, chat = system + tokens(45, 2), system + tokens(45, 3)
    engine.add_request("warm", first, SamplingParams(max_tokens=1))
    run_to_completion(engine)  # the system prompt is cached now
    engine.add_request("busy", first, SamplingParams(max_tokens=20))
    for _ in range(3):
        engine.step()
    seen = watch(engine)
    engine.add_request("chat", chat, GREEDY)
    outputs = run_to_completion(engine)
    folded = [(kind, n) for kind, chunks, n, _ in seen for rid, _ in chunks if rid == "chat"]
    assert folded == [(StepKind.MIXED, 1)]  # one forward, beside the decoding request
    chunk = next(c for _, chunks, _, _ in seen for c in chunks if c[0] == "chat")
    assert chunk[1] * 445 > 16384 and chunk[1] <= 45 + 8  # only its suffix was computed
    assert outputs["chat"] == reference_greedy(model, chat, 12)
    assert engine.stats()["folded_tokens"] >= chunk[1]
    engine.check_integrity()


def test_prefill_chunks_of_unequal_lengths_run_unpadded(model):
    """A 200-token prompt and two 20-token ones arrive together: their forwards hold chunks
    of one length each (the old single forward padded the short ones to 200: 360 slots)."""
    engine = make_engine(model, prefill_chunk=256, step_token_budget=512)
    prompts = {"long": tokens(200, 4), "a": tokens(20, 5), "b": tokens(21, 6)}
    seen = watch(engine)
    for rid, p in prompts.items():
        engine.add_request(rid, p, GREEDY)
    outputs = run_to_completion(engine)
    first = [(kind, chunks) for kind, chunks, _, _ in seen if chunks][:3]
    long_forward = [chunks for _, chunks in first if ("long", 200) in chunks]
    assert long_forward == [[("long", 200)]]  # alone: nobody padded to 200
    assert engine.stats()["prefill_padding_tokens"] <= 1  # 21 beside 20 at most
    for rid, p in prompts.items():
        assert outputs[rid] == reference_greedy(model, p, 12), rid
    engine.check_integrity()


def test_top_up_keeps_the_pipeline_while_nothing_can_be_admitted(model):
    engine = make_engine(model, max_running=2)
    for rid, seed in (("a", 7), ("b", 8)):
        engine.add_request(rid, tokens(10, seed), SamplingParams(max_tokens=8))
    for _ in range(3):
        engine.step()
    engine.add_request("c", tokens(10, 9), SamplingParams(max_tokens=8))
    seen = watch(engine)
    engine.step()  # the batch is full: "c" waits, and decoding stays pipelined
    assert seen[-1][0] is StepKind.DECODE and seen[-1][3]  # fed the device's tokens
    outputs = run_to_completion(engine)
    admitted = next(i for i, (_, chunks, _, _) in enumerate(seen) if chunks)
    # "c" went in with the step right after a slot freed: never behind an empty batch
    assert seen[admitted][2] >= 1 or seen[admitted][0] is StepKind.PREFILL
    assert outputs["c"] == reference_greedy(model, tokens(10, 9), 8)
    engine.check_integrity()
