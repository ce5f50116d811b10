"""Hostile and malformed request bodies: always a 4xx with an error body, never a 5xx."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODEL = "tiny"
POST_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def cluster(make_cluster):
    # Hypothesis draws examples while the event loop is stopped: no heartbeats then.
    cluster = await make_cluster(heartbeat_timeout_s=600)
    await cluster.add_worker("w1")
    return cluster


async def post_raw(cluster, path: str, data: bytes):
    resp = await cluster.client.post(path, data=data, headers={"Content-Type": "application/json"})
    return resp.status, await resp.read()


def assert_client_error(status: int, raw: bytes) -> None:
    assert status < 500, raw[:500]
    if status >= 400:
        body = json.loads(raw)
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"]


def nested_lists(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


HOSTILE_BODIES = [
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in the json parser
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
    json.dumps({**CHAT, "x": nested_lists(65)}).encode(),  # 66 levels in all
    b'{"model":"tiny","messages":[{"role":"user","content":"\\ud800"}]}',  # lone surrogate
    b'{"model":"tiny","prompt":"a\\udfffb"}',
    b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"\\ud83d":1}',
    b'{"model":"tiny","prompt":"\\u12"}',  # truncated escape
    b'{"model":"tiny","prompt":"\xff\xfe"}',  # invalid UTF-8
    b"\xef\xbb\xbf{}",  # a BOM
    b'{"model":"tiny","prompt":"hi","temperature":NaN}',
    b'{"model":"tiny","prompt":"hi","temperature":Infinity}',
    b'{"model":"tiny","prompt":"hi","temperature":-Infinity}',
    b'{"model":"tiny","prompt":"hi","temperature":1e999}',
    b'{"model":"tiny","prompt":"hi","max_tokens":' + b"9" * 5000 + b"}",
    b'{"model":"tiny","prompt":"hi","max_tokens":' + b"9" * 30 + b"}",
    b'{"model":"tiny","prompt":"hi","top_k":99999999999999999999}',
    b'{"model":"tiny","prompt":"hi","seed":-99999999999999999999}',
    b'{"model":"tiny","prompt":[99999999999999999999]}',
    b"",
    b"null",
    b'"a string"',
    b"42",
    b"\x00\x01\x02",
]


@pytest.mark.parametrize("path", POST_PATHS)
async def test_hostile_bodies_are_400(cluster, path):
    for data in HOSTILE_BODIES:
        status, raw = await post_raw(cluster, path, data)
        assert 400 <= status < 500, (data[:80], raw[:300])
        assert_client_error(status, raw)


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "n",
    "tools",
    "tool_choice",
    "system",
    "stop_sequences",
    "chat_template_kwargs",
    "user",
    "metadata",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "response_format",
    "echo",
    "suffix",
    "best_of",
    "thinking",
    "prompt_logprobs",
]
MESSAGE_FIELDS = ["role", "content", "tool_calls", "tool_call_id", "name", "type"]


@st.composite
def wrong_shapes(draw):
    """A plausible request with one to three fields replaced by arbitrary JSON."""
    body = dict(CHAT) | {"prompt": "hi", "system": "be brief"}
    for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        body[name] = draw(JSON_VALUES)
    if draw(st.booleans()):
        message = {"role": "user", "content": "hi"}
        message[draw(st.sampled_from(MESSAGE_FIELDS))] = draw(JSON_VALUES)
        body["messages"] = [message]
    return body


@st.composite
def near_valid_tools(draw):
    """Tool requests right in shape but for one drawn value: reaches the tool code paths."""
    function = {
        "name": draw(st.sampled_from(["f", "get_weather", "", "a b", 5])),
        "parameters": draw(JSON_VALUES | st.just({"type": "object"})),
    }
    if draw(st.booleans()):
        function["description"] = draw(JSON_VALUES)
    call = {
        "id": draw(JSON_VALUES),
        "type": "function",
        "function": {"name": draw(st.sampled_from(["f", 3])), "arguments": draw(JSON_VALUES)},
    }
    body = dict(CHAT) | {
        "tools": [{"type": draw(st.sampled_from(["function", "other"])), "function": function}],
        "tool_choice": draw(
            st.sampled_from(
                [
                    "auto",
                    "none",
                    "required",
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "tool", "name": "f"},
                    {"type": "any"},
                ]
            )
        ),
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": draw(JSON_VALUES), "tool_calls": [call]},
            {"role": "tool", "tool_call_id": draw(JSON_VALUES), "content": draw(JSON_VALUES)},
        ],
    }
    # the same in Anthropic's shape, for /v1/messages
    body["system"] = draw(JSON_VALUES | st.just([{"type": "text", "text": "x"}]))
    return body


FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@FUZZ
@given(body=wrong_shapes(), path=st.sampled_from(POST_PATHS))
async def test_valid_json_of_wrong_shapes_is_never_5xx(cluster, body, path):
    status, raw = await post_raw(cluster, path, json.dumps(body).encode())
    assert_client_error(status, raw)


JSONISH = st.lists(
    st.sampled_from(
        [
            b"{",
            b"}",
            b"[",
            b"]",
            b'"',
            b":",
            b",",
            b"\\u",
            b"d800",
            b"\\",
            b"1e999",
            b"-",
            b"NaN",
            b"null",
            b"true",
            b'"model"',
            b'"tiny"',
            b'"messages"',
            b'"prompt"',
            b"\xff",
            b"\xc3",
            b"0",
            b"9999999999999999999999",
            b" ",
            b"\x00",
        ]
    ),
    max_size=40,
).map(b"".join)


@FUZZ
@given(data=JSONISH, path=st.sampled_from(POST_PATHS))
async def test_jsonish_bytes_are_never_5xx(cluster, data, path):
    status, raw = await post_raw(cluster, path, data)
    assert_client_error(status, raw)


@FUZZ
@given(body=near_valid_tools(), path=st.sampled_from(POST_PATHS))
async def test_near_valid_tool_requests_are_never_5xx(cluster, body, path):
    status, raw = await post_raw(cluster, path, json.dumps(body).encode())
    assert_client_error(status, raw)


@FUZZ
@given(
    content=st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "tool_use", "tool_result", "image"])},
            optional={
                "text": JSON_VALUES,
                "id": JSON_VALUES,
                "name": JSON_VALUES,
                "input": JSON_VALUES,
                "tool_use_id": JSON_VALUES,
                "content": JSON_VALUES,
            },
        ),
        max_size=3,
    ),
    role=st.sampled_from(["user", "assistant"]),
)
async def test_anthropic_content_blocks_are_never_5xx(cluster, content, role):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": role, "content": content}]}
    status, raw = await post_raw(cluster, "/v1/messages", json.dumps(body).encode())
    assert_client_error(status, raw)
