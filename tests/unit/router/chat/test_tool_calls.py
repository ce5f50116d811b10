"""Tool calling: validation, prompt rendering (native and fallback), parsers, whole and streamed."""

from __future__ import annotations

import json

import pytest

from router.api.openai.parse import parse_chat
from router.chat.output import ChatReader
from router.chat.prompt import build_chat_prompt, tool_family_of
from router.chat.tool_parsers import parse_tool_calls
from router.chat.tools import chat_messages, parse_tools
from tests.support.scripted import scripted_worker

MODEL = "tiny"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "weather in paris?"}]
CONTEXT = 4096  # the fallback tool prompt is long in the tiny tokenizer's tokens


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from router.text.tokenizer import ModelTokenizer

    return ModelTokenizer.load(tiny_model_dir, CONTEXT)


@pytest.fixture
async def tool_cluster(make_cluster):
    return await make_cluster(context_length=CONTEXT)


CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


# ------------------------------------------------------------ parsers


@pytest.mark.parametrize(
    ("family", "text", "content", "calls"),
    [
        (
            "hermes",
            "Let me check. " + CALL_TEXT,
            "Let me check.",
            [("get_weather", {"city": "Paris"})],
        ),
        (
            "hermes",
            CALL_TEXT + CALL_TEXT.replace("Paris", "Rome"),
            "",
            [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})],
        ),
        ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}}', "", [("f", {"a": 1})]),
        ("llama3", '{"name": "f", "parameters": {"x": [1, 2]}}', "", [("f", {"x": [1, 2]})]),
        (
            "llama3",
            '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"s": ";"}}',
            "",
            [("f", {}), ("g", {"s": ";"})],
        ),
        ("llama3", "{this is prose in braces}", "{this is prose in braces}", []),
        ("llama3", "The answer is 4.", "The answer is 4.", []),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "f", "arguments": {"q": "a"}}]',
            "",
            [("f", {"q": "a"})],
        ),
        (
            "mistral",
            '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
            "",
            [("f", {}), ("g", {})],
        ),
        ("mistral", "[TOOL_CALLS][{broken", "[TOOL_CALLS][{broken", []),
        ("mistral", '[{"name": 5}]', '[{"name": 5}]', []),
    ],
)
def test_parsers_per_family(family, text, content, calls):
    parsed = parse_tool_calls(family, text)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls


def read_in_pieces(family, text, size, starts_in_reasoning=False):
    reader = ChatReader(family, starts_in_reasoning)
    events = []
    for i in range(0, len(text), size):
        events += reader.feed(text[i : i + size])
    return events + reader.finish(), reader


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize(
    "text",
    [
        "Let me check. " + CALL_TEXT,
        CALL_TEXT + " and " + CALL_TEXT,
        "no call here, just < and <tool and <tool_cal",
        "<tool_call>{broken</tool_call> tail",
    ],
)
def test_streamed_reading_matches_whole_reading(text, size):
    events, reader = read_in_pieces("hermes", text, size)
    parsed = parse_tool_calls("hermes", text)
    calls = [e.call for e in events if e.kind == "tool_call"]
    assert calls == list(parsed.calls)
    content = "".join(e.text for e in events if e.kind == "content")
    assert content.strip() == parsed.content.strip()
    assert reader.finish_reason("stop") == ("tool_calls" if calls else "stop")
    if size == 1 and calls:  # content before the call streams before it, not with it
        first_call = next(i for i, e in enumerate(events) if e.kind == "tool_call")
        assert all(e.kind == "content" for e in events[:first_call])


def test_llama3_reply_that_is_prose_is_content_when_streamed():
    events, _ = read_in_pieces("llama3", "  Hello {there}", 1)
    assert [e.kind for e in events] and {e.kind for e in events} == {"content"}
    assert "".join(e.text for e in events) == "  Hello {there}"


