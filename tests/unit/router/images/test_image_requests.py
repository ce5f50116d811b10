"""Requests with images through a router on a tiny vision model and stand-in workers: what the
workers are sent, where, and the 4xx every malformed or unserved image gets."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shared.models.vision import IMAGE_KEY_BASE
from tests.unit.router.images.conftest import VLM, chat_image, data_url, png


async def error_of(cluster, path: str, body: dict, status: int = 400) -> dict:
    resp = await cluster.client.post(path, json=body)
    reply = await resp.json()
    assert resp.status == status, reply
    return reply["error"]


async def test_a_chat_image_reaches_a_vision_worker_as_keys_and_its_file(vision_cluster):
    cluster = await vision_cluster()
    worker = await cluster.add_worker("w", model_id=VLM, vision=True)
    reply = await cluster.openai().chat.completions.create(**chat_image(png()))
    assert reply.choices[0].message.content is not None
    (msg,) = worker.received
    (image,) = msg.images
    assert image.data == png() and image.tokens == cluster.tokenizer.vision.tokens_per_image
    assert sum(t >= IMAGE_KEY_BASE for t in msg.token_ids) == image.tokens
    assert reply.usage.prompt_tokens == len(msg.token_ids)  # the expanded prompt


async def test_a_repeated_image_goes_to_the_worker_holding_it(vision_cluster):
    cluster = await vision_cluster()
    a = await cluster.add_worker("a", model_id=VLM, vision=True)
    b = await cluster.add_worker("b", model_id=VLM, vision=True)
    api = cluster.openai()
    long_text = "Describe every detail of this picture, please. " * 4
    await api.chat.completions.create(**chat_image(png(seed=1), text=long_text))
    first = a if a.received else b
    for _ in range(3):
        await api.chat.completions.create(**chat_image(png(seed=1), text=long_text))
    assert len(first.received) == 4


async def test_workers_without_the_vision_extra_get_a_400_saying_how(vision_cluster):
    cluster = await vision_cluster()
    note = "mlx-vlm is not installed"
    await cluster.add_worker("w", model_id=VLM, vision=False, vision_note=note)
    error = await error_of(cluster, "/v1/chat/completions", chat_image(png()))
    assert error["code"] == "image_input_unsupported"
    assert note in error["message"] and "pip install 'mlx-fleet[vision]'" in error["message"]
    assert error["param"] == "messages[0].content[1]"


async def test_image_jobs_go_only_to_vision_workers(vision_cluster):
    cluster = await vision_cluster()
    text_only = await cluster.add_worker("t", model_id=VLM, vision=False)
    seeing = await cluster.add_worker("v", model_id=VLM, vision=True)
    api = cluster.openai()
    for seed in range(4):
        await api.chat.completions.create(**chat_image(png(seed=seed)))
    assert len(seeing.received) == 4 and not text_only.received
    await api.chat.completions.create(
        model=VLM, max_tokens=2, messages=[{"role": "user", "content": "text goes anywhere"}]
    )


async def test_a_moved_request_carries_its_images(vision_cluster):
    cluster = await vision_cluster()
    first = await cluster.add_worker("a", model_id=VLM, vision=True, token_delay_s=0.05)
    stream = await cluster.openai().chat.completions.create(
        **chat_image(png()) | {"max_tokens": 12, "stream": True}
    )
    await anext(stream)
    second = await cluster.add_worker("b", model_id=VLM, vision=True)
    await cluster.kill_worker("a")
    chunks = [c async for c in stream]
    assert chunks and len(second.received) == 1
    moved = second.received[0]
    assert moved.images == first.received[0].images
    assert moved.token_ids[: len(first.received[0].token_ids)] == first.received[0].token_ids


async def test_disaggregated_prefill_sends_the_images_on_both_legs(vision_cluster):
    cluster = await vision_cluster(prefill_min_tokens=0)
    role = {"model_id": VLM, "vision": True}
    p = await cluster.add_worker("p", role="prefill", kv_endpoint="tcp://127.0.0.1:19101", **role)
    d = await cluster.add_worker("d", role="decode", kv_endpoint="tcp://127.0.0.1:19102", **role)
    await cluster.openai().chat.completions.create(**chat_image(png(), text="x " * 20))
    assert p.received[0].prefill_only and p.received[0].images
    assert d.received[0].images == p.received[0].images


async def test_anthropic_and_responses_images(vision_cluster):
    cluster = await vision_cluster()
    worker = await cluster.add_worker("w", model_id=VLM, vision=True)
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(png()).decode(),
        },
    }
    body = {
        "model": VLM,
        "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, block]}],
    }
    resp = await cluster.client.post("/v1/messages", json=body)
    assert resp.status == 200, await resp.text()
    part = {"type": "input_image", "image_url": data_url(png())}
    body = {"model": VLM, "max_output_tokens": 3, "input": [{"role": "user", "content": [part]}]}
    resp = await cluster.client.post("/v1/responses", json=body)
    assert resp.status == 200, await resp.text()
    follow = {
        "model": VLM,
        "max_output_tokens": 3,
        "input": "and its colour?",
        "previous_response_id": (await resp.json())["id"],
    }
    resp = await cluster.client.post("/v1/responses", json=follow)
    assert resp.status == 200, await resp.text()
    assert [len(m.images) for m in worker.received] == [1, 1, 1]


async def test_tokenize_and_count_tokens_show_the_expanded_prompt(vision_cluster):
    cluster = await vision_cluster()
    body = chat_image(png())
    del body["max_tokens"]
    resp = await cluster.client.post("/tokenize", json=body)
    tokens = (await resp.json())["tokens"]
    spec = cluster.tokenizer.vision
    assert tokens.count(spec.image_token_id) == spec.tokens_per_image
    assert max(tokens) < IMAGE_KEY_BASE  # real ids, never keys


async def test_models_and_cluster_say_who_takes_images(vision_cluster):
    cluster = await vision_cluster()
    await cluster.add_worker("w", model_id=VLM, vision=True)
    models = await (await cluster.client.get("/v1/models")).json()
    assert models["data"][0]["input_modalities"] == ["text", "image"]
    workers = (await (await cluster.client.get("/v1/cluster")).json())["workers"]
    assert workers[0]["vision"] is True


async def test_a_text_model_lists_text_only(make_cluster):
    cluster = await make_cluster()
    models = await (await cluster.client.get("/v1/models")).json()
    assert models["data"][0]["input_modalities"] == ["text"]


# ------------------------------------------------------------ limits and malformed images


def with_url(url: str) -> dict:
    body = chat_image(png())
    body["messages"][0]["content"][1]["image_url"]["url"] = url
    return body


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (with_url("data:image/png;base64,@@@@"), "invalid_image"),
        (with_url(data_url(b"plain text, not a picture")), "invalid_image"),
        (with_url("https://example.com/cat.png"), "image_url_not_allowed"),
        (with_url("data:image/png;base64,"), "invalid_image"),
    ],
)
async def test_malformed_images_are_400s_with_an_error_body(vision_cluster, body, code):
    cluster = await vision_cluster()
    await cluster.add_worker("w", model_id=VLM, vision=True)
    error = await error_of(cluster, "/v1/chat/completions", body)
    assert error["code"] == code and error["param"] == "messages[0].content[1].image_url.url"


async def test_too_many_images_and_too_many_bytes(vision_cluster):
    cluster = await vision_cluster(max_images=2, max_request_image_bytes=3 * len(png()) // 2)
    await cluster.add_worker("w", model_id=VLM, vision=True)
    body = chat_image(png(seed=1))
    body["messages"][0]["content"] += [
        chat_image(png(seed=s))["messages"][0]["content"][1] for s in (2, 3)
    ]
    error = await error_of(cluster, "/v1/chat/completions", body)
    assert error["code"] == "too_many_images" and error["param"] == "messages[0].content[3]"
    body["messages"][0]["content"].pop()
    error = await error_of(cluster, "/v1/chat/completions", body)
    assert error["code"] == "image_too_large" and "max_request_image_bytes" in error["message"]


async def test_a_pixel_bomb_and_a_large_file_are_refused(vision_cluster):
    cluster = await vision_cluster(max_image_pixels=1000, max_image_bytes=100_000)
    await cluster.add_worker("w", model_id=VLM, vision=True)
    error = await error_of(cluster, "/v1/chat/completions", chat_image(png(40, 60)))
    assert error["code"] == "image_too_large" and "max_image_pixels" in error["message"]
    error = await error_of(cluster, "/v1/chat/completions", chat_image(png(200, 200)))
    assert error["code"] == "image_too_large" and "max_image_bytes" in error["message"]


async def test_anthropic_errors_come_in_its_shape(vision_cluster):
    cluster = await vision_cluster()
    await cluster.add_worker("w", model_id=VLM, vision=True)
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "%%%"},
    }
    body = {"model": VLM, "max_tokens": 3, "messages": [{"role": "user", "content": [block]}]}
    resp = await cluster.client.post("/v1/messages", json=body)
    reply = await resp.json()
    assert resp.status == 400 and reply["type"] == "error"
    assert "not valid base64" in reply["error"]["message"]


# ------------------------------------------------------------ fetching image URLs


@pytest.fixture
async def image_server():
    async def image(request):
        return web.Response(body=png(), content_type="image/png")

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=png())

    async def big(request):
        return web.Response(body=b"\0" * 300_000, content_type="image/png")

    app = web.Application()
    app.router.add_get("/cat.png", image)
    app.router.add_get("/slow.png", slow)
    app.router.add_get("/big.png", big)
    server = TestServer(app)
    await server.start_server()
    yield lambda path: str(server.make_url(path))
    await server.close()


async def test_fetched_urls_when_the_operator_allows_them(vision_cluster, image_server):
    cluster = await vision_cluster(
        image_fetch=True, image_fetch_timeout_s=0.5, max_image_bytes=200_000
    )
    worker = await cluster.add_worker("w", model_id=VLM, vision=True)
    reply = await cluster.openai().chat.completions.create(**with_url(image_server("/cat.png")))
    assert reply.usage.prompt_tokens and worker.received[0].images[0].data == png()
    for path, code, words in [
        ("/missing.png", "image_fetch_failed", "HTTP 404"),
        ("/slow.png", "image_fetch_failed", "within 0.5 s"),
        ("/big.png", "image_too_large", "max_image_bytes"),
    ]:
        error = await error_of(cluster, "/v1/chat/completions", with_url(image_server(path)))
        assert error["code"] == code and words in error["message"], error
