"""Which mlx-lm models the paged engine serves correctly, checked when a worker loads one.

The paged KV hooks into mlx-lm through one seam (`worker.attention.hook`). A model whose
attention does not call it, that uses a sliding window (the window lives in the cache's mask,
which the paged cache replaces) or attention sinks, or whose layers are not all plain attention,
would give wrong tokens without an error; such models are refused at load, by name.

Architectures in `COVERED_ARCHITECTURES` are those the greedy-equality tests
(tests/unit/worker/engine/test_engine.py) run. Any other model is served only if the seam probe passes and a
one-prompt greedy comparison with plain mlx-lm matches (`Engine` runs it at load).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

COVERED_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class UnsupportedModel(ValueError):
    """This model cannot be served over the paged KV; the message says why."""


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: mx.Dtype
    vocab_size: int
    num_heads: int = 0  # query heads (0: unknown)


def model_type(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def probe_shape(model: nn.Module) -> ModelShape:
    """Layer count, KV heads, head dim and the K/V dtype, read off a one-token forward with
    mlx-lm's own cache; refuses models whose caches are not all plain full-attention KV."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    cache = make_prompt_cache(model)
    kinds = sorted({type(c).__name__ for c in cache if type(c) is not KVCache})
    if kinds:
        why = (
            "a sliding-window attention cache"
            if any("Rotating" in k for k in kinds)
            else "layers that are not plain attention"
        )
        raise UnsupportedModel(
            f"model type {model_type(model)!r} uses {why} ({', '.join(kinds)}); the paged KV "
            "serves only models whose every layer is full causal attention"
        )
    logits = model(mx.array([[0]]), cache=cache)
    keys = cache[0].state[0]
    heads = getattr(getattr(model, "args", None), "num_attention_heads", 0) or keys.shape[1]
    return ModelShape(
        len(cache), keys.shape[1], keys.shape[3], keys.dtype, logits.shape[-1], int(heads)
    )


def check_seam(model: nn.Module, caches: list) -> None:
    """After a one-token paged forward whose layer caches are `caches`: raise
    UnsupportedModel unless every layer wrote its K/V and attended through the hook once,
    with no sliding window asked of the mask."""
    name = model_type(model)
    attended = sum(c.attends == 1 for c in caches)
    wrote = sum(c.writes == 1 for c in caches)
    if attended != len(caches) or wrote != len(caches):
        raise UnsupportedModel(
            f"model type {name!r}: {attended} of {len(caches)} layers attended through "
            "mlx_lm.models.base.scaled_dot_product_attention and "
            f"{wrote} wrote K/V through the cache; its attention bypasses the paged-KV seam"
        )
    windows = sorted({w for c in caches for w in c.window_sizes})
    if windows:
        raise UnsupportedModel(
            f"model type {name!r} uses sliding-window attention (window {windows}); "
            "the paged KV does not implement sliding windows"
        )


def reference_greedy(model: nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Plain mlx-lm greedy decoding of `prompt` (the load-time comparison's reference)."""
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda x: mx.argmax(x, axis=-1)
    ):
        out.append(int(token))
    return out


def verification_prompt(vocab_size: int, length: int) -> list[int]:
    """A fixed prompt of `length` ids spread over the vocabulary (no tokenizer needed)."""
    return [(7919 * i + 13) % vocab_size for i in range(length)]
