"""A known field sent as null is the field left out, on every API: generated clients (Go, Rust,
Java, .NET, from OpenAI's document) send every unset field as null."""

from __future__ import annotations

import pytest

from router.api.anthropic.parse import MESSAGES_FIELDS
from router.api.openai.fields import CHAT_FIELDS, COMPLETION_FIELDS
from router.api.responses.fields import RESPONSES_FIELDS
from tests.unit.router.schema.openai_schema import REQUEST_FIELDS

MODEL = "tiny"
ASK = [{"role": "user", "content": "hi"}]
ENDPOINTS = {  # path: (the smallest body that generates, every field the endpoint knows)
    "/v1/chat/completions": ({"model": MODEL, "messages": ASK, "max_tokens": 2}, CHAT_FIELDS),
    "/v1/completions": ({"model": MODEL, "prompt": "hi", "max_tokens": 2}, COMPLETION_FIELDS),
    "/v1/responses": ({"model": MODEL, "input": "hi", "max_output_tokens": 2}, RESPONSES_FIELDS),
    "/v1/messages": ({"model": MODEL, "messages": ASK, "max_tokens": 2}, MESSAGES_FIELDS),
}


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster(context_length=4096)
    await cluster.add_worker("w1")
    return cluster


async def sent_to_worker(cluster, path: str, body: dict):
    """What the worker was asked for: (prompt token ids, sampling)."""
    worker, _ = cluster.workers["w1"]
    resp = await cluster.client.post(path, json=body)
    assert resp.status == 200, (body, await resp.text())
    last = worker.received[-1]
    return last.token_ids, last.sampling


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_we_know_every_field_of_openais_request_schema(path):
    assert REQUEST_FIELDS[path] <= ENDPOINTS[path][1]


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_each_known_field_as_null_is_the_field_left_out(cluster, path):
    body, known = ENDPOINTS[path]
    known = known | REQUEST_FIELDS.get(path, frozenset())  # ours, and OpenAI's document's
    absent = await sent_to_worker(cluster, path, body)
    for name in sorted(known - body.keys()):
        assert await sent_to_worker(cluster, path, body | {name: None}) == absent, name
    every = dict.fromkeys(known - body.keys())
    assert await sent_to_worker(cluster, path, body | every) == absent


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "moderation", {"input": True}),
        ("/v1/chat/completions", "functions", [{"name": "f"}]),
        ("/v1/chat/completions", "prompt_cache_retention", 24),  # a no-op's type is checked
        ("/v1/responses", "moderation", {"input": True}),
        ("/v1/responses", "conversation", "conv_1"),
        ("/v1/responses", "prompt_cache_options", "30m"),
    ],
)
async def test_a_value_is_still_refused_where_null_is_not(cluster, path, field, value):
    body, _ = ENDPOINTS[path]
    resp = await cluster.client.post(path, json=body | {field: value})
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == field


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_accepted_cache_options_answer(cluster, path):
    body, _ = ENDPOINTS[path]
    extra = {"prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "30m"}}
    extra = extra if path != "/v1/completions" else {}
    resp = await cluster.client.post(path, json=body | extra)
    assert resp.status == 200, await resp.text()


FUNCTION = {"name": "f", "description": None, "parameters": None, "strict": None}
NESTED = [  # (path, body with nested nulls, the same body with them left out)
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi", "name": None}],
            "tools": [{"type": "function", "function": FUNCTION}],
            "tool_choice": None,
            "stream_options": None,
        },
        {"messages": ASK, "tools": [{"type": "function", "function": {"name": "f"}}]},
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": "yo",
                    "tool_calls": None,
                    "refusal": None,
                    "name": None,
                },
                *ASK,
            ]
        },
        {"messages": [*ASK, {"role": "assistant", "content": "yo"}, *ASK]},
    ),
    (
        "/v1/chat/completions",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "description": None,
                    "strict": None,
                    "schema": {"type": "object"},
                },
            }
        },
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            }
        },
    ),
    (
        "/v1/responses",
        {
            "text": {"format": None, "verbosity": None},
            "reasoning": {"effort": None, "summary": None},
            "tools": [{"type": "function", **FUNCTION}],
        },
        {"tools": [{"type": "function", "name": "f"}]},
    ),
    (
        "/v1/messages",
        {
            "system": None,
            "metadata": {"user_id": None},
            "stop_sequences": None,
            "tools": None,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": None}]}
            ],
        },
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    ),
]


@pytest.mark.parametrize(("path", "nulls", "absent"), NESTED)
async def test_nested_nulls_are_left_out_too(cluster, path, nulls, absent):
    body, _ = ENDPOINTS[path]
    expected = await sent_to_worker(cluster, path, body | absent)
    assert await sent_to_worker(cluster, path, body | nulls) == expected


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/chat/completions", "messages"),
        ("/v1/completions", "prompt"),
        ("/v1/messages", "max_tokens"),
    ],
)
async def test_a_required_field_as_null_is_missing(cluster, path, field):
    body, _ = ENDPOINTS[path]
    resp = await cluster.client.post(path, json=body | {field: None})
    assert resp.status == 400
    assert field in (await resp.text())
