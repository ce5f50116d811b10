"""Load an mlx-lm model directory, choosing the compute dtype for the device.

On Metal, quantized matmuls are fast: keep the weights as saved. On MLX's CPU backend,
quantized and float16 matmuls have no BLAS path (4-bit SmolLM2 decoded at 6.6 tok/s vs 16
in float32 here), so dequantize to float32.
"""

from __future__ import annotations

from pathlib import Path

COMPUTE_DTYPES = ("auto", "float32", "float16", "bfloat16", "quantized")


def metal_available() -> bool:
    import mlx.core as mx

    try:
        return bool(mx.metal.is_available())
    except AttributeError:  # pragma: no cover - older MLX without the metal module
        return False


def resolve_compute_dtype(choice: str = "auto") -> str:
    if choice not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype must be one of {COMPUTE_DTYPES}, got {choice!r}")
    if choice != "auto":
        return choice
    return "quantized" if metal_available() else "float32"


def load_model(model_dir: Path, compute_dtype: str = "auto", lazy: bool = False):
    """(model, tokenizer) for a local mlx-lm directory, in the chosen compute dtype.

    `lazy`: the weights are not read yet; the caller evaluates them (a tensor-parallel rank
    shards first, so that it only ever holds its own shard, not the whole model)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.utils import dequantize_model

    from shared.models import dequantized_cache

    dtype = resolve_compute_dtype(compute_dtype)
    keep = not lazy and dtype != "quantized" and dequantized_cache.is_quantized(Path(model_dir))
    cached = dequantized_cache.cached_weights_path(Path(model_dir), dtype) if keep else None
    model, tokenizer = load(str(model_dir), lazy=lazy or cached is not None)[:2]
    if dtype != "quantized":
        model = dequantize_model(model)
        model.set_dtype(getattr(mx, dtype))
    if cached is not None and dequantized_cache.load_cached(model, cached):
        cached = None  # loaded from it: nothing to save
    if not lazy:
        mx.eval(model.parameters())
    if cached is not None:
        dequantized_cache.save(model, cached)
    return model, tokenizer
