"""A tiny random-weight config of every architecture the installed mlx-lm builds.

`ARCHITECTURES` maps a label (the model type, or the model type and the variant) to a
config.json-style dict; `build(name)` makes the model the way mlx-lm's loader does (the
module its `model_type` names, through `MODEL_REMAPPING`; `ModelArgs.from_dict`, which keeps the
fields that architecture knows), with random float32 weights evaluated. Sizes are tiny (hidden
64, two to four layers, vocabulary 128) so each builds in milliseconds; sliding windows are 8
tokens and llama4's attention chunks 8, so a 20-token prompt already runs past them. The
architecture-specific fields follow mlx-lm's own tests/test_models.py where it has them.
"""

from __future__ import annotations

import importlib

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.utils import MODEL_REMAPPING

from .attention import ATTENTION
from .base import VOCAB
from .hybrid import HYBRID
from .moe import MOE

ARCHITECTURES: dict[str, dict] = {**ATTENTION, **MOE, **HYBRID}

# modules that define Model and ModelArgs but cannot be built from a tiny config
NOT_BUILT: dict[str, str] = {
    "olmo": "its module imports the ai2-olmo package (and torch), which is not installed",
    "prism_hadamard_qwen35": "a loader for Hadamard-rotated 2-bit packs: its ModelArgs refuses any "
    "config without the pack's quantization and module manifest",
}

# whose make_prompt_cache holds a recurrent state (ArraysCache / MambaCache) beside or instead of
# K/V; tests/unit/scripts/test_arch_zoo.py checks this list against the built models
RECURRENT: frozenset[str] = frozenset(
    {
        "baichuan_m1",
        "bailing_hybrid",
        "bailing_moe_linear",
        "bailing_moe_v3",
        "falcon_h1",
        "granitemoehybrid",
        "jamba",
        "kimi_k3",
        "kimi_linear",
        "lfm2",
        "lfm2-vl",
        "lfm2_moe",
        "longcat_flash_ngram",
        "mamba",
        "mamba2",
        "nemotron_h",
        "olmo_hybrid",
        "plamo2",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "recurrent_gemma",
        "rwkv7",
    }
)

# built everywhere, but whose forward runs only on Apple silicon (MLX's Metal back-end)
NEEDS_METAL: dict[str, str] = {
    "bitnet": "its forward calls a Metal kernel (mx.fast.metal_kernel)",
    "muse_spark": "its forward calls a Metal kernel (mx.fast.metal_kernel)",
    "phi3small": "its forward crashes MLX's CPU back-end (SIGSEGV, mlx 0.32.4), as mlx-lm's "
    "own test config does",
}

__all__ = [
    "ARCHITECTURES",
    "NEEDS_METAL",
    "NOT_BUILT",
    "RECURRENT",
    "VOCAB",
    "build",
    "cache_kinds",
    "caches",
    "is_recurrent",
    "module_for",
    "runs_here",
]


def module_for(config: dict):
    """The mlx-lm module a loader would pick for this config."""
    model_type = MODEL_REMAPPING.get(config["model_type"], config["model_type"])
    return importlib.import_module(f"mlx_lm.models.{model_type}")


def build(name: str, seed: int = 0, **text_fields) -> nn.Module:
    """The architecture `name` with random float32 weights, evaluated; `text_fields` change its
    (text model's) config."""
    config = dict(ARCHITECTURES[name])
    if "text_config" in config:
        config["text_config"] = {**config["text_config"], **text_fields}
    else:
        config.update(text_fields)
    module = module_for(config)
    args = module.ModelArgs.from_dict(config)
    mx.random.seed(seed)
    model = module.Model(args)
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    return model


def runs_here(name: str) -> bool:
    """Whether `name`'s forward can run on this machine (see NEEDS_METAL)."""
    return name not in NEEDS_METAL or mx.metal.is_available()


def caches(model: nn.Module) -> list:
    """The caches mlx-lm's `make_prompt_cache` makes for `model`, CacheLists opened."""
    from mlx_lm.models.cache import CacheList, make_prompt_cache

    flat, pending = [], list(make_prompt_cache(model))
    while pending:
        cache = pending.pop(0)
        if isinstance(cache, CacheList):
            pending[:0] = list(cache.caches)
        else:
            flat.append(cache)
    return flat


def cache_kinds(model: nn.Module) -> list[str]:
    """The class names of `model`'s caches, layer by layer."""
    return [type(cache).__name__ for cache in caches(model)]


def is_recurrent(model: nn.Module) -> bool:
    """Whether `model`'s cache holds recurrent state (an ArraysCache, MambaCache among them)."""
    from mlx_lm.models.cache import ArraysCache

    return any(isinstance(cache, ArraysCache) for cache in caches(model))
