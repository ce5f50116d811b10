"""/v1/embeddings through real processes: launch-cluster with a decoder embedding model (a tiny
Qwen3 shipped as Qwen3-Embedding is: sentence-transformers files, last-token pooling), an
encoder (a tiny BERT, through the mlx-embeddings extra) and a chat model, one worker each.
The vectors equal the reference of the same weights (mlx-lm's trunk pooled by hand; the
library's own BERT), through the official openai SDK and LangChain's OpenAIEmbeddings; the
wrong model for an endpoint and bad inputs are OpenAI-style 400s."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from tests.support.arch_zoo.embedders import (
    cosine,
    decoder_reference,
    encoder_reference,
    save_bert_embedder,
    save_qwen3_embedder,
)
from tests.support.launched import get_json, launch_cluster, wait_for_models
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow

TEXTS = ["The fleet answers embeddings.", "short", "A longer sentence about Macs and caches."]
BERT_TEXTS = ["w5 w6 w7", "w9", "w10 w11 w12 w13 w14 w15"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("embeddings")
    dirs = {
        "qwen3-embed": save_qwen3_embedder(work / "qwen3-embed", seed=7),
        "bert-embed": save_bert_embedder(work / "bert-embed", seed=8),
        "chat": save_tiny_model(work / "chat", seed=9),
    }
    config = work / "fleet.toml"
    config.write_text(
        f'[[models]]\npath = "{dirs["qwen3-embed"]}"\ntask = "embed"\n'
        f'[[models]]\npath = "{dirs["bert-embed"]}"\n'
        f'[[models]]\npath = "{dirs["chat"]}"\n'
    )
    args = ["--config", str(config), "--workers", "1", "--kv-memory", "16MiB"]
    with launch_cluster(args, work / "logs") as (base, proc):
        try:
            wait_for_models(base, dict.fromkeys(dirs, 1), timeout=240)
        except AssertionError:
            logs = sorted((work / "logs").glob("*"))
            tails = "\n".join(f"---- {p.name}\n{p.read_text()[-2000:]}" for p in logs)
            raise AssertionError(
                f"workers did not register (exit {proc.poll()}):\n{tails}"
            ) from None
        yield base, dirs


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def vector(embedding) -> np.ndarray:
    """The SDK decodes base64 itself only when it chose it (no encoding_format given)."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype=np.float32)
    return np.asarray(embedding)


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_decoder_vectors_equal_the_reference_through_the_sdk(fleet, encoding_format):
    base, dirs = fleet
    given = {} if encoding_format is None else {"encoding_format": encoding_format}
    reply = client(base).embeddings.create(model="qwen3-embed", input=TEXTS, **given)
    tokenizer = AutoTokenizer.from_pretrained(dirs["qwen3-embed"])
    ids = [tokenizer.encode(text) for text in TEXTS]
    assert all(i[-1] == tokenizer.convert_tokens_to_ids("<|endoftext|>") for i in ids)
    assert reply.model == "qwen3-embed" and [d.index for d in reply.data] == [0, 1, 2]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, ids))
    for got, want_ids in zip(reply.data, ids, strict=True):
        assert len(vector(got.embedding)) == 32
        assert (
            cosine(vector(got.embedding), decoder_reference(dirs["qwen3-embed"], want_ids))
            >= 0.9999
        )


def test_token_arrays_and_matryoshka_dimensions(fleet):
    base, dirs = fleet
    ids = [[5, 9, 13, 40], [11, 12, 13]]
    reply = client(base).embeddings.create(model="qwen3-embed", input=ids, dimensions=8)
    assert reply.usage.prompt_tokens == 7
    for got, want_ids in zip(reply.data, ids, strict=True):
        want = decoder_reference(dirs["qwen3-embed"], want_ids)[:8]
        assert len(got.embedding) == 8 and abs(np.linalg.norm(got.embedding) - 1) < 1e-5
        assert cosine(got.embedding, want) >= 0.9999
    one = client(base).embeddings.create(model="qwen3-embed", input=[5, 9, 13, 40])
    assert cosine(one.data[0].embedding, decoder_reference(dirs["qwen3-embed"], ids[0])) >= 0.9999


def test_encoder_vectors_equal_mlx_embeddings_own(fleet):
    base, dirs = fleet
    reply = client(base).embeddings.create(model="bert-embed", input=BERT_TEXTS)
    tokenizer = AutoTokenizer.from_pretrained(dirs["bert-embed"])
    for got, text in zip(reply.data, BERT_TEXTS, strict=True):
        want = encoder_reference(dirs["bert-embed"], tokenizer.encode(text))
        assert cosine(got.embedding, want) >= 0.9999
    with pytest.raises(openai.BadRequestError, match="does not support 'dimensions'"):
        client(base).embeddings.create(model="bert-embed", input="w5", dimensions=8)


