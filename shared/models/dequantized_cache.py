"""Dequantized weights kept on disk, so that a (re)started CPU worker skips dequantizing.

On MLX's CPU backend a quantized model is dequantized to float32 at every load (see
shared/models/loading.py). For SmolLM2-135M that was 2.8 s of a worker's ~10 s restart on
this 2-core machine; reading the saved float32 weights back takes 1.0 s (540 MB). The file
is keyed by the model directory's path and its weight files' sizes and mtimes, so a changed
model is never served stale weights; it is written once, atomically.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from shared.models.store import cache_dir, read_config

log = logging.getLogger(__name__)


def is_quantized(model_dir: Path) -> bool:
    try:
        return "quantization" in read_config(model_dir)
    except (OSError, ValueError):
        return False


def cached_weights_path(model_dir: Path, dtype: str) -> Path:
    """Where `model_dir`'s weights in `dtype` are (or will be) kept."""
    key = hashlib.sha256(f"{model_dir.resolve()}|{dtype}".encode())
    for weights in sorted(model_dir.glob("*.safetensors")):
        st = weights.stat()
        key.update(f"|{weights.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return (
        cache_dir() / "dequantized" / f"{model_dir.name}-{dtype}-{key.hexdigest()[:16]}.safetensors"
    )


def load_cached(model, path: Path) -> bool:
    """Replace `model`'s (lazy, dequantized) parameters by the saved ones; False if none or
    unreadable (the caller then evaluates the dequantization itself)."""
    if not path.exists():
        return False
    try:
        model.load_weights(str(path))
    except (OSError, ValueError, RuntimeError) as exc:
        log.warning("ignoring unreadable cached weights %s: %s", path, exc)
        return False
    return True


def save(model, path: Path) -> None:
    """Save the evaluated parameters (best effort: a full disk only costs the next load time)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tmp = path.with_name(f".{os.getpid()}.tmp.{path.name}")  # MLX adds .safetensors if absent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(tmp), dict(tree_flatten(model.parameters())))
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        log.warning("could not keep dequantized weights at %s: %s", path, exc)
        tmp.unlink(missing_ok=True)
