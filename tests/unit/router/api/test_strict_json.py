"""JSON from outside, read strictly everywhere: request bodies, tool-call arguments in a chat
history, and the tool calls a model writes (a hostile prompt can make it write anything)."""

from __future__ import annotations

import json

import pytest

from router.api.openai.parse import parse_chat
from router.chat.tool_parsers import parse_tool_calls
from router.text import strict_json
from tests.support.scripted import scripted_worker

MODEL = "tiny"
CONTEXT = 4096
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "hi"}]
# Past the C scanner's recursion limit (~1000): json.loads raises RecursionError, not ValueError.
TOO_DEEP_FOR_PYTHON = "[" * 1500 + "]" * 1500
HOSTILE_ARGUMENTS = [
    (TOO_DEEP_FOR_PYTHON, "nested more than 64"),
    ('{"a": NaN}', "NaN"),
    ('{"a": -Infinity}', "-Infinity"),
    ('{"a": "\\ud800"}', "surrogate"),
    ('{"a": ' + "9" * 30 + "}", "64-bit"),
    ('{"a": 1e999}', "too large"),
    ("{oops", "not valid JSON"),
]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_limit_is_exact():
    assert strict_json.loads(nested(strict_json.MAX_NESTING)) is not None
    with pytest.raises(strict_json.StrictJsonError, match="nested more than 64"):
        strict_json.loads(nested(strict_json.MAX_NESTING + 1))


@pytest.mark.parametrize(("text", "reason"), HOSTILE_ARGUMENTS)
def test_loads_refuses_with_the_reason(text, reason):
    with pytest.raises(strict_json.StrictJsonError, match=reason):
        strict_json.loads(text)


def test_loads_keeps_ordinary_json():
    text = '{"a": [1, -2.5, "é\\u00e9", null, true], "b": {"c": 9223372036854775807}}'
    assert strict_json.loads(text) == json.loads(text)


@pytest.fixture
async def cluster(make_cluster):
    cluster = await make_cluster(context_length=CONTEXT)
    await cluster.add_worker("w1")
    return cluster


@pytest.mark.parametrize(("arguments", "reason"), HOSTILE_ARGUMENTS)
async def test_hostile_history_arguments_are_400(cluster, arguments, reason):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    body = {"model": MODEL, "messages": messages, "tools": [TOOL], "max_tokens": 2}
    resp = await cluster.client.post("/v1/chat/completions", json=body)
    assert resp.status == 400, await resp.text()
    error = (await resp.json())["error"]
    assert error["param"] == "messages[1].tool_calls[0]"
    assert "function.arguments" in error["message"] and reason in error["message"]


HOSTILE_CALLS = [
    ("hermes", "<tool_call>" + TOO_DEEP_FOR_PYTHON + "</tool_call>"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": Infinity}"}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "\\udc00"}}</tool_call>'),
    ("llama3", '{"name": "f", "parameters": ' + TOO_DEEP_FOR_PYTHON + "}"),
    ("mistral", "[TOOL_CALLS]" + TOO_DEEP_FOR_PYTHON),
]


@pytest.mark.parametrize(("family", "text"), HOSTILE_CALLS)
def test_hostile_model_calls_are_plain_content(family, text):
    parsed = parse_tool_calls(family, text)
    assert parsed.calls == () and parsed.content == text


@pytest.mark.parametrize("stream", [False, True])
async def test_deep_call_from_the_model_is_content_not_a_500(make_cluster, stream):
    cluster = await make_cluster(context_length=CONTEXT)

    tokenizer = cluster.tokenizer
    body = {"model": MODEL, "messages": ASK, "tools": [TOOL]}
    prompt = parse_chat(body, tokenizer, MODEL).prompt_ids
    reply = "<tool_call>" + TOO_DEEP_FOR_PYTHON + "</tool_call>"
    _, n = await scripted_worker(cluster, tokenizer, prompt, reply)
    client = cluster.openai()
    if stream:
        chunks = [
            c async for c in await client.chat.completions.create(**body, max_tokens=n, stream=True)
        ]
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert not any(d.tool_calls for d in deltas)
        assert "".join(d.content or "" for d in deltas) == reply
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        resp = await client.chat.completions.create(**body, max_tokens=n)
        assert resp.choices[0].message.tool_calls is None
        assert resp.choices[0].message.content == reply
        assert resp.choices[0].finish_reason == "stop"
