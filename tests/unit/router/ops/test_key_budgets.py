"""Budgets per API key: requests and tokens per minute over a sliding window, 429 with
Retry-After, OpenAI's x-ratelimit-* headers, the keys-file format, usage per key in /metrics."""

from __future__ import annotations

import asyncio

import pytest

from router.http import app_keys
from router.http.api_keys import key_fingerprint
from router.http.budgets import Budget, KeyBudgets, OverBudget, duration
from router.store.redis_budgets import RedisLedger
from router.store.redis_client import connect
from router.store.windows import MemoryLedger
from shared.config.fleet import ConfigError, RouterSection, read_api_keys, read_key_budgets

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KEY, OTHER_KEY = "mlxf-budgeted-key", "mlxf-free-key"
RATE_HEADERS = [
    f"x-ratelimit-{what}-{kind}"
    for what in ("limit", "remaining", "reset")
    for kind in ("requests", "tokens")
]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(params=["memory", "redis"])
async def ledger(request):
    """Where the windows are kept: this process, or a real redis-server (every test below
    holds for both: the Lua scripts keep the same sliding window)."""
    if request.param == "memory":
        yield MemoryLedger()
        return
    client = connect(request.getfixturevalue("redis_url"))
    yield RedisLedger(client)
    await client.aclose()


async def test_requests_per_minute_is_a_sliding_window(ledger):
    clock = Clock()
    budgets = KeyBudgets({"k": Budget(rpm=2)}, clock=clock, ledger=ledger)
    await budgets.admit("k")  # t=0
    clock.now += 30
    assert (await budgets.admit("k"))["x-ratelimit-remaining-requests"] == "0"  # t=30
    clock.now += 15  # t=45: two in the last minute
    with pytest.raises(OverBudget) as refused:
        await budgets.admit("k")
    assert refused.value.status == 429 and refused.value.kind == "requests"
    assert refused.value.headers["Retry-After"] == "15"  # when t=0 leaves the window
    clock.now += 15.5  # t=60.5: the first left the window, the second (t=30) has not
    await budgets.admit("k")
    clock.now += 0.5
    with pytest.raises(OverBudget) as refused:
        await budgets.admit("k")
    assert refused.value.headers["Retry-After"] == "29"  # t=30 leaves at t=90
    assert await budgets.admit("other") == {}  # a key without a budget is never refused


async def test_tokens_per_minute_refuses_once_spent_and_reopens_as_they_expire(ledger):
    clock = Clock()
    budgets = KeyBudgets({}, Budget(tpm=100), clock=clock, ledger=ledger)
    await budgets.admit("k")
    await budgets.charge_tokens("k", 60)
    clock.now += 10
    await budgets.admit("k")  # 60 < 100: let in
    await budgets.charge_tokens("k", 50)
    headers = await budgets.headers("k")
    assert headers["x-ratelimit-limit-tokens"] == "100"
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"] == "1m0s"
    assert "x-ratelimit-limit-requests" not in headers  # no requests budget set
    clock.now += 45  # t=55: 110 tokens in the window
    with pytest.raises(OverBudget) as refused:
        await budgets.admit("k")
    assert refused.value.kind == "tokens" and refused.value.headers["Retry-After"] == "5"
    clock.now += 5  # t=60: the 60 left; 50 < 100
    assert (await budgets.admit("k"))["x-ratelimit-remaining-tokens"] == "50"


def test_reset_durations_are_written_as_openai_does():
    assert [duration(s) for s in (0.25, 1.5, 12, 60, 75)] == [
        "250ms",
        "1.5s",
        "12s",
        "1m0s",
        "1m15s",
    ]


