"""The router alone (in process): a model declared `task = "embed"` refuses the chat
endpoints and chat workers, and a chat model refuses /v1/embeddings; each a 400 naming the
model, before any worker is asked."""

from __future__ import annotations

import pytest

from router.config import ModelSpec
from router.http import app_keys
from shared.protocol import Register
from tests.support.tp_group import save_tiny_model


@pytest.fixture
async def embed_router(make_cluster, tmp_path):
    directory = save_tiny_model(tmp_path / "tiny-llama")  # a chat model, declared embed
    return await make_cluster(models=(ModelSpec(directory, id="emb", task="embed"),))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
async def test_an_embedding_model_refuses_chat(embed_router, path, body):
    resp = await embed_router.client.post(path, json={"model": "emb", **body})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "model_task_mismatch" and "embedding model" in error["message"]


async def test_a_chat_worker_is_refused_and_embeddings_wait_for_an_embed_worker(embed_router):
    cluster = embed_router.app[app_keys.CLUSTER]
    cluster.handle(b"w-chat", Register("w-chat", "emb", 32, 64, "host", 1))
    assert cluster.registry.healthy("emb") == []
    resp = await embed_router.client.post("/v1/embeddings", json={"model": "emb", "input": "hi"})
    assert resp.status == 503  # no embed worker yet: the input itself was fine


async def test_a_chat_model_refuses_embeddings(make_cluster):
    router = await make_cluster()
    await router.add_worker("w1")
    model = router.app[app_keys.MODELS].default.id
    resp = await router.client.post("/v1/embeddings", json={"model": model, "input": "hi"})
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "model_task_mismatch"


def test_an_embedding_pipeline_not_served_stops_the_router_in_one_line(tmp_path):
    import json

    from router.cli import check_embedding_models
    from router.config import RouterConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (tmp_path / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Dense"}])
    )
    config = RouterConfig(models=(ModelSpec(tmp_path, id="st"),))
    with pytest.raises(SystemExit, match="model st: .*Dense step, which is not served"):
        check_embedding_models(config)
