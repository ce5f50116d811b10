"""/v1/messages through the official anthropic SDK, with scripted stand-in workers."""

from __future__ import annotations

import anthropic
import pytest

from router.api.anthropic.parse import parse_messages_request
from tests.support.scripted import scripted_worker

MODEL = "tiny"
CONTEXT = 4096
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ASK = [{"role": "user", "content": "weather in paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
async def cluster(make_cluster):
    return await make_cluster(context_length=CONTEXT)


@pytest.fixture
def sdk(cluster):
    clients = []

    def make(**options) -> anthropic.AsyncAnthropic:
        api = anthropic.AsyncAnthropic(
            base_url=str(cluster.client.make_url("")), max_retries=0, **options
        )
        clients.append(api)
        return api

    return make


async def scripted(cluster, body: dict, reply: str, end_turn: bool = True):
    tokenizer = cluster.tokenizer
    prompt = parse_messages_request({"model": MODEL, **body}, tokenizer, MODEL).prompt_ids
    return await scripted_worker(cluster, tokenizer, prompt, reply, end_turn)


async def test_text_reply_with_system_prompt(cluster, sdk):
    body = {"messages": ASK, "system": "Be brief.", "max_tokens": 50}
    worker, n = await scripted(cluster, body, "Sunny, 18C.")
    msg = await sdk(api_key="none").messages.create(model=MODEL, **body)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Sunny, 18C."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens == len(worker.received[0].token_ids)
    assert msg.usage.output_tokens == n and msg.usage.cache_read_input_tokens == 0
    prompt = cluster.tokenizer.decode(worker.received[0].token_ids)
    assert prompt.startswith("system\nBe brief.")  # <|im_start|> is special: not decoded


async def test_max_tokens_and_stop_sequence(cluster, sdk):
    body = {"messages": ASK, "max_tokens": 3}
    await scripted(cluster, body, "one two three four five", end_turn=False)
    msg = await sdk(api_key="none").messages.create(model=MODEL, **body)
    assert msg.stop_reason == "max_tokens"
    body = {"messages": ASK, "max_tokens": 40, "stop_sequences": ["three"]}
    await scripted(cluster, body, "one two three four five")
    msg = await sdk(api_key="none").messages.create(model=MODEL, **body)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "three"
    assert msg.content[0].text == "one two "


async def test_tool_use_whole_and_round_trip_history(cluster, sdk):
    body = {"messages": ASK, "max_tokens": 200, "tools": [WEATHER]}
    await scripted(cluster, body, "Checking. " + CALL)
    msg = await sdk(api_key="none").messages.create(model=MODEL, **body)
    assert msg.stop_reason == "tool_use"
    text, use = msg.content
    assert text.type == "text" and text.text == "Checking."
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C"}],
        },
    ]
    body = {"messages": history, "max_tokens": 50, "tools": [WEATHER]}
    worker, _ = await scripted(cluster, body, "It is 18C.")
    msg = await sdk(api_key="none").messages.create(model=MODEL, **body)
    assert msg.content[0].text == "It is 18C." and msg.stop_reason == "end_turn"
    prompt = cluster.tokenizer.decode(worker.received[0].token_ids)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n18C\n</tool_response>" in prompt


