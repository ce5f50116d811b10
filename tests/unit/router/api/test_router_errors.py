"""Every error a client can cause: an OpenAI-style body and the right status, never a traceback."""

from __future__ import annotations

import asyncio

import openai
import pytest

MODEL = "tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1")
    return cluster


async def post_error(cluster, path, status, **kwargs):
    resp = await cluster.client.post(path, **kwargs)
    body = await resp.json()
    assert resp.status == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


BAD_CHAT = [
    ({**CHAT, "model": 5}, "model"),
    ({k: v for k, v in CHAT.items() if k != "model"}, "model"),
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": "hi"}, "messages"),
    ({**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0]",
    ),
    ({**CHAT, "max_tokens": 0}, "max_tokens"),
    ({**CHAT, "max_tokens": -3}, "max_tokens"),
    ({**CHAT, "max_tokens": "5"}, "max_tokens"),
    ({**CHAT, "max_tokens": 2.5}, "max_tokens"),
    ({**CHAT, "temperature": -1}, "temperature"),
    ({**CHAT, "temperature": "hot"}, "temperature"),
    ({**CHAT, "top_p": 0}, "top_p"),
    ({**CHAT, "stream": "yes"}, "stream"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**CHAT, "stop": 5}, "stop"),
    ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**CHAT, "n": 0}, "n"),
    ({**CHAT, "n": 17}, "n"),
    ({**CHAT, "n": "2"}, "n"),
    ({**CHAT, "logprobs": "yes"}, "logprobs"),
    ({**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({**CHAT, "top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
    ({**CHAT, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"-1": 1}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"5": 101}}, "logit_bias"),
    ({**CHAT, "logit_bias": {"5": "big"}}, "logit_bias"),
    ({**CHAT, "logit_bias": [5]}, "logit_bias"),
    ({**CHAT, "presence_penalty": 3}, "presence_penalty"),
    ({**CHAT, "frequency_penalty": "x"}, "frequency_penalty"),
    ({**CHAT, "repetition_penalty": 0}, "repetition_penalty"),
    ({**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ({**CHAT, "response_format": "json"}, "response_format"),
    ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
    (
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format",
    ),
]


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
async def test_bad_chat_fields_are_400_naming_the_field(cluster, body, param):
    error = await post_error(cluster, "/v1/chat/completions", 400, json=body)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**TEXT, "prompt": 5}, "prompt"),
        ({**TEXT, "prompt": ""}, "prompt"),
        ({**TEXT, "prompt": ["a", 5]}, "prompt"),
        ({**TEXT, "prompt": [1, 10**9]}, "prompt"),
        ({**TEXT, "echo": "yes"}, "echo"),
        ({**TEXT, "prompt_logprobs": 21}, "prompt_logprobs"),
        ({**TEXT, "max_tokens": 0}, "max_tokens"),
        ({**TEXT, "logprobs": 6}, "logprobs"),
        ({**TEXT, "logprobs": True}, "logprobs"),
    ],
)
async def test_bad_completion_fields_are_400(cluster, body, param):
    error = await post_error(cluster, "/v1/completions", 400, json=body)
    assert error["param"] == param


async def test_an_invalid_schema_is_a_400_naming_the_problem(cluster):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": bad, "strict": True}}
    error = await post_error(
        cluster, "/v1/chat/completions", 400, json={**CHAT, "response_format": fmt}
    )
    assert error["param"] == "response_format"
    assert "/nowhere" in error["message"]
    fmt["json_schema"]["schema"] = {"type": "objekt"}
    error = await post_error(
        cluster, "/v1/chat/completions", 400, json={**CHAT, "response_format": fmt}
    )
    assert "objekt" in error["message"]


async def test_malformed_json_and_non_object_bodies(cluster):
    error = await post_error(
        cluster,
        "/v1/chat/completions",
        400,
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert "not valid JSON" in error["message"]
    await post_error(cluster, "/v1/completions", 400, json=[1, 2])


async def test_unknown_model_is_404(cluster):
    error = await post_error(cluster, "/v1/chat/completions", 404, json={**CHAT, "model": "gpt-9"})
    assert error["code"] == "model_not_found" and "gpt-9" in error["message"]


async def test_prompt_over_the_context_length(cluster):
    error = await post_error(cluster, "/v1/completions", 400, json={**TEXT, "prompt": [60] * 256})
    assert error["code"] == "context_length_exceeded"
    error = await post_error(
        cluster, "/v1/completions", 400, json={**TEXT, "prompt": [60] * 200, "max_tokens": 100}
    )
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"


async def test_unknown_route_is_a_json_404(cluster):
    error = await post_error(cluster, "/v1/fine_tuning/jobs", 404, json={})
    assert error["code"] == "not_found"


async def test_no_worker_is_503_and_unhealthy(make_cluster):
    cluster = await make_cluster(worker_wait_s=0)  # past the start: no worker is a 503 at once
    assert (await cluster.client.get("/health")).status == 503
    error = await post_error(cluster, "/v1/chat/completions", 503, json=CHAT)
    assert error["code"] == "no_workers_available"
    with pytest.raises(openai.InternalServerError):
        await cluster.openai().completions.create(model=MODEL, prompt="hi", max_tokens=1)


async def test_overload_is_429(make_cluster):
    cluster = await make_cluster(max_pending_requests=1)
    await cluster.add_worker("w1", token_delay_s=0.05)
    first = asyncio.create_task(
        cluster.client.post("/v1/completions", json={**TEXT, "max_tokens": 10})
    )
    await cluster.wait_until(lambda: cluster.workers["w1"][0].received)
    error = await post_error(cluster, "/v1/completions", 429, json=TEXT)
    assert error["type"] == "rate_limit_error"
    assert (await first).status == 200
    assert (await cluster.client.post("/v1/completions", json=TEXT)).status == 200


async def test_worker_error_before_any_token_is_a_500(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1", error="out of KV blocks")
    error = await post_error(cluster, "/v1/completions", 500, json=TEXT)
    assert error["message"] == "out of KV blocks" and error["type"] == "server_error"
    error = await post_error(cluster, "/v1/chat/completions", 500, json={**CHAT, "stream": True})
    assert error["message"] == "out of KV blocks"
    # the worker's recent errors, for the fleet page: the last ones, with their time
    (worker,) = (await (await cluster.client.get("/v1/cluster")).json())["workers"]
    assert len(worker["errors"]) == 2 and worker["errors"][-1].endswith(" out of KV blocks")
    assert worker["kv_check_failures"] == 0


async def test_worker_error_mid_stream_is_an_error_event(make_cluster):
    cluster = await make_cluster()
    await cluster.add_worker("w1", error="device lost", error_after_tokens=3)
    stream = await cluster.openai().completions.create(
        model=MODEL, prompt="hi", max_tokens=10, stream=True
    )
    texts = []
    with pytest.raises(openai.APIError, match="device lost"):
        async for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts  # the tokens before the error were streamed


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,iVBORw0K"},
                            },
                        ],
                    }
                ],
            },
            "image_url",
        ),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"},
                        ],
                    }
                ],
            },
            "input_image",
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 2,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "iVBORw0K",
                                },
                            },
                        ],
                    }
                ],
            },
            "image",
        ),
    ],
)
async def test_an_image_to_a_text_only_model_gets_a_400_that_says_so(cluster, path, body, kind):
    resp = await cluster.client.post(path, json=body)
    text = await resp.text()
    assert resp.status == 400, text
    assert "model 'tiny' does not take images" in text
    assert path == "/v1/messages" or "image_input_unsupported" in text  # Anthropic's has no code
