"""A quantized model loaded for the CPU is dequantized once; later loads read the saved
float32 weights (a restarted worker skips ~2 s), never stale or corrupt ones."""

from __future__ import annotations

import shutil

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.utils import quantize_model, save_config, save_model

from shared.models import dequantized_cache
from shared.models.loading import load_model

CONFIG = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=512,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


@pytest.fixture
def quantized_dir(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("MLX_FLEET_CACHE", str(tmp_path / "cache"))
    directory = tmp_path / "q4"
    shutil.copytree(tiny_model_dir, directory)  # the tokenizer files
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    model, config = quantize_model(model, dict(CONFIG), group_size=32, bits=4)
    save_model(directory, model)
    save_config(config, directory / "config.json")
    return directory


def weights(model) -> dict:
    return dict(tree_flatten(model.parameters()))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_second_load_reads_the_saved_float32_weights(quantized_dir):
    first, _ = load_model(quantized_dir, "float32")
    saved = dequantized_cache.cached_weights_path(quantized_dir, "float32")
    assert saved.exists()
    saved.touch()
    stamp = saved.stat().st_mtime_ns
    second, _ = load_model(quantized_dir, "float32")
    assert same(weights(first), weights(second))
    assert saved.stat().st_mtime_ns == stamp  # read, not written again
    assert all(v.dtype == mx.float32 for v in weights(second).values())


def test_changed_model_gets_a_new_file(quantized_dir):
    load_model(quantized_dir, "float32")
    old = dequantized_cache.cached_weights_path(quantized_dir, "float32")
    (
        quantized_dir / "model.safetensors"
    ).touch()  # a new mtime: a different model as far as we know
    assert dequantized_cache.cached_weights_path(quantized_dir, "float32") != old


def test_corrupt_saved_weights_are_ignored(quantized_dir):
    reference, _ = load_model(quantized_dir, "float32")
    saved = dequantized_cache.cached_weights_path(quantized_dir, "float32")
    saved.write_bytes(b"not a safetensors file")
    again, _ = load_model(quantized_dir, "float32")
    assert same(weights(reference), weights(again))
    assert saved.stat().st_size > 1000  # written afresh for the next load


def test_quantized_compute_keeps_no_copy(quantized_dir):
    load_model(quantized_dir, "quantized")
    assert not dequantized_cache.cached_weights_path(quantized_dir, "quantized").exists()
