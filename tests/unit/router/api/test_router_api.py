"""End-to-end: the router over real sockets with stand-in workers, through the openai client."""

from __future__ import annotations

import pytest

MODEL = "tiny"


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


def expected_tokens(alphabet, prompt_len, n):
    return [alphabet[(prompt_len + i) % len(alphabet)] for i in range(n)]


async def test_chat_completion_non_streaming(cluster, tiny_tokenizer):
    api = cluster.openai()
    messages = [{"role": "user", "content": "hello world"}]
    resp = await api.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
    prompt_len = len(tiny_tokenizer.encode_chat(messages))
    worker = cluster.workers["w1"][0]
    expected = tiny_tokenizer.decode(expected_tokens(worker.config.alphabet, prompt_len, 5))
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == prompt_len
    assert resp.usage.completion_tokens == 5
    assert resp.usage.total_tokens == prompt_len + 5
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    im_end = tiny_tokenizer.chat_stop_token_ids
    assert worker.received[0].sampling.stop_token_ids == im_end


async def test_chat_completion_streaming_with_usage(cluster, tiny_tokenizer):
    api = cluster.openai()
    messages = [{"role": "user", "content": "hello world"}]
    stream = await api.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt_len = len(tiny_tokenizer.encode_chat(messages))
    alphabet = cluster.workers["w1"][0].config.alphabet
    assert text == tiny_tokenizer.decode(expected_tokens(alphabet, prompt_len, 6))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


async def test_text_completion_streaming_and_not(cluster, tiny_tokenizer):
    api = cluster.openai()
    resp = await api.completions.create(model=MODEL, prompt="the quick brown fox", max_tokens=4)
    assert resp.object == "text_completion" and resp.choices[0].finish_reason == "length"
    stream = await api.completions.create(
        model=MODEL, prompt="the quick brown fox", max_tokens=4, stream=True
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == resp.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_cached_tokens_reported_on_repeat(cluster):
    api = cluster.openai()
    prompt = list(range(60, 100))  # 40 token ids = 10 blocks of 4
    await api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    again = await api.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens == 40


async def test_models_health_cluster_metrics(cluster):
    api = cluster.openai()
    models = await api.models.list()
    assert [m.id for m in models.data] == [MODEL]
    health = await cluster.client.get("/health")
    assert health.status == 200
    await api.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    view = await (await cluster.client.get("/v1/cluster")).json()
    (w,) = view["workers"]
    assert w["id"] == "w1" and w["healthy"] and w["requests_served"] == 1
    assert w["block_size"] == 4 and w["kv_total_blocks"] == 4096
    text = await (await cluster.client.get("/metrics")).text()
    assert 'mlx_fleet_http_requests_total{endpoint="/v1/completions",status="200"} 1.0' in text
    assert 'mlx_fleet_worker_requests_served_total{worker="w1"} 1.0' in text
    assert f'vllm:generation_tokens_total{{model_name="{MODEL}"}} 2.0' in text


async def test_multibyte_characters_are_never_split(cluster, tiny_tokenizer):
    """Emoji and CJK arrive one byte-token at a time; every streamed piece is whole text."""
    text = "é😀中文🎉"
    alphabet = tuple(tiny_tokenizer.encode_prompt(text))
    assert len(alphabet) > len(text)  # really split into byte tokens
    await cluster.kill_worker("w1")
    await cluster.add_worker("w2", alphabet=alphabet)
    prompt = [60] * len(alphabet)  # prompt length = alphabet length: generation starts aligned
    api = cluster.openai()
    stream = await api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2 * len(alphabet), stream=True
    )
    pieces = [c.choices[0].text async for c in stream]
    assert "".join(pieces) == text * 2
    assert not any("\ufffd" in p for p in pieces)
    assert len([p for p in pieces if p]) > 2  # streamed in several pieces


async def test_stop_string_cuts_text_and_aborts_the_worker(make_cluster, tiny_tokenizer):
    cluster = await make_cluster()
    alphabet = tuple(tiny_tokenizer.encode_prompt("abcdefgh"))
    worker = await cluster.add_worker("w1", alphabet=alphabet, token_delay_s=0.01)
    api = cluster.openai()
    prompt = [60] * len(alphabet)
    resp = await api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=100, stop=["xyz", "ef"]
    )
    assert resp.choices[0].text == "abcd"
    assert resp.choices[0].finish_reason == "stop"
    await cluster.wait_until(lambda: worker.aborted)
    stream = await api.completions.create(
        model=MODEL, prompt=prompt, max_tokens=100, stop="gh", stream=True
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == "abcdef"
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_metrics_escape_worker_ids_and_use_the_prometheus_content_type(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker('odd"id\\x')
    resp = await cluster.client.get("/metrics")
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'mlx_fleet_worker_up{worker="odd\\"id\\\\x"} 1.0' in await resp.text()
