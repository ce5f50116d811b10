"""HTTP security: API keys (401), per-key concurrency (429), body size (413), max_tokens cap."""

from __future__ import annotations

import asyncio
import logging

import openai
import pytest

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
KEY, OTHER_KEY = "mlxf-right-key", "mlxf-second-key"


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def error_of(resp, status: int) -> dict:
    body = await resp.json()
    assert resp.status == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.fixture
async def keyed(make_cluster):
    cluster = await make_cluster(api_keys=(KEY, OTHER_KEY))
    await cluster.add_worker("w1")
    return cluster


async def test_missing_or_wrong_key_is_401_and_the_right_key_works(keyed, caplog):
    caplog.set_level(logging.INFO)
    error = await error_of(await keyed.client.post("/v1/chat/completions", json=CHAT), 401)
    assert error["code"] == "invalid_api_key" and "Authorization" in error["message"]
    resp = await keyed.client.post("/v1/chat/completions", json=CHAT, headers=bearer("guess"))
    error = await error_of(resp, 401)
    assert "guess" not in error["message"]
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    resp = await keyed.client.post("/v1/chat/completions", json=CHAT, headers=bearer(KEY))
    assert resp.status == 200
    assert KEY not in caplog.text and "guess" not in caplog.text


@pytest.mark.parametrize("path", ["/v1/models", "/v1/cluster", "/metrics", "/nope"])
async def test_every_path_but_health_needs_the_key(keyed, path):
    await error_of(await keyed.client.get(path), 401)
    assert (await keyed.client.get(path, headers=bearer(KEY))).status in (200, 404)


async def test_health_stays_open(keyed):
    assert (await keyed.client.get("/health")).status == 200


async def test_openai_client_with_and_without_the_key(keyed):
    good = openai.AsyncOpenAI(base_url=keyed.base_url(), api_key=KEY, max_retries=0)
    bad = openai.AsyncOpenAI(base_url=keyed.base_url(), api_key="nope", max_retries=0)
    try:
        reply = await good.completions.create(model="tiny", prompt="hello", max_tokens=2)
        assert reply.usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            await bad.completions.create(model="tiny", prompt="hello", max_tokens=2)
    finally:
        await good.close()
        await bad.close()


async def test_no_keys_configured_means_no_authentication(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    assert (await cluster.client.post("/v1/completions", json=TEXT)).status == 200


async def test_per_key_concurrency_is_429_for_that_key_only(make_cluster):
    cluster = await make_cluster(api_keys=(KEY, OTHER_KEY), per_key_concurrency=2)
    await cluster.add_worker("w1", token_delay_s=0.2)
    slow = {**TEXT, "max_tokens": 3}

    def post(key):
        return cluster.client.post("/v1/completions", json=slow, headers=bearer(key))

    first = [asyncio.create_task(post(KEY)) for _ in range(2)]
    await cluster.wait_until(lambda: len(cluster.workers["w1"][0].received) == 2)
    error = await error_of(await post(KEY), 429)
    assert error["type"] == "rate_limit_error" and "2 requests in flight" in error["message"]
    other = await post(OTHER_KEY)  # another key has its own allowance
    assert other.status == 200
    assert [r.status for r in await asyncio.gather(*first)] == [200, 200]
    assert (await post(KEY)).status == 200  # slots are given back when requests finish


async def test_streams_hold_their_slot_until_they_end(make_cluster):
    cluster = await make_cluster(api_keys=(KEY,), per_key_concurrency=1)
    await cluster.add_worker("w1", token_delay_s=0.1)
    stream = {**TEXT, "max_tokens": 4, "stream": True}
    resp = await cluster.client.post("/v1/completions", json=stream, headers=bearer(KEY))
    assert resp.status == 200
    busy = await cluster.client.post("/v1/completions", json=TEXT, headers=bearer(KEY))
    await error_of(busy, 429)
    await resp.read()
    assert (
        await cluster.client.post("/v1/completions", json=TEXT, headers=bearer(KEY))
    ).status == 200


async def test_oversized_body_is_413(make_cluster):
    cluster = await make_cluster(max_body_bytes=1000)
    await cluster.add_worker("w1")
    big = {**TEXT, "prompt": "x" * 2000}
    error = await error_of(await cluster.client.post("/v1/completions", json=big), 413)
    assert error["code"] == "request_too_large" and "1000 bytes" in error["message"]


async def test_oversized_chunked_body_is_413(make_cluster):
    cluster = await make_cluster(max_body_bytes=1000)

    async def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    resp = await cluster.client.post("/v1/completions", data=chunks())
    error = await error_of(resp, 413)
    assert error["code"] == "request_too_large"


async def test_max_tokens_over_the_cap_is_clamped(make_cluster):
    cluster = await make_cluster(max_tokens_cap=3)
    worker = await cluster.add_worker("w1")
    body = await (
        await cluster.client.post("/v1/completions", json={**TEXT, "max_tokens": 100000})
    ).json()
    assert (
        body["usage"]["completion_tokens"] == 3 and body["choices"][0]["finish_reason"] == "length"
    )
    chat = {k: v for k, v in CHAT.items() if k != "max_tokens"}  # chat default: rest of context
    resp = await cluster.client.post("/v1/chat/completions", json=chat)
    assert resp.status == 200
    assert [g.sampling.max_tokens for g in worker.received] == [3, 3]
    small = await cluster.client.post("/v1/completions", json={**TEXT, "max_tokens": 2})
    assert (await small.json())["usage"]["completion_tokens"] == 2
