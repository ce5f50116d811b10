"""The worker's embeddings equal the reference of the same weights: mlx-lm's trunk pooled by
hand for a decoder, mlx-embeddings' own vectors for an encoder; batched (right-padded) or
alone; Matryoshka truncation renormalizes."""

from __future__ import annotations

import dataclasses
import shutil

import mlx.core as mx
import numpy as np
import pytest

from shared.models.embedding import embedding_spec
from tests.support.arch_zoo.embedders import (
    cosine,
    decoder_reference,
    encoder_reference,
    save_bert_embedder,
    save_qwen3_embedder,
)
from worker.embed.embedder import Embedder
from worker.embed.pooling import finish
from worker.embed.trunk import bare_trunk, load_trunk

INPUTS = [[5, 9, 13, 40, 7, 22, 3], [11, 12], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 50], [8]]


def embed(directory, inputs, pooling=None, max_batch_tokens=8192):
    spec = embedding_spec(directory)
    if pooling is not None:
        spec = dataclasses.replace(spec, pooling=pooling)
    embedder = Embedder(load_trunk(directory, spec, "float32"), spec, max_batch_tokens)
    return finish(embedder.vectors(inputs), spec.normalize), embedder


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_qwen3_embedder(tmp_path_factory.mktemp("qwen3-embed") / "m", seed=4)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_bert_embedder(tmp_path_factory.mktemp("bert") / "m", seed=5)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_decoder_vectors_equal_the_trunk_pooled_by_hand(qwen3_dir, pooling):
    vectors, _ = embed(qwen3_dir, INPUTS, pooling)
    for ids, got in zip(INPUTS, vectors, strict=True):
        assert cosine(got, decoder_reference(qwen3_dir, ids, pooling)) >= 0.9999
        assert abs(np.linalg.norm(got) - 1) < 1e-5


def test_batches_of_any_size_give_the_same_vectors(qwen3_dir, monkeypatch):
    monkeypatch.setattr("worker.embed.embedder.MAX_PADDING_RATIO", 100.0)  # pad freely
    together, embedder = embed(qwen3_dir, INPUTS)
    apart, small = embed(qwen3_dir, INPUTS, max_batch_tokens=11)
    assert len(embedder.batches(INPUTS)) == 1 and len(small.batches(INPUTS)) > 2
    assert np.allclose(together, apart, atol=1e-5)


def test_batches_keep_padding_bounded():
    embedder = Embedder(None, None, max_batch_tokens=64)
    lengths = [30, 8, 9, 10, 31, 32, 11, 2]
    batches = embedder.batches([[1] * n for n in lengths])
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        real = sum(lengths[i] for i in batch)
        assert len(batch) * max(lengths[i] for i in batch) <= max(64, 1.25 * real)
    assert [len(b) for b in batches] == [1, 4, 2, 1]  # 2 | 8 9 10 11 | 30 31 | 32: 64 tokens


def test_a_trunk_saved_alone_loads_as_qwen3_embedding_ships(qwen3_dir, tmp_path):
    """Qwen3-Embedding's safetensors hold `layers.0...` (no `model.`, no head)."""
    bare = tmp_path / "bare"
    shutil.copytree(qwen3_dir, bare)
    weights = mx.load(str(bare / "model.safetensors"))
    trunk = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
    mx.save_safetensors(str(bare / "model.safetensors"), trunk)
    assert bare_trunk(bare) and not bare_trunk(qwen3_dir)
    vectors, _ = embed(bare, INPUTS)
    for ids, got in zip(INPUTS, vectors, strict=True):
        assert cosine(got, decoder_reference(qwen3_dir, ids)) >= 0.9999


def test_encoder_vectors_equal_mlx_embeddings_own(bert_dir):
    spec = embedding_spec(bert_dir)
    assert spec.encoder and spec.pooling == "mean" and spec.normalize and not spec.matryoshka
    inputs = [[2, *ids[:6], 3] for ids in INPUTS]  # [CLS] ... [SEP], as its tokenizer writes
    vectors, _ = embed(bert_dir, inputs)
    for ids, got in zip(inputs, vectors, strict=True):
        assert cosine(got, encoder_reference(bert_dir, ids)) >= 0.9999


def test_matryoshka_truncates_then_normalizes():
    full = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    cut = finish(full, normalize=True, dimensions=2)
    assert cut.shape == (1, 2) and np.allclose(cut, [[0.6, 0.8]])
    assert np.allclose(finish(full, normalize=False), full)


def test_an_encoder_without_the_extra_is_refused_saying_how(bert_dir, monkeypatch):
    import sys

    from worker.embed.trunk import TrunkUnavailable

    monkeypatch.setitem(sys.modules, "mlx_embeddings.utils", None)  # as if not installed
    with pytest.raises(TrunkUnavailable, match=r"mlx-fleet\[embeddings\]"):
        load_trunk(bert_dir, embedding_spec(bert_dir))
