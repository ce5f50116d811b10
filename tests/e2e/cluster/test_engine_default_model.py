"""The engine on the real default model reproduces mlx-lm's greedy output."""

from __future__ import annotations

import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import reference_greedy, run_to_completion
from worker.config import EngineConfig
from worker.engine.engine import Engine

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
]


@pytest.fixture(scope="module")
def smollm(default_model_dir):
    from shared.models.loading import load_model

    return load_model(default_model_dir)


def chat_ids(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def test_engine_matches_mlx_lm_on_the_default_model(smollm):
    model, tok = smollm
    # block size 16: the default system prompt shares 22 tokens, one full block
    config = EngineConfig(block_size=16, num_blocks=1024, prefill_chunk=64)
    engine = Engine.create(model, config, max_context=8192)
    prompts = {q: chat_ids(tok, q) for q in QUESTIONS}
    for q, ids in prompts.items():
        engine.add_request(
            q, ids, SamplingParams(max_tokens=20, stop_token_ids=(tok.eos_token_id,))
        )
    outputs = run_to_completion(engine)
    for q, ids in prompts.items():
        expected = reference_greedy(model, ids, 20)
        if tok.eos_token_id in expected:
            expected = expected[: expected.index(tok.eos_token_id)]
        assert outputs[q] == expected, q
    assert "Paris" in tok.decode(outputs[QUESTIONS[0]])
    # every prompt shares the default system prompt: the later ones hit the cache
    assert engine.stats()["cache_hit_tokens"] > 0
    engine.check_integrity()