def test_keys_file_lines_take_budgets_and_bare_keys_still_work(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nbare-key\nrich-key rpm=60 tpm=100000  # the CI\nhalf tpm=5\n")
    router = RouterSection(api_keys_file=keys)
    assert read_api_keys(router) == ("bare-key", "rich-key", "half")
    assert read_key_budgets(router) == {
        "bare-key": {},
        "rich-key": {"rpm": 60, "tpm": 100000},
        "half": {"tpm": 5},
    }
    keys.write_text("k rpm=fast\n")
    with pytest.raises(ConfigError, match="line 1.*rpm=fast"):
        read_key_budgets(router)


@pytest.fixture
async def budgeted(make_cluster):
    cluster = await make_cluster(
        api_keys=(KEY, OTHER_KEY), key_budgets={KEY: {"tpm": 5, "rpm": 100}}
    )
    await cluster.add_worker("w1")
    clock = Clock()
    cluster.app[app_keys.BUDGETS].clock = clock
    return cluster, clock


async def test_a_key_over_its_tokens_gets_429_while_another_key_is_served(budgeted):
    cluster, clock = budgeted
    client = cluster.client
    first = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(KEY))
    assert first.status == 200
    assert all(name in first.headers for name in RATE_HEADERS)
    assert first.headers["x-ratelimit-limit-tokens"] == "5"
    spent = (await first.json())["usage"]["total_tokens"]
    assert spent >= 5

    refused = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(KEY))
    body = await refused.json()
    assert refused.status == 429, body
    assert (
        body["error"]["type"] == "rate_limit_error"
        and "tokens per minute" in body["error"]["message"]
    )
    assert refused.headers["Retry-After"] == "60"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"

    other = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(OTHER_KEY))
    assert other.status == 200
    assert "x-ratelimit-limit-tokens" not in other.headers  # no budget, no headers

    stream = await client.post(
        "/v1/chat/completions", json=CHAT | {"stream": True}, headers=bearer(KEY)
    )
    assert stream.status == 429  # streams are refused the same way, before any chunk

    clock.now += 60  # the window moved past the first request's tokens
    again = await client.post(
        "/v1/chat/completions", json=CHAT | {"stream": True}, headers=bearer(KEY)
    )
    assert again.status == 200 and again.headers["x-ratelimit-limit-requests"] == "100"
    await again.read()

    metrics = await (await client.get("/metrics", headers=bearer(OTHER_KEY))).text()
    budgeted_id, free_id = key_fingerprint(KEY), key_fingerprint(OTHER_KEY)
    assert f'mlx_fleet_key_rate_limited_total{{key="{budgeted_id}",limit="tokens"}} 2.0' in metrics
    assert f'mlx_fleet_key_requests_total{{key="{budgeted_id}"}} 2.0' in metrics
    assert f'mlx_fleet_key_prompt_tokens_total{{key="{free_id}"}}' in metrics
    assert f'mlx_fleet_key_completion_tokens_total{{key="{budgeted_id}"}}' in metrics
    assert KEY not in metrics and OTHER_KEY not in metrics


async def test_a_stream_left_before_its_end_is_still_charged(make_cluster):
    """A client that drops a stream after its first chunk must not escape the budget: what was
    generated (and the prompt) is charged when the request ends, however it ends."""
    cluster = await make_cluster(api_keys=(KEY,), key_budgets={KEY: {"tpm": 100_000}})
    await cluster.add_worker("w1", token_delay_s=0.05)
    cluster.app[app_keys.BUDGETS].clock = Clock()
    body = CHAT | {"stream": True, "max_tokens": 50}
    response = await cluster.client.post("/v1/chat/completions", json=body, headers=bearer(KEY))
    assert response.status == 200
    await response.content.readline()  # the first event arrived: the reply is under way
    response.close()  # the client leaves mid-stream

    async def remaining() -> int:
        headers = await cluster.app[app_keys.BUDGETS].headers(key_fingerprint(KEY))
        return int(headers["x-ratelimit-remaining-tokens"])

    for _ in range(500):  # the handler charges as it ends, a moment after the client left
        if await remaining() < 100_000 - 1:
            break
        await asyncio.sleep(0.01)
    assert (
        100_000 - 60 < await remaining() < 100_000 - 1
    )  # the prompt and a few tokens, not a whole reply
