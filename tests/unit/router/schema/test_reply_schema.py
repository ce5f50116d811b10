"""Every reply body and stream event of chat, completions and Responses conforms to the
schema OpenAI publishes for it (tests/unit/router/schema/openai_schema.py), through the real
app with scripted stand-in workers: text, reasoning, tool calls, logprobs, n > 1, length,
worker errors."""

from __future__ import annotations

import json

import pytest

from router.api.openai.parse import parse_chat, parse_completion
from router.api.responses.parse import parse_responses
from router.http import app_keys
from tests.support.scripted import scripted_worker
from tests.unit.router.schema import openai_schema as oas

MODEL = "tiny"
ASK = [{"role": "user", "content": "weather in paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINK_AND_CALL = "<think>cold?</think>Checking. " + CALL


@pytest.fixture
async def cluster(make_cluster):
    return await make_cluster(context_length=4096)


async def post(cluster, path: str, body: dict):
    """The reply: a JSON body, or a stream's `data:` objects ([DONE] left out)."""
    resp = await cluster.client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    if not body.get("stream"):
        return await resp.json()
    text = await resp.text()
    assert text.rstrip().endswith("data: [DONE]") or path == "/v1/responses"
    return [
        json.loads(line[len("data: ") :])
        for block in text.split("\n\n")
        for line in block.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def conforms(instance, schema) -> None:
    assert oas.violations(instance, schema) == [], json.dumps(instance)[:2000]


async def script_chat(cluster, body: dict, reply: str, end_turn: bool = True) -> int:
    prompt = parse_chat({"model": MODEL, **body}, cluster.tokenizer, MODEL).prompt_ids
    _, n = await scripted_worker(cluster, cluster.tokenizer, prompt, reply, end_turn)
    return n


# ------------------------------------------------------------ the schemas themselves


def test_the_schemas_reject_the_defects_fuzzing_found():
    message = {"role": "assistant", "content": "hi"}  # no `refusal`
    assert any("refusal" in v for v in oas.violations(message, oas.CHAT_MESSAGE))
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [],
        "system_fingerprint": None,
    }
    assert oas.violations(body, oas.CHAT_COMPLETION) != []
    usage = {
        "input_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2,
    }
    assert any("cache_write_tokens" in v for v in oas.violations(usage, oas.RESPONSE_USAGE))
    event = {
        "type": "response.output_text.delta",
        "sequence_number": 0,
        "item_id": "i",
        "output_index": 0,
        "content_index": 0,
        "delta": "x",
    }
    assert any("logprobs" in v for v in oas.event_violations(event))
    assert oas.event_violations({"type": "response.unheard_of"}) != []


# ------------------------------------------------------------ chat


@pytest.mark.parametrize(
    ("reply", "finish"), [("Sunny, 18C.", "stop"), (THINK_AND_CALL, "tool_calls")]
)
async def test_chat_whole_reply(cluster, reply, finish):
    body = {"messages": ASK, "tools": [WEATHER]}
    n = await script_chat(cluster, body, reply)
    out = await post(cluster, "/v1/chat/completions", {"model": MODEL, **body, "max_tokens": n})
    conforms(out, oas.CHAT_COMPLETION)
    choice = out["choices"][0]
    assert choice["finish_reason"] == finish and choice["message"]["refusal"] is None
    assert "system_fingerprint" not in out


async def test_chat_whole_reply_with_logprobs_and_two_choices(cluster):
    await cluster.add_worker("w1")
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 3,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
    }
    out = await post(cluster, "/v1/chat/completions", body)
    conforms(out, oas.CHAT_COMPLETION)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert len(out["choices"][1]["logprobs"]["content"]) == 3


@pytest.mark.parametrize("reply", ["Sunny, 18C.", THINK_AND_CALL])
async def test_chat_stream_chunks(cluster, reply):
    body = {"messages": ASK, "tools": [WEATHER]}
    n = await script_chat(cluster, body, reply)
    chunks = await post(
        cluster,
        "/v1/chat/completions",
        {
            "model": MODEL,
            **body,
            "max_tokens": n,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
        },
    )
    for chunk in chunks:
        conforms(chunk, oas.CHAT_CHUNK)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == n
    assert all(c["usage"] is None for c in chunks[:-1])
    calls = [c for c in chunks[:-1] if c["choices"][0]["delta"].get("tool_calls")]
    assert len(calls) == (2 if CALL in reply else 0)  # the call's head, then its arguments


async def test_chat_stream_error_is_an_error_body(cluster):
    await cluster.add_worker("w1", error="worker fell over", error_after_tokens=1)
    events = await post(
        cluster,
        "/v1/chat/completions",
        {"model": MODEL, "messages": ASK, "max_tokens": 5, "stream": True},
    )
    for chunk in events[:-1]:
        conforms(chunk, oas.CHAT_CHUNK)
    conforms(events[-1], oas.ERROR_BODY)


# ------------------------------------------------------------ completions


@pytest.mark.parametrize("logprobs", [None, 0, 2])
async def test_completion_whole_reply(cluster, logprobs):
    await cluster.add_worker("w1")
    body = {"model": MODEL, "prompt": ["one", "two"], "max_tokens": 3, "logprobs": logprobs}
    out = await post(cluster, "/v1/completions", body)
    conforms(out, oas.COMPLETION)
    assert len(out["choices"]) == 2 and out["usage"]["completion_tokens"] == 6


async def test_completion_stream_chunks(cluster):
    body = {"model": MODEL, "prompt": "once upon"}
    ids = parse_completion(body, cluster.tokenizer, MODEL).prompt_ids
    _, n = await scripted_worker(cluster, cluster.tokenizer, ids, " a time", end_turn=False)
    chunks = await post(
        cluster,
        "/v1/completions",
        body
        | {
            "max_tokens": n,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": 1,
        },
    )
    for chunk in chunks:
        conforms(chunk, oas.COMPLETION_CHUNK)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == " a time"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == n
    assert all("usage" not in c for c in chunks[:-1])  # not null: left out


# ------------------------------------------------------------ responses

RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": WEATHER["function"]["parameters"],
}