# ------------------------------------------------------------ validation and prompts


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": "x"}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": "x"}]},
            "messages[0].tool_calls",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}],
                    }
                ]
            },
            "messages[0].tool_calls[0]",
        ),
        ({"messages": [{"role": "tool", "content": "18C"}]}, "messages[0].tool_call_id"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ],
)
async def test_bad_tool_fields_are_400_naming_the_field(tool_cluster, body, param):
    cluster = tool_cluster
    request = {"model": MODEL, "messages": ASK, "max_tokens": 2} | body
    resp = await cluster.client.post("/v1/chat/completions", json=request)
    error = (await resp.json())["error"]
    assert resp.status == 400, error
    assert error["param"] == param


def test_fallback_prompt_lists_schemas_and_renders_history(tok):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
    ]
    body = {"model": MODEL, "messages": history, "tools": [WEATHER]}
    req = parse_chat(body, tok, MODEL)
    text = tok.decode(req.prompt_ids)
    assert '"name": "get_weather"' in text and "<tools>" in text  # the schema, listed
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n18C and sunny\n</tool_response>" in text
    assert req.tool_family == "hermes" and req.tool_grammar is None


def test_tool_choice_none_renders_no_tools_and_required_sets_a_grammar(tok):
    plain = parse_chat({"model": MODEL, "messages": ASK}, tok, MODEL)
    off = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "none"}
    none = parse_chat(off, tok, MODEL)
    assert none.prompt_ids == plain.prompt_ids and none.tool_family is None
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": choice}
        grammar = parse_chat(body, tok, MODEL).tool_grammar
        assert grammar["properties"]["name"] == {"const": "get_weather"}
        closed = WEATHER["function"]["parameters"] | {"additionalProperties": False}
        assert grammar["properties"]["arguments"] == closed


NATIVE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %} [TOOL_CALLS]<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if thinking %}<think>\n{% endif %}"
    "{% endif %}"
)


def test_a_template_with_tool_support_renders_them_itself(tiny_model_dir):
    from router.text.tokenizer import ModelTokenizer

    tokenizer = ModelTokenizer.load(tiny_model_dir, CONTEXT)
    tokenizer.set_chat_template(NATIVE_TEMPLATE)
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        },
    ]
    body = {"messages": history, "tools": [WEATHER]}
    prompt = build_chat_prompt(chat_messages(body), parse_tools(body), tokenizer, {})
    text = tokenizer.decode(prompt.token_ids)
    assert "TOOLS: get_weather" in text and "CALL get_weather Oslo" in text
    assert "<tools>" not in text  # no fallback prompt on top
    assert prompt.tool_family == "mistral" == tool_family_of(tokenizer, None)
    assert tool_family_of(tokenizer, "llama3") == "llama3"
    thinking = build_chat_prompt(chat_messages(body), None, tokenizer, {"thinking": True})
    assert thinking.starts_in_reasoning and not prompt.starts_in_reasoning


# ------------------------------------------------------------ through the router


async def test_tool_call_whole_reply(tool_cluster, tok):
    cluster = tool_cluster
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    prompt = parse_chat(body, tok, MODEL).prompt_ids
    _, n = await scripted_worker(cluster, tok, prompt, "Let me check. " + CALL_TEXT)
    resp = await cluster.openai().chat.completions.create(**body, max_tokens=n)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


