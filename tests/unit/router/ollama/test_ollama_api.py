"""Ollama's API (/api/*) through the official `ollama` client, with scripted stand-in workers."""

from __future__ import annotations

import base64
import json

import ollama
import pytest

from router.api.ollama.parse import parse_chat, parse_generate
from router.http import app_keys
from router.http.endpoints import ollama as endpoints
from tests.support.scripted import scripted_worker

CONTEXT = 4096
ASK = [{"role": "user", "content": "weather in paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
async def cluster(make_cluster):
    return await make_cluster(context_length=CONTEXT)


@pytest.fixture
def model(cluster) -> str:
    return cluster.app[app_keys.MODELS].default.id


@pytest.fixture
def client(cluster) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=str(cluster.client.make_url("")).rstrip("/"))


async def scripted(cluster, model, body: dict, reply: str, kind="chat", end_turn=True):
    parse = parse_chat if kind == "chat" else parse_generate
    prompt = parse({"model": model, **body}, cluster.tokenizer, model).prompt_ids
    return await scripted_worker(cluster, cluster.tokenizer, prompt, reply, end_turn)


async def test_chat_whole_with_measured_timings(cluster, model, client):
    worker, n = await scripted(cluster, model, {"messages": ASK}, "Sunny, 18C.")
    reply = await client.chat(model=model, messages=ASK, stream=False, options={"num_predict": n})
    assert reply.message.role == "assistant" and reply.message.content == "Sunny, 18C."
    assert reply.done and reply.done_reason == "stop" and reply.model == model
    assert reply.prompt_eval_count == len(worker.received[0].token_ids)
    assert reply.eval_count == n
    assert reply.total_duration >= reply.load_duration + reply.prompt_eval_duration > 0
    assert reply.total_duration >= reply.eval_duration > 0


async def test_chat_streams_ndjson_and_ends_with_the_counts(cluster, model, client):
    _, n = await scripted(cluster, model, {"messages": ASK}, "one two three four")
    parts = [p async for p in await client.chat(model=model, messages=ASK, stream=True)]
    assert "".join(p.message.content for p in parts) == "one two three four"
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == n
    assert len(parts) > 2  # piece by piece, not one line


async def test_num_predict_ends_with_length_and_stop_strings(cluster, model, client):
    await scripted(cluster, model, {"messages": ASK}, "one two three four five", end_turn=False)
    reply = await client.chat(model=model, messages=ASK, stream=False, options={"num_predict": 2})
    assert reply.done_reason == "length" and reply.eval_count == 2
    await scripted(cluster, model, {"messages": ASK}, "one two three four five")
    reply = await client.chat(model=model, messages=ASK, stream=False, options={"stop": ["three"]})
    assert reply.message.content == "one two "


async def test_tool_calls_in_ollama_shape_and_round_trip(cluster, model, client):
    body = {"messages": ASK, "tools": [WEATHER]}
    await scripted(cluster, model, body, CALL)
    reply = await client.chat(model=model, messages=ASK, tools=[WEATHER], stream=False)
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "content": "18C", "tool_name": "get_weather"},
    ]
    await scripted(cluster, model, {"messages": history, "tools": [WEATHER]}, "It is 18C.")
    reply = await client.chat(model=model, messages=history, tools=[WEATHER], stream=False)
    assert reply.message.content == "It is 18C."


async def test_thinking_is_its_own_field(cluster, model, client):
    await scripted(cluster, model, {"messages": ASK}, "<think>hmm</think>Sunny.")
    reply = await client.chat(model=model, messages=ASK, stream=False)
    assert reply.message.thinking == "hmm" and reply.message.content == "Sunny."


async def test_generate_with_system_stream_and_whole(cluster, model, client):
    body = {"prompt": "hi", "system": "Be brief."}
    worker, _ = await scripted(cluster, model, body, "Hello there.", kind="generate")
    reply = await client.generate(model=model, stream=False, **body)
    assert reply.response == "Hello there." and reply.done_reason == "stop"
    assert cluster.tokenizer.decode(worker.received[0].token_ids).startswith("system\nBe brief.")
    parts = [p async for p in await client.generate(model=model, stream=True, **body)]
    assert "".join(p.response for p in parts) == "Hello there." and parts[-1].done


async def test_generate_raw_skips_the_template(cluster, model, client):
    body = {"prompt": "abc", "raw": True}
    worker, n = await scripted(cluster, model, body, "def", kind="generate", end_turn=False)
    reply = await client.generate(model=model, raw=True, prompt="abc", options={"num_predict": n})
    assert reply.response == "def" and reply.done_reason == "length"
    assert list(worker.received[0].token_ids) == cluster.tokenizer.encode_prompt("abc")


async def test_format_and_options_reach_the_sampling(cluster, model):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    options = {"temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 7}
    options |= {"repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    body = {"model": model, "messages": ASK, "format": schema, "options": options}
    sampling = parse_chat(body, cluster.tokenizer, model).sampling
    assert json.loads(sampling.grammar.source) == schema
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed) == (0, 5, 0.5, 7)
    assert (sampling.min_p, sampling.repetition_penalty) == (0.1, 1.2)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, 0.25)
    sampling = parse_chat(body | {"format": "json"}, cluster.tokenizer, model).sampling
    assert json.loads(sampling.grammar.source) == {"type": "object"}


