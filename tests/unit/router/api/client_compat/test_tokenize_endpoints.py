"""vLLM's /tokenize and /detokenize and Anthropic's /v1/messages/count_tokens, on real sockets
(count_tokens through the official anthropic SDK): the counts equal the prompts the generation
endpoints build, and bad bodies are 400s naming the field."""

from __future__ import annotations

import anthropic
import pytest

from router.api.anthropic.parse import messages_prompt, parse_messages_request
from router.api.openai.parse import parse_chat

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture
async def cluster(make_cluster):
    return await make_cluster()  # no worker needed: nothing is generated


async def _post(cluster, path, body, status=200):
    resp = await cluster.client.post(path, json=body)
    data = await resp.json()
    assert resp.status == status, data
    return data


async def test_tokenize_a_prompt_and_back(cluster):
    tok = cluster.tokenizer
    out = await _post(cluster, "/tokenize", {"model": MODEL, "prompt": "hello world"})
    assert out["tokens"] == tok.encode_prompt("hello world")
    assert out["count"] == len(out["tokens"]) > 0
    assert out["max_model_len"] == tok.context_length
    assert out["token_strs"] is None
    back = await _post(cluster, "/detokenize", {"model": MODEL, "tokens": out["tokens"]})
    assert back == {"prompt": "hello world"}


async def test_tokenize_options(cluster):
    plain = await _post(
        cluster, "/tokenize", {"prompt": "hi there", "add_special_tokens": False}
    )  # no model: the default one, as vLLM
    strs = await _post(cluster, "/tokenize", {"prompt": "hi there", "return_token_strs": True})
    assert strs["token_strs"] == cluster.tokenizer.token_strings(strs["tokens"])
    assert len(strs["token_strs"]) == strs["count"]
    assert plain["tokens"] == cluster.tokenizer.encode_text("hi there")


async def test_tokenize_messages_equals_the_chat_prompt(cluster):
    tok = cluster.tokenizer
    out = await _post(cluster, "/tokenize", {"model": MODEL, "messages": MESSAGES})
    chat = parse_chat({"model": MODEL, "messages": MESSAGES}, tok, MODEL)
    assert out["tokens"] == list(chat.prompt_ids)
    bare = await _post(
        cluster,
        "/tokenize",
        {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": False},
    )
    assert bare["count"] < out["count"]  # without the assistant's opening
    assert out["tokens"][: bare["count"]] == bare["tokens"]


async def test_detokenize_keeps_special_tokens(cluster):
    eos = cluster.tokenizer.eos_token_ids[0]
    out = await _post(cluster, "/detokenize", {"tokens": [eos]})
    assert out["prompt"] == "<|im_end|>"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"model": MODEL}, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": 5}, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": "x", "messages": MESSAGES}, "messages"),
        ("/tokenize", {"model": MODEL, "prompt": "x", "add_generation_prompt": True}, None),
        ("/tokenize", {"model": MODEL, "prompt": "x", "add_special_tokens": "no"}, None),
        ("/tokenize", {"model": MODEL, "messages": []}, "messages"),
        ("/tokenize", {"model": MODEL, "messages": MESSAGES, "bogus": 1}, "bogus"),
        ("/detokenize", {"model": MODEL, "tokens": "abc"}, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": [10**7]}, "tokens"),
        ("/detokenize", {"model": MODEL}, "tokens"),
    ],
)
async def test_bad_bodies_are_400s(cluster, path, body, param):
    out = await _post(cluster, path, body, 400)
    if param is not None:
        assert out["error"]["param"] == param
    else:
        assert out["error"]["param"] in ("add_generation_prompt", "add_special_tokens")


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/v1/messages/count_tokens"])
async def test_unknown_model_is_a_404(cluster, path):
    body = {"model": "nope", "prompt": "x", "tokens": [1], "messages": MESSAGES}
    resp = await cluster.client.post(path, json=body)
    assert resp.status == 404


@pytest.fixture
async def sdk(cluster):
    api = anthropic.AsyncAnthropic(
        base_url=str(cluster.client.make_url("")), api_key="none", max_retries=0
    )
    yield api
    await api.close()


async def test_count_tokens_equals_the_messages_prompt(cluster, sdk):
    body = {
        "system": "be brief",
        "messages": [{"role": "user", "content": "what is 2 + 2?"}],
        "tools": [
            {
                "name": "add",
                "description": "adds",
                "input_schema": {"type": "object", "properties": {"a": {"type": "number"}}},
            }
        ],
    }
    counted = await sdk.messages.count_tokens(model=MODEL, **body)
    built = messages_prompt(body, cluster.tokenizer)
    assert counted.input_tokens == len(built.token_ids) > 0
    # a prompt over the context is still counted (what a client asks before trimming it)
    assert counted.input_tokens > cluster.tokenizer.context_length
    short = {"messages": MESSAGES}
    counted = await sdk.messages.count_tokens(model=MODEL, **short)
    built = parse_messages_request(
        {"model": MODEL, "max_tokens": 1, **short}, cluster.tokenizer, MODEL
    )
    assert counted.input_tokens == len(built.prompt_ids)


async def test_count_tokens_errors_have_the_anthropic_shape(cluster, sdk):
    with pytest.raises(anthropic.BadRequestError) as e:
        await sdk.messages.count_tokens(model=MODEL, messages=[])
    assert e.value.body["type"] == "error"
    resp = await cluster.client.post(
        "/v1/messages/count_tokens", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 5}
    )
    assert resp.status == 400 and "max_tokens" in (await resp.json())["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        await sdk.messages.count_tokens(model="nope", messages=MESSAGES)
