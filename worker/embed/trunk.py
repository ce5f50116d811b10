"""Load an embedding model as a trunk: token ids and a mask in, final hidden states out.

Decoders (Qwen3-Embedding and any mlx-lm model with a `model` trunk) load as chat models do
(shared/models/loading.py: the same compute dtype choice) and run the trunk without the head.
Encoders (BERT family) load through mlx-embeddings, the optional `embeddings` extra."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from shared.models.embedding import EmbeddingSpec
from shared.models.loading import load_model, resolve_compute_dtype

Trunk = Callable[[mx.array, mx.array], mx.array]  # (ids (B,T), mask (B,T)) -> (B,T,H)
EXTRA_HINT = "pip install 'mlx-fleet[embeddings]' (mlx-embeddings), or scripts/setup"


class TrunkUnavailable(RuntimeError):
    """The model cannot be served as an embedding model here (the message says why)."""


def load_trunk(model_dir: Path, spec: EmbeddingSpec, compute_dtype: str = "auto") -> Trunk:
    if spec.encoder:
        return _encoder(Path(model_dir), compute_dtype)
    return _decoder(Path(model_dir), compute_dtype)


def _decoder(model_dir: Path, compute_dtype: str) -> Trunk:
    model, _ = load_model(model_dir, compute_dtype)
    inner = getattr(model, "model", None)
    if not callable(inner):
        raise TrunkUnavailable(
            f"{model_dir}: this mlx-lm architecture has no `model` trunk to embed with"
        )
    return lambda ids, _mask: inner(ids)  # causal: right padding never reaches real tokens


def _encoder(model_dir: Path, compute_dtype: str) -> Trunk:
    try:
        from mlx_embeddings.utils import load_model as load_encoder
    except ImportError as exc:
        raise TrunkUnavailable(f"{model_dir} is an encoder model: {EXTRA_HINT}") from exc
    try:
        model = load_encoder(model_dir)
    except (ValueError, FileNotFoundError) as exc:
        raise TrunkUnavailable(f"{model_dir}: mlx-embeddings cannot load it ({exc})") from exc
    dtype = resolve_compute_dtype(compute_dtype)
    if dtype != "quantized":
        model.set_dtype(getattr(mx, dtype))

    def forward(ids: mx.array, mask: mx.array) -> mx.array:
        return model(ids, attention_mask=mask.astype(mx.float32)).last_hidden_state

    return forward
