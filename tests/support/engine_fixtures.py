"""Tiny random-weight mlx-lm models of each supported architecture, and reference decoding."""

from __future__ import annotations

import importlib
import random

import mlx.core as mx
from mlx_lm.generate import generate_step

from worker.config import EngineConfig
from worker.engine.engine import Engine
from worker.engine.step_kind import REFERENCE_COSTS

VOCAB = 97

_COMMON = dict(
    hidden_size=48,
    num_hidden_layers=2,
    intermediate_size=96,
    num_attention_heads=6,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB,
    max_position_embeddings=512,
)
ARCHS = {
    "llama": ("llama", dict(rope_theta=10000.0, tie_word_embeddings=False)),
    "llama-traditional-rope": (
        "llama",
        dict(rope_theta=10000.0, rope_traditional=True, tie_word_embeddings=True),
    ),
    "mistral": ("llama", dict(model_type="mistral", rope_theta=1e6, tie_word_embeddings=False)),
    "qwen2": ("qwen2", dict(rope_theta=1e6, tie_word_embeddings=True)),
    "qwen3": ("qwen3", dict(rope_theta=1e6, tie_word_embeddings=True, head_dim=8)),
}


def tiny_model(arch: str = "llama", seed: int = 0, vocab_size: int = VOCAB):
    module_name, extra = ARCHS[arch]
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    fields = module.ModelArgs.__dataclass_fields__
    args = {"model_type": module_name, **_COMMON, **extra, "vocab_size": vocab_size}
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs(**{k: v for k, v in args.items() if k in fields}))
    mx.eval(model.parameters())
    return model


def tiny_quantizable_model(
    arch: str = "llama", seed: int = 0, vocab_size: int = VOCAB, num_layers: int = 2
):
    """A tiny random model with head_dim 64, which MLX can quantize (`--kv-bits`) in groups of
    32 or 64 (the models above have head dims 8-16): "llama", "qwen2" or "qwen3"."""
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    args = dict(
        model_type=arch,
        hidden_size=128,
        num_hidden_layers=num_layers,
        intermediate_size=192,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    fields = module.ModelArgs.__dataclass_fields__
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs(**{k: v for k, v in args.items() if k in fields}))
    mx.eval(model.parameters())
    return model


def reference_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's own greedy decoding: the answer the engine must reproduce exactly."""
    out = []
    for token, _ in generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        out.append(int(token))
    return out


def _config(**overrides) -> EngineConfig:
    config = dict(
        block_size=8, num_blocks=256, prefill_chunk=64, step_token_budget=256, warmup=False
    )
    return EngineConfig(**{**config, **overrides})


# The default model's prices for the fold rule: a tiny model's steps take the kinds the default
# model's would (its own weight pass costs next to nothing, so it would never fold).
PRICES = REFERENCE_COSTS


def make_engine(model, grammars=None, **overrides) -> Engine:
    """An engine over an in-memory model (`Engine.create`)."""
    config = _config(**overrides)
    return Engine.create(model, config, max_context=512, grammars=grammars, costs=PRICES)


def load_engine(model_dir, **overrides) -> Engine:
    """An engine over a model directory, loaded as a worker loads it (`Engine.from_path`)."""
    return Engine.from_path(model_dir, _config(**overrides), costs=PRICES)


def run_to_completion(engine: Engine, max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until idle; the tokens each request produced, with finish reasons checked."""
    outputs: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return outputs
        for delta in engine.step():
            assert delta.error is None, delta.error
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    raise AssertionError("engine did not finish")


# what MLX raises on Metal when one allocation is over the device's limit
METAL_OOM = "[metal::malloc] Attempting to allocate 4294967296 bytes which is greater than the "
METAL_OOM += "maximum allowed buffer size of 3221225472 bytes."


def random_prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]


def drive(engine: Engine, outputs: dict, errors: dict, max_steps: int = 500) -> None:
    """Step until idle, collecting each request's tokens and its error, if it ends in one."""
    for _ in range(max_steps):
        if not engine.has_work():
            return
        for delta in engine.step():
            if delta.error:
                errors[delta.request_id] = delta.error
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    raise AssertionError("engine did not finish")