def test_langchain_openai_embeddings(fleet):
    from langchain_openai import OpenAIEmbeddings

    base, dirs = fleet
    # check_embedding_ctx_length=False: send text, not tiktoken's ids (OpenAI's vocabulary)
    embedder = OpenAIEmbeddings(
        model="qwen3-embed",
        base_url=f"{base}/v1",
        api_key="unused",
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = embedder.embed_documents(TEXTS)
    query = embedder.embed_query(TEXTS[0])
    tokenizer = AutoTokenizer.from_pretrained(dirs["qwen3-embed"])
    for got, text in zip(documents, TEXTS, strict=True):
        want = decoder_reference(dirs["qwen3-embed"], tokenizer.encode(text))
        assert cosine(got, want) >= 0.9999
    assert cosine(query, documents[0]) >= 0.9999


def post(base, path, body) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_wrong_model_for_an_endpoint_is_a_400(fleet):
    base, _ = fleet
    listed = {m["id"]: m for m in get_json(f"{base}/v1/models")["data"]}
    assert {name: m["task"] for name, m in listed.items()} == {
        "qwen3-embed": "embed",
        "bert-embed": "embed",
        "chat": "chat",
    }
    assert listed["qwen3-embed"]["dimensions"] == 32
    status, body = post(base, "/v1/embeddings", {"model": "chat", "input": "hello"})
    assert status == 400 and body["error"]["code"] == "model_task_mismatch"
    assert "chat model" in body["error"]["message"]
    chat = {"model": "qwen3-embed", "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/completions", {"model": "bert-embed", "prompt": "hi"}),
    ):
        status, reply = post(base, path, body)
        assert status == 400 and reply["error"]["code"] == "model_task_mismatch", path
        assert "embedding model" in reply["error"]["message"]
    # the chat model beside them still chats
    status, reply = post(
        base, "/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 2}
    )
    assert status == 200 and reply["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "body",
    [
        {"input": ""},
        {"input": []},
        {"input": [[]]},
        {"input": 42},
        {"input": ["ok", 5]},
        {"input": [[1, 2], [3, 99_999]]},
        {"input": "w5 " * 600},  # over the tiny model's 512 positions
        {"input": ["w5"] * 2049},
        {"input": "w5", "encoding_format": "binary"},
        {"input": "w5", "dimensions": 64},
    ],
)
def test_bad_inputs_are_400s(fleet, body):
    base, _ = fleet
    status, reply = post(base, "/v1/embeddings", {"model": "qwen3-embed", **body})
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["message"]


def test_ollama_embed_equals_the_openai_path(fleet):
    """Ollama's /api/embed and the older /api/embeddings, through the `ollama` client and
    LangChain's OllamaEmbeddings, give the vectors /v1/embeddings gives (issue 51)."""
    import ollama
    from langchain_ollama import OllamaEmbeddings

    base, _ = fleet
    reply = client(base).embeddings.create(model="qwen3-embed", input=TEXTS)
    expected = [np.asarray(d.embedding) for d in reply.data]
    ours = ollama.Client(host=base, timeout=120).embed(model="qwen3-embed", input=TEXTS)
    assert len(ours.embeddings) == len(TEXTS) and ours.prompt_eval_count > 0
    for got, want in zip(ours.embeddings, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    old = ollama.Client(host=base, timeout=120).embeddings(model="qwen3-embed", prompt=TEXTS[0])
    np.testing.assert_allclose(old.embedding, expected[0], rtol=1e-5, atol=1e-6)
    chain = OllamaEmbeddings(model="qwen3-embed", base_url=base)
    for got, want in zip(chain.embed_documents(TEXTS), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(chain.embed_query(TEXTS[1]), expected[1], rtol=1e-5, atol=1e-6)


def test_an_embeddings_batch_returns_the_vectors_live_requests_get(fleet):
    """Issue 50: a Batch API batch of /v1/embeddings lines, through the real worker, answers
    each line with the vectors the same body gets live."""
    import time

    base, _ = fleet
    api = client(base)
    bodies = [{"model": "qwen3-embed", "input": text} for text in TEXTS]
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for i, body in enumerate(bodies)
    ]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    source = api.files.create(file=("embed.jsonl", data), purpose="batch")
    batch = api.batches.create(
        input_file_id=source.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
        batch = api.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == len(TEXTS), batch
    answers = {}
    for row in api.files.content(batch.output_file_id).text.splitlines():
        entry = json.loads(row)
        assert entry["response"]["status_code"] == 200, entry
        answers[entry["custom_id"]] = entry["response"]["body"]["data"][0]["embedding"]
    for i, body in enumerate(bodies):
        live = api.embeddings.create(**body, encoding_format="float").data[0].embedding
        np.testing.assert_allclose(answers[f"e{i}"], live, rtol=1e-5, atol=1e-6)
