"""Stored responses (GET, DELETE, input_items, cancel), the store's bounds, and the 400s."""

from __future__ import annotations

import openai
import pytest

from tests.unit.router.responses.conftest import MODEL, WEATHER, scripted


async def test_get_input_items_delete(cluster):
    body = {
        "input": [{"role": "developer", "content": "terse"}, {"role": "user", "content": "hi"}],
        "max_output_tokens": 20,
    }
    await scripted(cluster, body, "Hello.")
    api = cluster.openai()
    resp = await api.responses.create(model=MODEL, metadata={"k": "v"}, **body)
    got = await api.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == "Hello." and got.metadata == {"k": "v"}
    items = await api.responses.input_items.list(resp.id, order="asc")
    assert [(i.role, i.content[0].text) for i in items.data] == [
        ("developer", "terse"),
        ("user", "hi"),
    ]
    assert all(i.id.startswith("msg_") for i in items.data)
    newest = await api.responses.input_items.list(resp.id, limit=1)  # default order: desc
    assert [i.content[0].text for i in newest.data] == ["hi"] and newest.has_more
    await api.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError) as e:
        await api.responses.retrieve(resp.id)
    assert e.value.body["message"] == f"Response with id '{resp.id}' not found."


async def test_unknown_ids_are_404_and_cancel_is_400(cluster):
    api = cluster.openai()
    for call in (
        api.responses.retrieve,
        api.responses.delete,
        api.responses.input_items.list,
        api.responses.cancel,
    ):
        with pytest.raises(openai.NotFoundError):
            await call("resp_nope")
    body = {"input": "hi", "max_output_tokens": 20}
    await scripted(cluster, body, "Hello.")
    resp = await api.responses.create(model=MODEL, **body)
    with pytest.raises(openai.BadRequestError) as e:
        await api.responses.cancel(resp.id)
    assert "background mode is not supported" in e.value.message


async def test_store_false_keeps_nothing(cluster):
    body = {"input": "hi", "max_output_tokens": 20, "store": False}
    await scripted(cluster, body, "Hello.")
    api = cluster.openai()
    resp = await api.responses.create(model=MODEL, **body)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(resp.id)
    with pytest.raises(openai.BadRequestError) as e:
        await api.responses.create(model=MODEL, input="more", previous_response_id=resp.id)
    assert e.value.body["param"] == "previous_response_id"


async def test_store_size_setting_reaches_the_router(make_cluster):
    cluster = await make_cluster(context_length=4096, responses_store_size=1)
    api = cluster.openai()
    ids = []
    for text in ("a", "b"):
        body = {"input": text, "max_output_tokens": 20}
        await scripted(cluster, body, "ok")
        ids.append((await api.responses.create(model=MODEL, **body)).id)
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(ids[0])
    assert (await api.responses.retrieve(ids[1])).id == ids[1]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"zzz": 1}, "zzz"),
        ({"max_tokens": 5}, "max_tokens"),  # chat's name: not this API's
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"summary": "auto", "effort": "low"}}, "reasoning"),
        ({"client_metadata": "x"}, "client_metadata"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"user": 5}, "user"),
        ({"previous_response_id": "resp_missing"}, "previous_response_id"),
    ],
)
async def test_refused_fields_are_a_400_naming_them(cluster, extra, param):
    await cluster.add_worker("w1")
    body = {"model": MODEL, "input": "hi"} | extra
    resp = await cluster.client.post("/v1/responses", json=body)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


async def test_accepted_no_ops_answer(cluster):
    body = {"input": "hi", "max_output_tokens": 20}
    await scripted(cluster, body, "ok")
    extra = {
        "user": "u1",
        "safety_identifier": "s",
        "prompt_cache_key": "k",
        "service_tier": "auto",
        "include": [],
        "background": False,
        "reasoning": {"effort": None},
        "truncation": "disabled",
    }
    # what Codex CLI sends on every turn
    extra |= {
        "client_metadata": {"turn_id": "t1"},
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
    }
    resp = await cluster.client.post("/v1/responses", json={"model": MODEL, **body, **extra})
    assert resp.status == 200, await resp.text()


async def test_truncation_auto_drops_the_oldest_items(make_cluster):
    cluster = await make_cluster(context_length=120)
    old = [{"role": "user", "content": "word " * 40}, {"role": "assistant", "content": "ok"}]
    body = {"input": [*old, {"role": "user", "content": "last question"}], "max_output_tokens": 20}
    resp = await cluster.client.post("/v1/responses", json={"model": MODEL, **body})
    assert resp.status == 400  # disabled (the default): too long
    body["truncation"] = "auto"
    worker, _ = await scripted(cluster, body, "ok")
    resp = await cluster.openai().responses.create(model=MODEL, **body)
    assert resp.truncation == "auto" and resp.output_text == "ok"
    prompt = cluster.tokenizer.decode(worker.received[0].token_ids)
    assert "last question" in prompt and "word word" not in prompt


def test_truncation_auto_without_max_output_tokens_leaves_the_reply_room():
    """No max_output_tokens: the reply still gets a quarter of the context (at most 1024), not
    the single token that squeezed an auto-truncated conversation's answer before."""
    from router.api.responses.parse import output_room

    assert output_room(None, None, 8192) == 1024
    assert output_room(None, None, 120) == 30
    assert output_room(20, None, 120) == 20
    assert output_room(None, 50, 8192) == 50
    assert output_room(200, 50, 8192) == 50
