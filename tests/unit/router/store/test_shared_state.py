"""Two routers on one Redis (`state_url`) are one router to a client: a conversation stored
through either continues through the other, and a key's budget is spent once across both."""

from __future__ import annotations

import openai
import pytest

from router.http import app_keys
from router.store.redis_responses import RedisResponses
from tests.support.scripted import scripted_worker
from tests.unit.router.responses.conftest import MODEL, prompt_of

KEY = "mlxf-shared-key-0123"


@pytest.fixture
def two_routers(make_cluster, redis_url):
    async def make(rpm: int = 100):
        options = {"state_url": redis_url, "api_keys": (KEY,), "key_budgets": {KEY: {"rpm": rpm}}}
        return [await make_cluster(context_length=4096, **options) for _ in range(2)]

    return make


def client_of(cluster) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=cluster.base_url(), api_key=KEY, max_retries=0)


async def test_a_conversation_continues_on_the_other_router(two_routers):
    a, b = await two_routers()
    assert isinstance(a.app[app_keys.RESPONSES], RedisResponses)  # the default with state_url
    owner = a.app[app_keys.API_KEYS].identify(KEY)
    first = {"input": "hi", "max_output_tokens": 20}
    await scripted_worker(a, a.tokenizer, await prompt_of(a, first, owner), "Hello.")
    async with client_of(a) as via_a, client_of(b) as via_b:
        resp = await via_a.responses.create(model=MODEL, **first)
        assert (await via_b.responses.retrieve(resp.id)).output_text == "Hello."
        turn = {"input": "and?", "previous_response_id": resp.id, "max_output_tokens": 20}
        # b builds the prompt from what a stored: a's turn, then this one
        prompt = await prompt_of(b, turn, owner)
        assert len(prompt) > len(await prompt_of(b, {"input": "and?"}, owner))
        await scripted_worker(b, b.tokenizer, prompt, "Bye.")
        second = await via_b.responses.create(model=MODEL, stream=False, **turn)
        assert second.output_text == "Bye."
        assert (await via_a.responses.retrieve(second.id)).output_text == "Bye."
        # streamed: kept before its last event goes out, so the other router has it at once
        third = {"input": "so", "previous_response_id": second.id, "max_output_tokens": 20}
        await scripted_worker(b, b.tokenizer, await prompt_of(b, third, owner), "End.")
        async with await via_b.responses.create(model=MODEL, stream=True, **third) as events:
            done = [e async for e in events if e.type == "response.completed"]
        assert (await via_a.responses.retrieve(done[0].response.id)).output_text == "End."
        await via_a.responses.delete(resp.id)  # a delete through one is seen by the other
        with pytest.raises(openai.NotFoundError):
            await via_b.responses.retrieve(resp.id)


async def test_a_key_spends_one_budget_across_both_routers(two_routers):
    a, b = await two_routers(rpm=4)
    for cluster in (a, b):
        await cluster.add_worker("w1")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {KEY}"}
    remaining = []
    for cluster in (a, b, a, b):
        reply = await cluster.client.post("/v1/chat/completions", json=chat, headers=headers)
        assert reply.status == 200
        remaining.append(reply.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["3", "2", "1", "0"]  # each router counts the other's requests
    for cluster in (a, b):
        refused = await cluster.client.post("/v1/chat/completions", json=chat, headers=headers)
        assert refused.status == 429 and int(refused.headers["Retry-After"]) > 0


async def test_an_unreachable_state_server_is_a_503_not_a_traceback(make_cluster, redis_server):
    url = redis_server.url.replace(str(redis_server.port), "1")  # nothing listens on port 1
    cluster = await make_cluster(state_url=url)
    reply = await cluster.client.get("/v1/responses/resp_x")
    body = await reply.json()
    assert reply.status == 503 and body["error"]["code"] == "state_unavailable"
    assert "Redis" in body["error"]["message"]
