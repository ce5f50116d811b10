"""POST /v1/responses through the official openai SDK, with scripted stand-in workers."""

from __future__ import annotations

import json

from tests.unit.router.responses.conftest import CALL, MODEL, WEATHER, scripted


async def test_plain_text_with_instructions(cluster):
    body = {"input": "weather in paris?", "instructions": "Be brief.", "max_output_tokens": 50}
    worker, n = await scripted(cluster, body, "Sunny, 18C.")
    resp = await cluster.openai().responses.create(model=MODEL, **body)
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == MODEL
    assert resp.status == "completed" and resp.incomplete_details is None
    assert resp.output_text == "Sunny, 18C."
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert item.content[0].type == "output_text" and item.content[0].annotations == []
    assert resp.usage.input_tokens == len(worker.received[0].token_ids)
    assert resp.usage.output_tokens == n and resp.usage.total_tokens == n + resp.usage.input_tokens
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.instructions == "Be brief." and resp.max_output_tokens == 50
    prompt = cluster.tokenizer.decode(worker.received[0].token_ids)
    assert prompt.startswith("system\nBe brief.")


async def test_length_is_incomplete(cluster):
    body = {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "count"}]}],
        "max_output_tokens": 3,
    }
    await scripted(cluster, body, "one two three four five", end_turn=False)
    resp = await cluster.openai().responses.create(model=MODEL, **body)
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete" and resp.usage.output_tokens == 3


STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",  # reasoning
    "response.content_part.added",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",  # message
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",  # function call
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


async def test_stream_has_every_event_in_order(cluster):
    body = {"input": "weather in paris?", "tools": [WEATHER], "max_output_tokens": 200}
    await scripted(cluster, body, "<think>cold?</think>Checking. " + CALL)
    api = cluster.openai()
    async with api.responses.stream(model=MODEL, **body) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_response()
    types = [e.type for e in events]
    collapsed = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
    assert collapsed == STREAM_ORDER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "cold?"
    assert final.output[1].content[0].text == "Checking. "
    call = final.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert final.usage.output_tokens_details.reasoning_tokens > 0


async def test_stream_is_named_sse(cluster):
    body = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 20}
    await scripted(cluster, body, "Hello.")
    resp = await cluster.client.post("/v1/responses", json=body)
    text = await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    blocks = [b for b in text.split("\n\n") if b]
    assert blocks[0].startswith("event: response.created\ndata: {")
    names = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    datas = [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert [d["type"] for d in datas] == names and names[-1] == "response.completed"
    assert datas[-1]["response"]["output"][0]["content"][0]["text"] == "Hello."


async def test_function_call_required_and_named(cluster):
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        body = {
            "input": "weather in paris?",
            "tools": [WEATHER],
            "tool_choice": choice,
            "max_output_tokens": 200,
        }
        worker, _ = await scripted(cluster, body, CALL)
        resp = await cluster.openai().responses.create(model=MODEL, **body)
        (call,) = resp.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        grammar = worker.received[0].sampling.grammar
        assert grammar is not None and "get_weather" in grammar.source


async def test_parallel_tool_calls_false_keeps_the_first(cluster):
    body = {
        "input": "weather?",
        "tools": [WEATHER],
        "parallel_tool_calls": False,
        "max_output_tokens": 300,
    }
    await scripted(cluster, body, CALL + "\n" + CALL.replace("Paris", "Rome"))
    resp = await cluster.openai().responses.create(model=MODEL, **body)
    assert [i.type for i in resp.output] == ["function_call"]
    assert json.loads(resp.output[0].arguments) == {"city": "Paris"}


async def test_function_call_output_round_trip(cluster):
    body = {"input": "weather in paris?", "tools": [WEATHER], "max_output_tokens": 200}
    await scripted(cluster, body, CALL)
    api = cluster.openai()
    first = await api.responses.create(model=MODEL, **body)
    (call,) = first.output
    history = [
        {"role": "user", "content": "weather in paris?"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
    ]
    body = {"input": history, "tools": [WEATHER], "max_output_tokens": 50}
    worker, _ = await scripted(cluster, body, "It is 18C.")
    resp = await api.responses.create(model=MODEL, **body)
    assert resp.output_text == "It is 18C."
    prompt = cluster.tokenizer.decode(worker.received[0].token_ids)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n18C\n</tool_response>" in prompt


async def test_json_schema_text_format_uses_the_grammar(cluster):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "place", "schema": schema, "strict": True}
    body = {"input": "a city?", "text": {"format": fmt}, "max_output_tokens": 50}
    worker, _ = await scripted(cluster, body, '{"city": "Paris"}')
    resp = await cluster.openai().responses.create(model=MODEL, **body)
    assert json.loads(resp.output_text) == {"city": "Paris"}
    grammar = worker.received[0].sampling.grammar
    assert grammar.kind == "json_schema" and json.loads(grammar.source) == schema
    assert resp.text.format.type == "json_schema"


async def test_previous_response_id_over_three_turns(cluster):
    api = cluster.openai()
    previous, prompts = None, []
    turns = [
        ("Hi, I am Ann.", "Hello Ann."),
        ("My age is 30.", "Noted."),
        ("Who am I?", "Ann, 30."),
    ]
    for question, answer in turns:
        body = {"input": question, "max_output_tokens": 40}
        if previous is not None:
            body["previous_response_id"] = previous
        worker, _ = await scripted(cluster, body, answer)
        resp = await api.responses.create(model=MODEL, **body)
        assert resp.output_text == answer and resp.previous_response_id == previous
        prompts.append(cluster.tokenizer.decode(worker.received[0].token_ids))
        previous = resp.id
    assert "Hi, I am Ann." in prompts[2] and "Hello Ann." in prompts[2] and "Noted." in prompts[2]
    assert prompts[2].index("Hello Ann.") < prompts[2].index("My age is 30.")


async def test_whitespace_only_reply_is_returned_as_generated(cluster):
    body = {"input": "say nothing", "max_output_tokens": 20}
    await scripted(cluster, body, " \n\n ")
    api = cluster.openai()
    resp = await api.responses.create(model=MODEL, **body)
    assert resp.output_text == " \n\n "
    (item,) = resp.output
    assert item.type == "message" and item.content[0].text == " \n\n "
    async with api.responses.stream(model=MODEL, **body) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert deltas == done.text == final.output_text == " \n\n "
