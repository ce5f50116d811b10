"""Load an embedding model as a trunk: token ids and a mask in, final hidden states out.

Decoders (Qwen3-Embedding and any mlx-lm model with a `model` trunk) load as chat models do
(shared/models/loading.py: the same compute dtype choice) and run the trunk without the head.
Encoders (BERT family) load through mlx-embeddings, the optional `embeddings` extra."""

from __future__ import annotations

import json
import struct
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
    if bare_trunk(model_dir):
        model = _load_bare_trunk(model_dir, compute_dtype)
    else:
        model, _ = load_model(model_dir, compute_dtype)
    inner = getattr(model, "model", None)
    if not callable(inner):
        raise TrunkUnavailable(
            f"{model_dir}: this mlx-lm architecture has no `model` trunk to embed with"
        )
    return lambda ids, _mask: inner(ids)  # causal: right padding never reaches real tokens


def bare_trunk(model_dir: Path) -> bool:
    """Weights saved from the trunk alone (`Qwen3Model`: `layers.0...`, no `model.` prefix
    and no head), as Qwen3-Embedding ships them; read from the safetensors headers only."""
    names = [name for path in model_dir.glob("model*.safetensors") for name in _tensor_names(path)]
    return bool(names) and not any(name.startswith(("model.", "lm_head.")) for name in names)


def _tensor_names(path: Path) -> list[str]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return [name for name in json.loads(f.read(size)) if name != "__metadata__"]


def _load_bare_trunk(model_dir: Path, compute_dtype: str):
    """mlx-lm's model of the architecture with the trunk's weights put under `model.`; its
    head, never run here, is tied to the embedding so that nothing is missing."""
    from mlx_lm.utils import _get_classes, dequantize_model
    from mlx_lm.utils import load_model as load_mlx_lm

    def prefixed(config: dict):
        model_class, args_class = _get_classes(config)

        class Prefixed(model_class):
            def sanitize(self, weights):
                weights = {f"model.{name}": value for name, value in weights.items()}
                return super().sanitize(weights) if hasattr(super(), "sanitize") else weights

        return Prefixed, args_class

    model, _ = load_mlx_lm(
        model_dir, model_config={"tie_word_embeddings": True}, get_model_classes=prefixed
    )
    dtype = resolve_compute_dtype(compute_dtype)
    if dtype != "quantized":
        model = dequantize_model(model)
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


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