async def test_tool_calls_streamed_as_deltas(tool_cluster, tok):
    cluster = tool_cluster
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    prompt = parse_chat(body, tok, MODEL).prompt_ids
    reply = "Checking. " + CALL_TEXT + "\n" + CALL_TEXT.replace("Paris", "Rome")
    _, n = await scripted_worker(cluster, tok, prompt, reply)
    stream = await cluster.openai().chat.completions.create(**body, max_tokens=n, stream=True)
    chunks = [c async for c in stream]
    deltas = [c.choices[0].delta for c in chunks]
    content = "".join(d.content or "" for d in deltas)
    assert content.strip() == "Checking." and "<tool" not in content
    entries = [tc for d in deltas for tc in d.tool_calls or []]
    assert [c.index for c in entries] == [0, 0, 1, 1]
    heads, arguments = entries[0::2], entries[1::2]  # name first, then the arguments
    assert all(c.id.startswith("call_") and c.type == "function" for c in heads)
    assert all(c.function.name == "get_weather" and not c.function.arguments for c in heads)
    assert all(c.id is None and c.function.name is None for c in arguments)
    assert [json.loads(c.function.arguments)["city"] for c in arguments] == ["Paris", "Rome"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_malformed_call_comes_back_as_content(tool_cluster, tok):
    cluster = tool_cluster
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    prompt = parse_chat(body, tok, MODEL).prompt_ids
    reply = "<tool_call>{oops</tool_call>"
    _, n = await scripted_worker(cluster, tok, prompt, reply)
    resp = await cluster.openai().chat.completions.create(**body, max_tokens=n)
    assert resp.choices[0].message.content == reply
    assert resp.choices[0].message.tool_calls is None
    assert resp.choices[0].finish_reason == "stop"


async def test_router_flags_set_the_template_and_the_parser(make_cluster, tok):
    cluster = await make_cluster(
        context_length=CONTEXT, chat_template=NATIVE_TEMPLATE, tool_call_parser="llama3"
    )
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    reply = '{"name": "get_weather", "parameters": {"city": "Lima"}}'
    tokenizer = cluster.tokenizer
    prompt = parse_chat(body, tokenizer, MODEL).prompt_ids
    worker, n = await scripted_worker(cluster, tokenizer, prompt, reply)
    resp = await cluster.openai().chat.completions.create(**body, max_tokens=n)
    assert "TOOLS: get_weather" in tokenizer.decode(worker.received[0].token_ids)
    (call,) = resp.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Lima"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"user": 5}, "user"),
        ({"store": "yes"}, "store"),
        ({"metadata": []}, "metadata"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
async def test_refused_fields_and_mistyped_no_ops_are_400(tool_cluster, body, param):
    request = {"model": MODEL, "messages": ASK, "max_tokens": 2} | body
    resp = await tool_cluster.client.post("/v1/chat/completions", json=request)
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == param


async def test_accepted_no_ops_change_nothing(tool_cluster, tok):
    await tool_cluster.add_worker("w1")
    no_ops = {
        "user": "u1",
        "store": False,
        "metadata": {"k": "v"},
        "service_tier": "auto",
        "parallel_tool_calls": True,
        "modalities": ["text"],
        "prompt_cache_key": "p",
    }
    request = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    plain = await tool_cluster.client.post("/v1/chat/completions", json=request)
    resp = await tool_cluster.client.post("/v1/chat/completions", json=request | no_ops)
    assert resp.status == plain.status == 200
    texts = [(await r.json())["choices"][0]["message"]["content"] for r in (plain, resp)]
    assert texts[0] == texts[1]


async def test_the_sdk_stream_helper_assembles_the_calls(tool_cluster, tok):
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}
    prompt = parse_chat(body, tok, MODEL).prompt_ids
    _, n = await scripted_worker(tool_cluster, tok, prompt, "Ok. " + CALL_TEXT)
    api = tool_cluster.openai()
    async with api.chat.completions.stream(**body, max_tokens=n) as stream:
        final = await stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("size", [1, 4])
@pytest.mark.parametrize(
    ("family", "text"),
    [
        ("llama3", ' {"name": "f", "parameters": {"a": "}"}}'),
        ("llama3", '<|python_tag|>{"name": "f", "parameters": {}}'),
        ("llama3", "Sure: {not a call}"),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"q": "]"}}]'),
        ("mistral", "[1] is a citation, not a call"),
        ("mistral", 'text first [TOOL_CALLS][{"name": "f", "arguments": {}}]'),
    ],
)
def test_streamed_reading_matches_whole_reading_per_family(family, text, size):
    events, _ = read_in_pieces(family, text, size)
    parsed = parse_tool_calls(family, text)
    assert [e.call for e in events if e.kind == "tool_call"] == list(parsed.calls)
    content = "".join(e.text for e in events if e.kind == "content")
    assert content.strip() == parsed.content.strip()
