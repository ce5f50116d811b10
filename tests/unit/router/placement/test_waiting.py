"""A request for a catalog model that is not loaded, over HTTP with a host agent on the real
ZeroMQ socket (a stand-in that starts nothing; the test starts the stand-in worker the host
was asked for): a streamed request keeps its connection with `: loading` comments, then
streams once the worker registers; a load that fails ends the stream with the cause; past
load_timeout_s a plain request gets a 503 with Retry-After. The admin API's keys."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from router.http import app_keys
from router.placement import demand as demand_module
from tests.conftest import MODEL_ID
from tests.support.fake_worker import FakeHost

CHAT = {"model": MODEL_ID, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def hosted(make_cluster, monkeypatch):
    """A router whose one model is in no worker, and a host agent that can load it."""
    monkeypatch.setattr(demand_module, "NOTE_EVERY_S", 0.2)
    made = []

    async def make(**overrides):
        cluster = await make_cluster(heartbeat_timeout_s=5.0, **overrides)
        host = FakeHost(cluster.zmq_endpoint, "host-a", 8 << 30, (MODEL_ID,))
        task = asyncio.create_task(host.run())
        made.append((host, task))
        await cluster.wait_until(lambda: cluster.app[app_keys.DEMAND].active)
        return cluster, host

    yield make
    for host, task in made:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        host.close()


async def first_start(cluster, host):
    await cluster.wait_until(lambda: host.starts(), timeout=5)
    return host.starts()[0]


async def test_a_streamed_request_waits_with_comments_then_streams(hosted):
    cluster, host = await hosted()
    response = await cluster.client.post("/v1/chat/completions", json=CHAT | {"stream": True})
    assert response.status == 200  # the headers went out while the model loads
    start = await first_start(cluster, host)
    assert start.model == MODEL_ID and start.estimate_bytes > 0
    comment = await asyncio.wait_for(response.content.readline(), 5)
    assert comment == f": loading {MODEL_ID}\n".encode()
    await cluster.add_worker(start.worker_id)  # the host's worker registers
    body = (await asyncio.wait_for(response.read(), 10)).decode()
    chunks = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert chunks and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert body.rstrip().endswith("data: [DONE]")


async def test_a_failed_load_ends_the_waiting_stream_with_its_cause(hosted):
    cluster, host = await hosted()
    response = await cluster.client.post("/v1/chat/completions", json=CHAT | {"stream": True})
    start = await first_start(cluster, host)
    assert (await asyncio.wait_for(response.content.readline(), 5)).startswith(b": loading")
    await host.exited(
        start.worker_id, MODEL_ID, "exit code 1: OSError: weights.safetensors: No such file"
    )
    body = (await asyncio.wait_for(response.read(), 10)).decode()
    error = next(json.loads(x[6:]) for x in body.splitlines() if x.startswith("data: {"))
    assert error["error"]["code"] == "model_load_failed"
    assert "weights.safetensors: No such file" in error["error"]["message"]
    again = await cluster.client.post("/v1/chat/completions", json=CHAT)  # at once, plain
    assert again.status == 503 and "No such file" in (await again.json())["error"]["message"]


async def test_a_load_that_takes_too_long_is_a_503_with_retry_after(hosted):
    cluster, host = await hosted(load_timeout_s=0.5)
    response = await cluster.client.post("/v1/chat/completions", json=CHAT)
    assert response.status == 503 and response.headers["Retry-After"] == "30"
    error = (await response.json())["error"]
    assert error["code"] == "model_loading" and "still loading" in error["message"]
    models = await (await cluster.client.get("/v1/models")).json()
    assert models["data"][0]["placement"]["state"] == "loading"


async def test_a_bad_keep_alive_is_a_400(hosted):
    cluster, _ = await hosted()
    response = await cluster.client.post("/v1/chat/completions", json=CHAT | {"keep_alive": "soon"})
    assert response.status == 400 and (await response.json())["error"]["param"] == "keep_alive"


async def test_the_admin_api_takes_its_own_keys(hosted):
    cluster, host = await hosted(admin_keys=("admin-secret",), api_keys=("client-key",))
    client = cluster.client
    plain = await client.post(
        f"/v1/admin/models/{MODEL_ID}/pin", headers={"Authorization": "Bearer client-key"}
    )
    assert plain.status == 401  # a client's key does not open it
    admin = {"Authorization": "Bearer admin-secret"}
    pinned = await client.post(f"/v1/admin/models/{MODEL_ID}/pin", headers=admin)
    assert pinned.status == 200 and (await pinned.json())["pinned"] is True
    loaded = await client.post(f"/v1/admin/models/{MODEL_ID}/load", headers=admin)
    assert loaded.status == 202 and (await loaded.json())["state"] == "loading"
    assert (await first_start(cluster, host)).model == MODEL_ID
    again = await client.post(f"/v1/admin/models/{MODEL_ID}/load", headers=admin)
    assert again.status == 409  # max_workers 1, one loading
    catalog = await (await client.get("/v1/admin/models", headers=admin)).json()
    assert catalog["hosts"][0]["id"] == "host-a" and catalog["models"][0]["id"] == MODEL_ID


async def test_without_admin_keys_the_admin_api_is_for_this_machine(hosted):
    cluster, _ = await hosted()
    assert (await cluster.client.get("/v1/admin/models")).status == 200  # the test client: loopback


@pytest.mark.parametrize(
    "path, body, expect",
    [
        (
            "/v1/messages",
            CHAT,
            'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"',
        ),
        (
            "/v1/responses",
            {"model": MODEL_ID, "input": "hi"},
            'event: error\ndata: {"type": "error", "code": "model_load_failed"',
        ),
    ],
)
async def test_a_failed_load_ends_each_apis_stream_in_its_own_shape(hosted, path, body, expect):
    cluster, host = await hosted()
    response = await cluster.client.post(path, json=body | {"stream": True})
    start = await first_start(cluster, host)
    assert (await asyncio.wait_for(response.content.readline(), 5)).startswith(b": loading")
    await host.exited(start.worker_id, MODEL_ID, "exit code 1: bad weights")
    text = (await asyncio.wait_for(response.read(), 10)).decode()
    assert text.lstrip().startswith(expect) and "bad weights" in text


TRACEBACK = """exit code 1: Traceback (most recent call last):
  File "/home/op/.venv/lib/python3.12/site-packages/mlx_lm/utils.py", line 160, in load_model
    weights.update(mx.load(wf))
                   ^^^^^^^^^^^
ValueError: [load_safetensors] Invalid json header length /srv/models/tiny/model.safetensors"""


async def test_a_failed_load_is_said_in_one_line_and_its_traceback_goes_to_the_admin_api(hosted):
    cluster, host = await hosted()
    response = await cluster.client.post("/v1/chat/completions", json=CHAT | {"stream": True})
    start = await first_start(cluster, host)
    assert (await asyncio.wait_for(response.content.readline(), 5)).startswith(b": loading")
    await host.exited(start.worker_id, MODEL_ID, TRACEBACK)
    await asyncio.wait_for(response.read(), 10)
    again = await cluster.client.post("/v1/chat/completions", json=CHAT)
    message = (await again.json())["error"]["message"]
    assert again.status == 503 and "\n" not in message and "/" not in message.split("'")[-1]
    assert message.endswith(
        "exit code 1: ValueError: [load_safetensors] Invalid json header length model.safetensors"
    )
    catalog = await (await cluster.client.get("/v1/admin/models")).json()
    assert catalog["models"][0]["failure_detail"] == TRACEBACK
    assert "\n" not in catalog["models"][0]["failure"]
