"""Is a model directory a chat model or an embedding model, and how does it pool?

The router (to answer /v1/embeddings, and to refuse chat on an embedding model) and the worker
(to load the right thing) both read it here, from the same directory, so they agree.

An embedding model is one that says so: a `[[models]]` entry's `task = "embed"`, the files
sentence-transformers writes (`modules.json`, `1_Pooling/config.json`), or a config.json whose
`architectures` are a bare encoder or decoder trunk (`BertModel`, `Qwen3Model`) rather than a
head that writes text (`...ForCausalLM`). Encoders (BERT family) are served through the
`mlx-embeddings` extra; decoders (Qwen3-Embedding family) through mlx-lm's own model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shared.config.choices import MODEL_TASKS, POOLINGS

# model types mlx-embeddings serves and mlx-lm does not: read through the extra
ENCODER_TYPES = ("bert", "xlm-roberta", "xlm_roberta", "modernbert")
# decoder families trained with Matryoshka representation learning: a prefix of the vector is
# itself an embedding (Qwen3-Embedding: "MRL support", 32 to the full width)
MATRYOSHKA_DECODERS = ("qwen3",)
_POOLING_KEYS = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
_ST_MODULES = ("Transformer", "Pooling", "Normalize")  # the sentence-transformers steps we run


class NotServable(ValueError):
    """An embedding model whose pipeline we do not run (the message says which part)."""


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    """How an embedding model's vectors are made and what a request may ask of them."""

    pooling: str  # POOLINGS: the last token's state, the mean over tokens, or the first's
    normalize: bool  # L2-normalized (sentence-transformers' Normalize step, or the default)
    dimensions: int  # the full vector's width (the model's hidden size)
    matryoshka: bool  # `dimensions` may truncate it (then it is normalized again)
    encoder: bool  # a BERT-family encoder (mlx-embeddings), else an mlx-lm decoder


def model_task(model_dir: Path, declared: str | None = None) -> str:
    """ "chat" or "embed": `declared` (a [[models]] `task`) when given, else detected."""
    if declared is not None:
        if declared not in MODEL_TASKS:
            raise ValueError(f"task must be one of {MODEL_TASKS}, got {declared!r}")
        return declared
    model_dir = Path(model_dir)
    if (model_dir / "modules.json").is_file() or (model_dir / "1_Pooling").is_dir():
        return "embed"
    config = _read(model_dir / "config.json")
    if str(config.get("model_type", "")) in ENCODER_TYPES:
        return "embed"
    architectures = [str(a) for a in config.get("architectures") or []]
    if architectures and all(map(_bare_trunk_name, architectures)):
        return "embed"  # a trunk without a head: BertModel, Qwen3Model
    return "chat"


def _bare_trunk_name(architecture: str) -> bool:
    """`BertModel`, `Qwen3Model`; not a head (`GPT2LMHeadModel`, `...ForCausalLM`), nor a
    chat model whose class is named like a trunk (ChatGLM's `ChatGLMModel`)."""
    named_like_trunk = architecture.endswith("Model") and not architecture.startswith("ChatGLM")
    return named_like_trunk and "For" not in architecture and "Head" not in architecture


def embedding_spec(model_dir: Path, declared: str | None = None) -> EmbeddingSpec | None:
    """The model's EmbeddingSpec, or None for a chat model; NotServable for an embedding
    pipeline we do not run (a Dense projection, max pooling)."""
    model_dir = Path(model_dir)
    if model_task(model_dir, declared) != "embed":
        return None
    config = _read(model_dir / "config.json")
    text = config.get("text_config") or config
    encoder = str(config.get("model_type", "")) in ENCODER_TYPES
    width = text.get("hidden_size") or text.get("d_model")
    if not isinstance(width, int) or width < 1:
        raise NotServable(f"{model_dir}: config.json has no hidden_size")
    steps = _st_modules(model_dir)
    pooling = _pooling(model_dir, config) or ("mean" if encoder else "last")
    normalize = "Normalize" in steps if steps else True
    declared_mrl = bool(config.get("matryoshka_dimensions")) or bool(
        _read(model_dir / "config_sentence_transformers.json").get("matryoshka_dimensions")
    )
    matryoshka = declared_mrl or (not encoder and config.get("model_type") in MATRYOSHKA_DECODERS)
    return EmbeddingSpec(pooling, normalize, width, matryoshka, encoder)


def _st_modules(model_dir: Path) -> tuple[str, ...]:
    """The sentence-transformers steps modules.json lists (last part of each type name)."""
    listed = _read(model_dir / "modules.json", default=[])
    steps = tuple(str(m.get("type", "")).rsplit(".", 1)[-1] for m in listed if isinstance(m, dict))
    if unknown := [s for s in steps if s not in _ST_MODULES]:
        raise NotServable(
            f"{model_dir}: its sentence-transformers pipeline has a {unknown[0]} step, "
            "which is not served (only Transformer, Pooling and Normalize are)"
        )
    return steps


def _pooling(model_dir: Path, config: dict) -> str | None:
    """`1_Pooling/config.json`'s mode, else config.json's `pooling`, else None."""
    pooling_config = _read(model_dir / "1_Pooling" / "config.json")
    modes = [name for key, name in _POOLING_KEYS.items() if pooling_config.get(key)]
    others = [k for k, v in pooling_config.items() if k.startswith("pooling_mode") and v]
    if len(others) > len(modes) or len(modes) > 1:
        raise NotServable(
            f"{model_dir}: 1_Pooling asks for {', '.join(others)}; served poolings are "
            "lasttoken, mean_tokens and cls_token, one at a time"
        )
    if modes:
        return modes[0]
    declared = config.get("pooling")
    if declared is not None and declared not in POOLINGS:
        raise NotServable(f"{model_dir}: config.json pooling {declared!r} is not one of {POOLINGS}")
    return declared


def _read(path: Path, default=None):
    if not path.is_file():
        return {} if default is None else default
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NotServable(f"{path}: not readable JSON ({exc})") from exc
