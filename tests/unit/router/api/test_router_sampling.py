"""The router's sampling fields through the openai client, with stand-in workers: logprobs in
OpenAI's chat and legacy shapes (whole and streamed), and the fields carried to the worker."""

from __future__ import annotations

import json

import pytest

from shared.sampling import Grammar, LogitBias

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


def _alphabet(cluster):
    return cluster.workers["w1"][0].config.alphabet


def _expected(cluster, tokenizer, prompt_len, n):
    alphabet = _alphabet(cluster)
    tokens = [alphabet[(prompt_len + i) % len(alphabet)] for i in range(n)]
    return tokens, [tokenizer.token_bytes(t) for t in tokens]


async def test_chat_logprobs_whole(cluster, tiny_tokenizer):
    api = cluster.openai()
    resp = await api.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=3
    )
    prompt_len = len(tiny_tokenizer.encode_chat(MESSAGES))
    tokens, raw = _expected(cluster, tiny_tokenizer, prompt_len, 4)
    content = resp.choices[0].logprobs.content
    assert [c.token for c in content] == [b.decode() for b in raw]
    assert [bytes(c.bytes) for c in content] == raw
    assert "".join(c.token for c in content) == resp.choices[0].message.content
    for c in content:
        assert c.logprob == -0.5
        assert [t.logprob for t in c.top_logprobs] == [-0.5, -1.5, -2.5]
        assert c.top_logprobs[0].token == c.token
    sent = cluster.workers["w1"][0].received[0].sampling
    assert sent.logprobs and sent.top_logprobs == 3


async def test_chat_logprobs_streamed(cluster, tiny_tokenizer):
    api = cluster.openai()
    stream = await api.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, logprobs=True, top_logprobs=2, stream=True
    )
    chunks = [c async for c in stream]
    content = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(content) == 5
    assert all(len(e.top_logprobs) == 2 for e in content)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "".join(e.token for e in content) == text


async def test_no_logprobs_unless_asked(cluster):
    api = cluster.openai()
    resp = await api.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert resp.choices[0].logprobs is None
    assert not cluster.workers["w1"][0].received[0].sampling.logprobs


async def test_completions_legacy_logprobs(cluster, tiny_tokenizer):
    api = cluster.openai()
    prompt = "hello world"
    resp = await api.completions.create(model=MODEL, prompt=prompt, max_tokens=4, logprobs=2)
    lp = resp.choices[0].logprobs
    prompt_len = len(tiny_tokenizer.encode_prompt(prompt))
    tokens, raw = _expected(cluster, tiny_tokenizer, prompt_len, 4)
    assert lp.tokens == [b.decode() for b in raw]
    assert lp.token_logprobs == [-0.5] * 4
    assert all(
        len(t) == 2 and t[tok] == -0.5 for t, tok in zip(lp.top_logprobs, lp.tokens, strict=True)
    )
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert lp.text_offset == offsets
    assert "".join(lp.tokens) == resp.choices[0].text


async def test_completions_legacy_logprobs_streamed_offsets_continue(cluster):
    api = cluster.openai()
    stream = await api.completions.create(
        model=MODEL, prompt="hello world", max_tokens=5, logprobs=0, stream=True
    )
    chunks = [c async for c in stream]
    tokens, offsets = [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            offsets += c.choices[0].logprobs.text_offset
            assert c.choices[0].logprobs.top_logprobs is None  # logprobs=0: none asked
    assert len(tokens) == 5
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(5)]


async def test_sampling_fields_reach_the_worker(cluster):
    api = cluster.openai()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    await api.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
        logit_bias={"7": 5, "9": -100},
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        extra_body={"repetition_penalty": 1.2},
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": schema, "strict": True},
        },
    )
    await api.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, response_format={"type": "json_object"}
    )
    first, second = (g.sampling for g in cluster.workers["w1"][0].received)
    assert first.logit_bias == (LogitBias(7, 5.0), LogitBias(9, -100.0))
    assert (first.presence_penalty, first.frequency_penalty) == (0.5, -0.25)
    assert first.repetition_penalty == 1.2
    assert first.grammar.kind == "json_schema" and json.loads(first.grammar.source) == schema
    assert second.grammar == Grammar("json_schema", '{"type": "object"}')
