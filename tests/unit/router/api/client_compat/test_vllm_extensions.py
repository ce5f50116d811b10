"""vLLM's sampling extensions through the openai client, with stand-in workers: what a serving
benchmark sends (guidellm: `ignore_eos: true, stop: null`), what goes on the wire, and the
text options (stop strings kept, special tokens shown)."""

from __future__ import annotations

import openai
import pytest

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "hello world"}]
# guidellm's and `vllm bench serve`'s extra body for an exact output length
BENCH = {"ignore_eos": True, "stop": None, "min_tokens": 6}


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


def _sent(cluster, i=-1):
    return cluster.workers["w1"][0].received[i].sampling


async def test_benchmark_body_on_completions_and_chat(cluster):
    api = cluster.openai()
    eos = cluster.tokenizer.eos_token_ids
    assert eos
    text = await api.completions.create(model=MODEL, prompt="hi", max_tokens=6, extra_body=BENCH)
    assert text.usage.completion_tokens == 6 and text.choices[0].finish_reason == "length"
    sent = _sent(cluster)
    assert sent.min_tokens == 6 and not set(sent.stop_token_ids) & set(eos)
    chat = await api.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, extra_body=BENCH, stream=True
    )
    chunks = [c async for c in chat]
    assert chunks[-1].choices[0].finish_reason == "length"
    sent = _sent(cluster)
    assert sent.min_tokens == 6
    assert not set(sent.stop_token_ids) & set(cluster.tokenizer.chat_stop_token_ids)


async def test_without_ignore_eos_the_end_tokens_stop(cluster):
    api = cluster.openai()
    await api.completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert set(cluster.tokenizer.eos_token_ids) <= set(_sent(cluster).stop_token_ids)
    assert _sent(cluster).min_tokens == 0


async def test_stop_token_ids_stop_the_reply(cluster):
    api = cluster.openai()
    alphabet = cluster.workers["w1"][0].config.alphabet
    prompt_ids = [5, 6, 7]
    stop = alphabet[(len(prompt_ids) + 2) % len(alphabet)]  # the third token the fake writes
    resp = await api.completions.create(
        model=MODEL, prompt=prompt_ids, max_tokens=10, extra_body={"stop_token_ids": [stop]}
    )
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == 3
    assert stop in _sent(cluster).stop_token_ids


async def test_include_stop_str_in_output(cluster):
    api = cluster.openai()
    plain = await api.completions.create(model=MODEL, prompt="hi", max_tokens=6)
    stop = plain.choices[0].text[2:4]
    assert stop
    cut = await api.completions.create(model=MODEL, prompt="hi", max_tokens=6, stop=stop)
    kept = await api.completions.create(
        model=MODEL,
        prompt="hi",
        max_tokens=6,
        stop=stop,
        extra_body={"include_stop_str_in_output": True},
    )
    assert cut.choices[0].text == plain.choices[0].text[:2]
    assert kept.choices[0].text == plain.choices[0].text[:4]
    assert kept.choices[0].finish_reason == "stop"


async def test_skip_special_tokens_false_shows_them(make_cluster):
    cluster = await make_cluster()
    eos = cluster.tokenizer.eos_token_ids[0]
    await cluster.add_worker("w1", alphabet=(eos, 50))
    api = cluster.openai()
    body = {"ignore_eos": True}
    skipped = await api.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body=body)
    shown = await api.completions.create(
        model=MODEL, prompt="hi", max_tokens=4, extra_body=body | {"skip_special_tokens": False}
    )
    assert "<|im_end|>" not in skipped.choices[0].text
    assert shown.choices[0].text.count("<|im_end|>") == 2
    assert shown.choices[0].text.replace("<|im_end|>", "") == skipped.choices[0].text


async def test_every_extension_accepts_null(cluster):
    api = cluster.openai()
    nulls = dict.fromkeys(
        [
            "ignore_eos",
            "min_tokens",
            "stop_token_ids",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "prompt_cache_key",
            "stop",
            "seed",
            "logit_bias",
            "user",
        ]
    )
    await api.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=nulls)
    await api.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=nulls
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"min_tokens": 9}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": "3"}, "min_tokens"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
        ({"stop_token_ids": [10**6]}, "stop_token_ids"),
        ({"skip_special_tokens": 0}, "skip_special_tokens"),
        ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output"),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "text"])
async def test_bad_values_are_a_400_naming_the_field(cluster, body, param, endpoint):
    api = cluster.openai()
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "chat":
            await api.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=8, extra_body=body
            )
        else:
            await api.completions.create(model=MODEL, prompt="hi", max_tokens=8, extra_body=body)
    assert e.value.body["param"] == param


@pytest.mark.parametrize("endpoint", ["chat", "text"])
async def test_every_optional_field_may_be_null(cluster, endpoint):
    """OpenAI's schema makes every optional field nullable; clients send `null` for unset."""
    from router.api.openai.fields import CHAT_FIELDS, COMPLETION_FIELDS

    if endpoint == "chat":
        fields, required = CHAT_FIELDS, {"model": MODEL, "messages": MESSAGES}
        path = "/v1/chat/completions"
    else:
        fields, required = COMPLETION_FIELDS, {"model": MODEL, "prompt": "hi"}
        path = "/v1/completions"
    body = dict.fromkeys(fields - required.keys()) | required  # max_tokens null: the default
    resp = await cluster.client.post(path, json=body)
    assert resp.status == 200, await resp.json()
    assert (await resp.json())["choices"][0]["finish_reason"] == "length"
