"""Requests that wait instead of failing, over HTTP with stand-in workers: one whose worker is
lost before its first token goes to another worker (a static model) or back to placement (a
catalog model, with `: loading` comments when streamed); one that arrives while its model's
workers are still starting waits for them, and /health says "starting" meanwhile."""

from __future__ import annotations

import asyncio
import json

import pytest

from router.placement import demand as demand_module
from tests.conftest import MODEL_ID
from tests.unit.router.placement.test_waiting import CHAT, first_start, hosted  # noqa: F401

STREAM = CHAT | {"stream": True}


def streamed_chunks(body: str) -> list[dict]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


@pytest.fixture(autouse=True)
def often_noted(monkeypatch):
    monkeypatch.setattr(demand_module, "NOTE_EVERY_S", 0.2)


async def test_a_request_waits_for_workers_still_starting(make_cluster):
    cluster = await make_cluster(worker_wait_s=30)
    health = await cluster.client.get("/health")
    assert health.status == 503 and (await health.json())["status"] == "starting"
    whole = asyncio.ensure_future(cluster.client.post("/v1/chat/completions", json=CHAT))
    streamed = await cluster.client.post("/v1/chat/completions", json=STREAM)
    assert streamed.status == 200  # its headers went out while it waits
    comment = await asyncio.wait_for(streamed.content.readline(), 5)
    assert comment == f": loading {MODEL_ID}\n".encode()
    await cluster.add_worker("late")
    body = (await asyncio.wait_for(streamed.read(), 10)).decode()
    assert streamed_chunks(body)[-1]["choices"][0]["finish_reason"] == "length"
    reply = await asyncio.wait_for(whole, 10)
    assert reply.status == 200 and (await reply.json())["choices"][0]["message"]["content"]
    health = await cluster.client.get("/health")
    assert health.status == 200 and (await health.json())["status"] == "ok"


async def test_a_request_whose_worker_is_lost_before_its_first_token_goes_to_the_next(
    make_cluster,
):
    cluster = await make_cluster(worker_wait_s=30)
    stuck = await cluster.add_worker("stuck", silent=True)
    whole = asyncio.ensure_future(cluster.client.post("/v1/chat/completions", json=CHAT))
    await cluster.wait_until(lambda: stuck.received)
    await cluster.kill_worker("stuck")  # lost by its silence, with no other worker up
    await asyncio.sleep(0.8)  # past heartbeat_timeout_s: the request now waits for one
    assert not whole.done()
    await cluster.add_worker("next")
    reply = await asyncio.wait_for(whole, 10)
    assert reply.status == 200, await reply.text()
    assert (await reply.json())["choices"][0]["finish_reason"] == "length"


async def test_after_its_first_token_a_lost_stream_ends_with_an_error_event(make_cluster):
    cluster = await make_cluster(worker_wait_s=30)
    await cluster.add_worker("only", token_delay_s=0.05)
    response = await cluster.client.post("/v1/chat/completions", json=STREAM | {"max_tokens": 200})
    assert (await asyncio.wait_for(response.content.readline(), 5)).startswith(b"data: {")
    await cluster.kill_worker("only")
    body = (await asyncio.wait_for(response.read(), 10)).decode()
    assert response.status == 200 and streamed_chunks(body)[-1]["error"]["code"] == (
        "generation_failed"
    )


async def test_a_catalog_request_whose_worker_is_lost_is_placed_again(hosted):  # noqa: F811
    cluster, host = await hosted()
    response = await cluster.client.post("/v1/chat/completions", json=STREAM)
    start = await first_start(cluster, host)
    worker = await cluster.add_worker(start.worker_id, silent=True)
    await cluster.wait_until(lambda: worker.received)
    await cluster.kill_worker(start.worker_id)  # its host went with it
    await cluster.wait_until(lambda: len(host.starts()) == 2, timeout=10)
    again = host.starts()[1]
    assert again.model == MODEL_ID and again.worker_id != start.worker_id
    await cluster.add_worker(again.worker_id)
    body = (await asyncio.wait_for(response.read(), 10)).decode()
    assert ": loading" in body and "error" not in body
    assert streamed_chunks(body)[-1]["choices"][0]["finish_reason"] == "length"