async def test_null_options_are_absent_even_those_not_served(cluster, model):
    """LangChain's OllamaEmbeddings and others send every option they know, most of them
    null: null is absent; `mirostat: 1` is still a 400 (above)."""
    await cluster.add_worker("w1")
    options = {"mirostat": None, "tfs_z": None, "temperature": None, "num_predict": 2}
    resp = await cluster.client.post(
        "/api/chat", json={"model": model, "messages": ASK, "options": options, "stream": False}
    )
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"messages": ASK, "options": {"num_ctx": CONTEXT + 1}}, "num_ctx"),
        ({"messages": ASK, "options": {"mirostat": 1}}, "mirostat"),
        ({"messages": ASK, "options": {"temperature": "hot"}}, "temperature"),
        ({"messages": ASK, "format": "yaml"}, "format"),
        ({"messages": ASK, "think": "very"}, "think"),
        ({"messages": ASK, "context": [1, 2]}, "context"),
        ({"messages": "hi"}, "messages"),
    ],
)
async def test_bad_chat_bodies_are_400_naming_the_field(cluster, model, body, named):
    await cluster.add_worker("w1")
    resp = await cluster.client.post("/api/chat", json={"model": model, **body})
    assert resp.status == 400
    assert named in (await resp.json())["error"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prompt": "a", "suffix": "b"}, "suffix"),
        ({"prompt": "a", "template": "{{ .Prompt }}"}, "template"),
        ({"prompt": "a", "context": [1, 2, 3]}, "context"),
        ({"prompt": "a", "raw": True, "system": "s"}, "system"),
    ],
)
async def test_unsupported_generate_fields_are_refused(cluster, model, body, named):
    await cluster.add_worker("w1")
    with pytest.raises(ollama.ResponseError) as error:
        await ollama.AsyncClient(host=str(cluster.client.make_url(""))).generate(
            model=model, **body
        )
    assert error.value.status_code == 400 and named in error.value.error


async def test_an_unknown_model_is_a_404_in_ollama_shape(cluster, client):
    with pytest.raises(ollama.ResponseError) as error:
        await client.chat(model="nope", messages=ASK, stream=False)
    assert error.value.status_code == 404 and "nope" in error.value.error
    resp = await cluster.client.post("/api/show", json={"model": "nope"})
    assert resp.status == 404 and set(await resp.json()) == {"error"}


async def test_images_need_a_vision_model(cluster, model, client):
    await cluster.add_worker("w1")
    image = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    with pytest.raises(ollama.ResponseError) as error:
        await client.chat(
            model=model, messages=[{"role": "user", "content": "what?", "images": [image]}]
        )
    assert error.value.status_code == 400 and "image" in error.value.error


async def test_empty_input_loads_the_model(cluster, model, client):
    await cluster.add_worker("w1")
    reply = await client.generate(model=model)
    assert reply.done and reply.done_reason == "load" and reply.response == ""


async def test_list_ps_show_version(cluster, model, client):
    await cluster.add_worker("w1")
    (listed,) = (await client.list()).models
    assert (
        listed.model == model
        and listed.details.format == "mlx"
        and listed.details.family == "llama"
    )
    (loaded,) = (await client.ps()).models
    assert loaded.model == model
    shown = await client.show(model)
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.template == cluster.tokenizer.template_source
    assert any(k.endswith(".context_length") for k in shown.modelinfo)
    assert (await client.show(f"{model}:latest")).template == shown.template
    version = await cluster.client.get("/api/version")
    assert (await version.json())["version"]


async def test_pull_answers_for_a_served_model_and_refuses_others(cluster, model, client):
    statuses = [s.status async for s in await client.pull(model, stream=True)]
    assert statuses[-1] == "success"
    assert (await client.pull(model)).status == "success"
    with pytest.raises(ollama.ResponseError) as error:
        await client.pull("llama3:8b")
    assert error.value.status_code == 404 and "not in this fleet's catalog" in error.value.error
    with pytest.raises(ollama.ResponseError) as error:
        await client.delete(model)
    assert error.value.status_code == 400 and "not supported" in error.value.error


async def test_embed_answers_in_ollama_shape(cluster, model, client, monkeypatch):
    async def vectors(app, body, request_id):
        data = [{"embedding": [0.5, float(i)]} for i, _ in enumerate(body["input"])]
        return {"data": data}, body["model"], 3

    monkeypatch.setattr(endpoints, "embed_body", vectors)
    await cluster.add_worker("w1")
    reply = await client.embed(model=model, input=["a", "b"])
    assert reply.embeddings == [[0.5, 0.0], [0.5, 1.0]] and reply.prompt_eval_count == 3
    assert reply.total_duration >= reply.load_duration >= 0
    old = await client.embeddings(model=model, prompt="a")
    assert list(old.embedding) == [0.5, 0.0]


async def test_embed_on_a_chat_model_is_a_400(cluster, model, client):
    await cluster.add_worker("w1")
    with pytest.raises(ollama.ResponseError) as error:
        await client.embed(model=model, input="hi")
    assert error.value.status_code == 400 and "embeddings" in error.value.error


async def test_api_keys_cover_ollama(make_cluster):
    cluster = await make_cluster(api_keys=("sk-test",))
    resp = await cluster.client.get("/api/tags")
    assert resp.status == 401 and set(await resp.json()) == {"error"}
    ok = await cluster.client.get("/api/tags", headers={"Authorization": "Bearer sk-test"})
    assert ok.status == 200