async def test_streaming_events(cluster, sdk):
    body = {"messages": ASK, "max_tokens": 200, "tools": [WEATHER]}
    await scripted(cluster, body, "<think>cold?</think>Checking. " + CALL)
    api = sdk(api_key="none")
    async with api.messages.stream(model=MODEL, **body) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "message_delta" in types
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert types.count("content_block_stop") == 3
    json_deltas = [
        e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json_deltas and json_deltas[0].index == 2
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "cold?" and final.content[1].text == "Checking. "
    assert final.content[2].input == {"city": "Paris"} and final.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"messages": ASK}, 400),  # no max_tokens
        ({"messages": ASK, "max_tokens": "5"}, 400),
        ({"messages": [], "max_tokens": 5}, 400),
        ({"messages": [{"role": "tool", "content": "x"}], "max_tokens": 5}, 400),
        (
            {
                "messages": [*ASK, {"role": "system", "content": [{"type": "image"}]}],
                "max_tokens": 5,
            },
            400,
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 5}, 400),
        ({"messages": ASK, "max_tokens": 5, "system": 5}, 400),
        ({"messages": ASK, "max_tokens": 5, "temperature": 1.5}, 400),
        ({"messages": ASK, "max_tokens": 5, "tools": [{"name": "f"}]}, 400),
        ({"messages": ASK, "max_tokens": 5, "tool_choice": {"type": "magic"}}, 400),
        ({"messages": ASK, "max_tokens": 5, "stop_sequences": "x"}, 400),
        ({"messages": ASK, "max_tokens": 5, "model": "claude-9"}, 404),
        ({"messages": ASK, "max_tokens": 5, "thinking": {"type": "enabled"}}, 400),
        ({"messages": ASK, "max_tokens": 5, "output_config": {"format": {}}}, 400),
        (
            {
                "messages": ASK,
                "max_tokens": 5,
                "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            },
            400,
        ),
    ],
)
async def test_errors_have_the_anthropic_shape(cluster, body, status):
    resp = await cluster.client.post("/v1/messages", json={"model": MODEL, **body})
    error = await resp.json()
    assert resp.status == status, error
    assert error["type"] == "error"
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    assert error["error"]["type"] == kind and error["error"]["message"]


async def test_what_claude_code_sends_is_accepted(cluster):
    """Claude Code's turn carries adaptive thinking, an effort and a clear_thinking edit."""
    await cluster.add_worker("w1")
    messages = [*ASK, {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}]
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 2,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }
    resp = await cluster.client.post("/v1/messages", json=body)
    assert resp.status == 200, await resp.text()


async def test_x_api_key_auth(make_cluster, sdk):
    cluster = await make_cluster(context_length=CONTEXT, api_keys=("sekrit",))
    await cluster.add_worker("w1")
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    resp = await cluster.client.post("/v1/messages", json=body, headers={"x-api-key": "bad"})
    assert resp.status == 401
    assert (await resp.json())["error"]["type"] == "authentication_error"
    resp = await cluster.client.post("/v1/messages", json=body, headers={"x-api-key": "sekrit"})
    assert resp.status == 200
    api = anthropic.AsyncAnthropic(
        base_url=str(cluster.client.make_url("")), api_key="sekrit", max_retries=0
    )
    msg = await api.messages.create(**body)
    assert msg.usage.output_tokens == 2 and msg.stop_reason == "max_tokens"
    await api.close()


def test_tool_choice_maps_to_the_openai_meanings(tiny_model_dir):
    from router.text.tokenizer import ModelTokenizer

    tokenizer = ModelTokenizer.load(tiny_model_dir, CONTEXT)
    base = {"model": MODEL, "messages": ASK, "max_tokens": 5, "tools": [WEATHER]}
    plain = parse_messages_request({**base, "tools": None}, tokenizer, MODEL)
    off = parse_messages_request({**base, "tool_choice": {"type": "none"}}, tokenizer, MODEL)
    assert off.prompt_ids == plain.prompt_ids and off.tool_family is None
    auto = parse_messages_request(base, tokenizer, MODEL)
    assert auto.tool_family == "hermes" and auto.tool_grammar is None
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        req = parse_messages_request({**base, "tool_choice": choice}, tokenizer, MODEL)
        assert req.tool_grammar["properties"]["name"] == {"const": "get_weather"}


async def test_parallel_tool_use_blocks(cluster, sdk):
    body = {"messages": ASK, "max_tokens": 300, "tools": [WEATHER]}
    await scripted(cluster, body, CALL + "\n" + CALL.replace("Paris", "Rome"))
    msg = await sdk(api_key="none").messages.create(model=MODEL, **body)
    assert [b.type for b in msg.content] == ["tool_use", "tool_use"]
    assert [b.input["city"] for b in msg.content] == ["Paris", "Rome"]
    assert len({b.id for b in msg.content}) == 2
