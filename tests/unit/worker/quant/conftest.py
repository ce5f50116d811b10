"""Tiny random models whose head_dim (64) MLX can quantize in groups of 32 or 64."""

from __future__ import annotations

import importlib

import mlx.core as mx
import pytest

from tests.support.engine_fixtures import VOCAB


def tiny_quantizable_model(arch: str = "llama", seed: int = 0):
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    args = dict(
        model_type=arch, hidden_size=128, num_hidden_layers=2, intermediate_size=192,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
        vocab_size=VOCAB, max_position_embeddings=512, rope_theta=10000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    fields = module.ModelArgs.__dataclass_fields__
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs(**{k: v for k, v in args.items() if k in fields}))
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def qmodel(request):
    return tiny_quantizable_model(request.param)