async def script_responses(cluster, body: dict, reply: str, end_turn: bool = True) -> int:
    store = cluster.app[app_keys.RESPONSES]
    prompt = parse_responses({"model": MODEL, **body}, cluster.tokenizer, MODEL, None, store)
    _, n = await scripted_worker(cluster, cluster.tokenizer, prompt.prompt_ids, reply, end_turn)
    return n


@pytest.mark.parametrize(
    ("reply", "end_turn", "status"),
    [
        ("Sunny.", True, "completed"),
        (THINK_AND_CALL, True, "completed"),
        ("one two three four", False, "incomplete"),
    ],
)
async def test_responses_whole_reply(cluster, reply, end_turn, status):
    body = {"input": "weather?", "tools": [RESPONSES_TOOL], "instructions": "Be brief."}
    n = await script_responses(cluster, body, reply, end_turn)
    n = n if end_turn else n - 1
    out = await post(cluster, "/v1/responses", {"model": MODEL, **body, "max_output_tokens": n})
    conforms(out, oas.RESPONSE)
    assert (
        out["status"] == status and out["usage"]["input_tokens_details"]["cache_write_tokens"] == 0
    )
    assert "user" not in out
    got = await cluster.client.get(f"/v1/responses/{out['id']}")
    conforms(await got.json(), oas.RESPONSE)


async def test_responses_user_is_echoed_as_a_string(cluster):
    n = await script_responses(cluster, {"input": "hi"}, "hello")
    out = await post(
        cluster,
        "/v1/responses",
        {"model": MODEL, "input": "hi", "user": "u-1", "max_output_tokens": n},
    )
    conforms(out, oas.RESPONSE)
    assert out["user"] == "u-1"


async def test_responses_stream_events(cluster):
    body = {"input": "weather?", "tools": [RESPONSES_TOOL]}
    n = await script_responses(cluster, body, THINK_AND_CALL)
    events = await post(
        cluster, "/v1/responses", {"model": MODEL, **body, "max_output_tokens": n, "stream": True}
    )
    for event in events:
        assert oas.event_violations(event) == [], json.dumps(event)[:2000]
    types = {e["type"] for e in events}
    assert {
        "response.created",
        "response.in_progress",
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.done",
        "response.completed",
    } <= types
    assert "usage" not in events[0]["response"] and "usage" in events[-1]["response"]


async def test_responses_stream_failure(cluster):
    await cluster.add_worker("w1", error="worker fell over", error_after_tokens=1)
    events = await post(
        cluster,
        "/v1/responses",
        {"model": MODEL, "input": "hi", "max_output_tokens": 5, "stream": True},
    )
    for event in events:
        assert oas.event_violations(event) == [], json.dumps(event)[:2000]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] in oas.RESPONSE_ERROR_CODES
