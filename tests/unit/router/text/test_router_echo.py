"""`echo` and vLLM's `prompt_logprobs` through the openai client, with stand-in workers.

The stand-in scores prompt token i (from 1) at -0.25 * i with rank i, its alternatives the
first k alphabet tokens at -0.1, -0.2, ... (tests/support/fake_worker.py).
"""

from __future__ import annotations

import pytest

MODEL = "tiny"
PROMPT = "hello world, how are you"


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


def _prompt_tokens(tokenizer, prompt=PROMPT):
    ids = tokenizer.encode_prompt(prompt)
    return ids, [tokenizer.token_bytes(t).decode("utf-8", "backslashreplace") for t in ids]


async def test_echo_with_logprobs_and_max_tokens_zero_scores_the_prompt(cluster, tiny_tokenizer):
    """lm-evaluation-harness's request: the prompt back, its tokens' logprobs, nothing more."""
    api = cluster.openai()
    resp = await api.completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0
    )
    choice = resp.choices[0]
    ids, texts = _prompt_tokens(tiny_tokenizer)
    assert choice.text == PROMPT and choice.finish_reason == "length"
    lp = choice.logprobs
    assert lp.tokens == texts
    assert lp.token_logprobs == [None] + [-0.25 * i for i in range(1, len(ids))]
    assert lp.top_logprobs[0] is None
    alt = tiny_tokenizer.token_bytes(cluster.workers["w1"][0].config.alphabet[0]).decode()
    assert all(top == {alt: -0.1} for top in lp.top_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert resp.usage.prompt_tokens == len(ids) and resp.usage.completion_tokens == 0
    sent = cluster.workers["w1"][0].received[0].sampling
    assert sent.prompt_logprobs == 1 and sent.max_tokens == 0


async def test_echo_with_logprobs_puts_the_prompt_entries_first(cluster, tiny_tokenizer):
    api = cluster.openai()
    resp = await api.completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=0, max_tokens=3
    )
    choice = resp.choices[0]
    ids, texts = _prompt_tokens(tiny_tokenizer)
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3 and lp.tokens[: len(ids)] == texts
    assert lp.token_logprobs[len(ids) :] == [-0.5] * 3  # the stand-in's generated tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]


async def test_echo_without_logprobs_asks_the_worker_for_nothing_more(cluster):
    api = cluster.openai()
    resp = await api.completions.create(model=MODEL, prompt=PROMPT, echo=True, max_tokens=2)
    assert resp.choices[0].text.startswith(PROMPT) and resp.choices[0].logprobs is None
    assert cluster.workers["w1"][0].received[0].sampling.prompt_logprobs is None


async def test_echo_of_token_ids_decodes_them(cluster, tiny_tokenizer):
    ids, _ = _prompt_tokens(tiny_tokenizer)
    api = cluster.openai()
    resp = await api.completions.create(model=MODEL, prompt=[ids], echo=True, max_tokens=1)
    assert resp.choices[0].text.startswith(tiny_tokenizer.decode(ids))


async def test_echo_streamed_sends_the_prompt_in_the_first_chunk(cluster, tiny_tokenizer):
    api = cluster.openai()
    stream = await api.completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=2, stream=True
    )
    chunks = [c async for c in stream if c.choices]
    ids, texts = _prompt_tokens(tiny_tokenizer)
    first = chunks[0].choices[0]
    assert first.text.startswith(PROMPT)
    assert first.logprobs.tokens[: len(ids)] == texts
    assert first.logprobs.token_logprobs[0] is None
    text = "".join(c.choices[0].text for c in chunks)
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == len(ids) + 2 and "".join(tokens) == text


async def test_completions_prompt_logprobs_in_vllm_shape(cluster, tiny_tokenizer):
    api = cluster.openai()
    resp = await api.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 2}
    )
    choice = resp.choices[0]
    assert choice.logprobs is None and not choice.text.startswith(PROMPT)
    scored = choice.model_extra["prompt_logprobs"]
    ids, _ = _prompt_tokens(tiny_tokenizer)
    alphabet = cluster.workers["w1"][0].config.alphabet
    assert scored[0] is None and len(scored) == len(ids)
    for i, (token, entry) in enumerate(zip(ids[1:], scored[1:], strict=True), start=1):
        assert entry[str(token)] == {
            "logprob": -0.25 * i,
            "rank": i,
            "decoded_token": tiny_tokenizer.decode([token]),
        }
        for r, alt in enumerate(alphabet[:2], start=1):
            if alt != token:
                assert entry[str(alt)]["rank"] == r
                assert entry[str(alt)]["logprob"] == pytest.approx(-0.1 * r)
    assert cluster.workers["w1"][0].received[0].sampling.prompt_logprobs == 2


async def test_chat_prompt_logprobs_at_the_top_of_the_response(cluster, tiny_tokenizer):
    messages = [{"role": "user", "content": "hello"}]
    api = cluster.openai()
    resp = await api.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    scored = resp.model_extra["prompt_logprobs"]
    ids = tiny_tokenizer.encode_chat(messages)
    assert scored[0] is None and len(scored) == len(ids)
    assert all(list(e) == [str(t)] for e, t in zip(scored[1:], ids[1:], strict=True))
    assert resp.choices[0].logprobs is None


async def test_chat_prompt_logprobs_streamed_in_the_first_chunk(cluster):
    api = cluster.openai()
    stream = await api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=3,
        stream=True,
        extra_body={"prompt_logprobs": 1},
    )
    chunks = [c async for c in stream]
    assert chunks[0].model_extra["prompt_logprobs"][0] is None
    assert all("prompt_logprobs" not in (c.model_extra or {}) for c in chunks[1:])


async def test_echo_with_n_choices_echoes_each(cluster):
    api = cluster.openai()
    resp = await api.completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=0, max_tokens=2, n=2
    )
    assert len(resp.choices) == 2
    for choice in resp.choices:
        assert choice.text.startswith(PROMPT)
        assert choice.logprobs.token_logprobs[0] is None
