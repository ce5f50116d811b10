"""The dialect checkpoints (tests/support/dialects/models.py): the router's tokenizer loads one,
and the worker's engine and mlx-lm both decode exactly the chosen reply after any prompt of
the chosen length, whose conversation `pad_to_length` pads to that length."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest

from router.text.tokenizer import ModelTokenizer
from shared.models.loading import load_model
from shared.sampling import SamplingParams
from tests.support.dialects.families import FamilySpec
from tests.support.dialects.models import build_dialect_model, pad_to_length
from tests.support.engine_fixtures import reference_greedy
from worker.config import EngineConfig
from worker.engine.engine import Engine

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPEC = FamilySpec(
    name="chatml",
    template="(inline)",
    special=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    added=("<think>", "</think>", "<tool_call>", "</tool_call>"),
    eos="<|im_end|>",
    end_tokens=("<|im_end|>",),
)
REPLIES = {
    37: '<think>a b a</think>x<tool_call>{"a": 1}</tool_call><|im_end|>',
    64: "hello hello world, the the<|im_end|>",
}
MESSAGES = [
    {"role": "system", "content": "you are a helpful assistant"},
    {"role": "user", "content": "what is the capital of france?"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_dialect_model(tmp_path_factory.mktemp("chatml"), SPEC, REPLIES, CHATML)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return ModelTokenizer.load(model_dir)


def reply_ids(tokenizer: ModelTokenizer, length: int) -> list[int]:
    return tokenizer.encode_text(REPLIES[length])


def prompt_of(tokenizer: ModelTokenizer, length: int) -> list[int]:
    def count(messages):
        return len(tokenizer.encode_chat(messages))

    return tokenizer.encode_chat(pad_to_length(count, MESSAGES, length))


def test_the_router_reads_its_tokens_and_stops(model_dir, tokenizer):
    im_end = tokenizer.encode_text("<|im_end|>")
    assert len(im_end) == 1 and tokenizer.chat_stop_token_ids == tuple(im_end)
    ids = reply_ids(tokenizer, 37)
    assert tokenizer.decode(ids) == '<think>a b a</think>x<tool_call>{"a": 1}</tool_call>'
    assert tokenizer.decode(ids, skip_special_tokens=False) == REPLIES[37]
    assert len(tokenizer.encode_text("?~~~ ~~")) == 7  # the filler never merges
    assert (model_dir / "model.safetensors").stat().st_size < 2**21


def test_pad_to_length_hits_the_count_exactly(tokenizer):
    def count(messages):
        return len(tokenizer.encode_chat(messages))

    base = count(MESSAGES)
    for target in (base, base + 1, base + 40):
        padded = pad_to_length(count, MESSAGES, target)
        assert count(padded) == target
        assert padded[0] == MESSAGES[0] and MESSAGES[1]["content"].endswith("?")
    with pytest.raises(ValueError, match="already count"):
        pad_to_length(count, MESSAGES, base - 1)
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert pad_to_length(lambda m: len(m[0]["content"][0]["text"]), parts, 5)[0]["content"] == [
        {"type": "text", "text": "hi~~~"}
    ]
    with pytest.raises(ValueError, match="exactly"):  # each filler counts two: 5 is out of reach
        pad_to_length(lambda m: 2 * len(m[0]["content"][0]["text"]), parts, 5)


def test_the_engine_and_mlx_lm_decode_the_chosen_replies(model_dir, tokenizer):
    engine = Engine.from_path(model_dir, EngineConfig(kv_memory_bytes=64 * 2**20))
    model, _ = load_model(model_dir)
    rng = random.Random(0)
    prompts = {}
    for length in REPLIES:
        prompts[f"chat{length}"] = (length, prompt_of(tokenizer, length))
        noise = [rng.randrange(tokenizer.vocab_size) for _ in range(length)]
        prompts[f"noise{length}"] = (length, noise)
    for request_id, (length, prompt) in prompts.items():
        assert len(prompt) == length
        sampling = SamplingParams(max_tokens=100, stop_token_ids=tokenizer.chat_stop_token_ids)
        engine.add_request(request_id, prompt, sampling)
    outputs, finish = {}, {}
    while engine.has_work():
        for delta in engine.step():
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
            finish[delta.request_id] = delta.finish_reason
    for request_id, (length, prompt) in prompts.items():
        ids = reply_ids(tokenizer, length)  # the engine holds back the stop token it met
        assert (outputs[request_id], finish[request_id]) == (ids[:-1], "stop"), request_id
        assert reference_greedy(model, prompt, len(ids)) == ids, request_id
    mx.clear_cache()
