"""Chat model or embedding model, and how it pools: read from the directory the way the router
and the worker both read it (shared/models/embedding.py)."""

from __future__ import annotations

import json

import pytest

from shared.models.embedding import NotServable, embedding_spec, model_task


def model_dir(tmp_path, config, files=None):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 16, **config}))
    for name, content in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(content))
    return tmp_path


def test_a_causal_lm_is_a_chat_model_unless_declared(tmp_path):
    path = model_dir(tmp_path, {"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    assert model_task(path) == "chat" and embedding_spec(path) is None
    spec = embedding_spec(path, "embed")
    assert (spec.pooling, spec.normalize, spec.dimensions, spec.encoder) == (
        "last",
        True,
        16,
        False,
    )
    assert not spec.matryoshka


@pytest.mark.parametrize(
    "architecture", ["GPT2LMHeadModel", "QWenLMHeadModel", "ChatGLMModel", "LlamaForCausalLM"]
)
def test_heads_named_like_trunks_are_chat_models(tmp_path, architecture):
    assert model_task(model_dir(tmp_path, {"architectures": [architecture]})) == "chat"


def test_a_bare_trunk_or_an_encoder_type_is_an_embedding_model(tmp_path):
    assert model_task(model_dir(tmp_path, {"architectures": ["Qwen3Model"]})) == "embed"
    bert = embedding_spec(model_dir(tmp_path, {"model_type": "bert", "architectures": []}))
    assert bert.encoder and bert.pooling == "mean"
    assert embedding_spec(tmp_path, "chat") is None  # declared wins


def test_sentence_transformers_files_set_pooling_and_normalize(tmp_path):
    modules = [
        {"type": "sentence_transformers.models.Transformer"},
        {"type": "sentence_transformers.models.Pooling"},
    ]
    path = model_dir(
        tmp_path,
        {"model_type": "qwen3"},
        {
            "modules.json": modules,
            "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
        },
    )
    spec = embedding_spec(path)
    assert spec.pooling == "mean" and not spec.normalize and spec.matryoshka  # Qwen3: MRL


@pytest.mark.parametrize(
    "files",
    [
        {"modules.json": [{"type": "sentence_transformers.models.Dense"}]},
        {"1_Pooling/config.json": {"pooling_mode_max_tokens": True}},
    ],
)
def test_a_pipeline_not_served_is_refused_in_one_sentence(tmp_path, files):
    with pytest.raises(NotServable, match="not served|served poolings"):
        embedding_spec(model_dir(tmp_path, {}, files))


def test_a_declared_matryoshka_model_may_truncate(tmp_path):
    path = model_dir(tmp_path, {"model_type": "bert", "matryoshka_dimensions": [8, 16]})
    assert embedding_spec(path).matryoshka
