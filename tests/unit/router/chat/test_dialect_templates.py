"""Every dialect family's real chat template renders a tool round trip on a tiny tokenizer that
carries the family's tokens, and every one of those tokens encodes as a single token."""

from __future__ import annotations

import functools

import pytest

from tests.support.dialects.families import FAMILIES, FamilySpec

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}
CALL_ID = "call0Abc9"  # Mistral's templates want nine alphanumerics


@functools.cache
def _base_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["what is the weather in paris today"] * 4, trainer)
    return tokenizer.to_str()


def _tokenizer(spec: FamilySpec):
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_base_tokenizer_json()),
        bos_token=spec.bos,
        eos_token=spec.eos,
        chat_template=spec.chat_template,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(spec.special)})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.added])
    return tokenizer


def _conversation(spec: FamilySpec) -> list[dict]:
    arguments = {"city": "Paris"}
    if spec.tool_arguments == "string":
        arguments = '{"city": "Paris"}'
    call = {
        "id": CALL_ID,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    answer = [{"role": "assistant", "content": "It is sunny."}] if spec.answer_after_tools else []
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "Sunny, 21 C."},
        *answer,
        {"role": "user", "content": "And tomorrow?"},
    ]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_template_renders_a_tool_round_trip(name: str) -> None:
    spec = FAMILIES[name]
    text = _tokenizer(spec).apply_chat_template(
        _conversation(spec), tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False
    )
    assert "Paris" in text and "Sunny, 21 C." in text and "And tomorrow?" in text


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_tokens_are_single_tokens(name: str) -> None:
    spec = FAMILIES[name]
    tokenizer = _tokenizer(spec)
    for token in (*spec.special, *spec.added, *spec.end_tokens):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert set(spec.end_tokens) <= set(spec.special) | set(spec.added)
    assert spec.eos in spec.special and (spec.bos is None or spec.bos in spec.special)
