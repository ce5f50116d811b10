"""n > 1 through the router: one Generate with n, choices demultiplexed by index, whole and
streamed; usage counts the prompt once; a stop string ends its choice alone."""

from __future__ import annotations

import pytest

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


def choice_text(tokenizer, alphabet, prompt_len: int, index: int, n: int) -> str:
    """What the stand-in worker generates for choice `index` (it walks its own offset)."""
    return tokenizer.decode([alphabet[(prompt_len + index + i) % len(alphabet)] for i in range(n)])


async def test_n_choices_whole(cluster, tiny_tokenizer):
    resp = await cluster.openai().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, n=3
    )
    worker = cluster.workers["w1"][0]
    assert [g.n for g in worker.received] == [3]  # one request: the worker forks it
    prompt_len = len(tiny_tokenizer.encode_chat(MESSAGES))
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for c in resp.choices:
        expected = choice_text(tiny_tokenizer, worker.config.alphabet, prompt_len, c.index, 5)
        assert c.message.content == expected and c.finish_reason == "length"
    assert len({c.message.content for c in resp.choices}) == 3
    assert resp.usage.prompt_tokens == prompt_len  # once, not three times
    assert resp.usage.completion_tokens == 15


async def test_n_choices_streamed_by_index(cluster, tiny_tokenizer):
    stream = await cluster.openai().chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    worker = cluster.workers["w1"][0]
    prompt_len = len(tiny_tokenizer.encode_chat(MESSAGES))
    for i in (0, 1):
        assert texts[i] == choice_text(tiny_tokenizer, worker.config.alphabet, prompt_len, i, 4)
    assert finishes == {0: "length", 1: "length"}
    assert usage.completion_tokens == 8 and usage.prompt_tokens == prompt_len


async def test_n_out_of_range_is_a_400(cluster):
    import openai

    with pytest.raises(openai.BadRequestError, match="'n' must be between 1 and 16"):
        await cluster.openai().chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, n=17
        )
