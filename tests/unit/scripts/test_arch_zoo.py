"""The architecture zoo stays valid as mlx-lm moves: every architecture module the installed
mlx-lm has is in it (or in NOT_BUILT with a reason), and every config builds and runs a
prefill and a decode step under mlx-lm with its own cache."""

from __future__ import annotations

import importlib
import pkgutil

import mlx.core as mx
import mlx_lm.models
import pytest
from mlx_lm.models.cache import make_prompt_cache

from tests.support.arch_zoo import (
    ARCHITECTURES,
    NEEDS_METAL,
    NOT_BUILT,
    RECURRENT,
    build,
    caches,
    is_recurrent,
    module_for,
    runs_here,
)

MAX_WINDOW = 16  # so a test prompt of a few dozen tokens runs past every sliding window


def architecture_modules() -> set[str]:
    """mlx-lm's model modules that define a Model and its ModelArgs."""
    names = set()
    for info in pkgutil.iter_modules(mlx_lm.models.__path__):
        if info.name in NOT_BUILT:
            continue
        module = importlib.import_module(f"mlx_lm.models.{info.name}")
        if hasattr(module, "Model") and hasattr(module, "ModelArgs"):
            names.add(info.name)
    return names


def test_every_architecture_module_is_in_the_zoo_or_says_why_not():
    built = {module_for(config).__name__.rsplit(".", 1)[-1] for config in ARCHITECTURES.values()}
    assert architecture_modules() - built == set()
    assert not set(NOT_BUILT) & built


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_config_builds_and_runs_prefill_and_decode(name):
    model = build(name)
    assert is_recurrent(model) == (name in RECURRENT)
    windows = [c.max_size for c in caches(model) if type(c).__name__ == "RotatingKVCache"]
    assert all(w <= MAX_WINDOW for w in windows), windows
    if not runs_here(name):
        pytest.skip(f"{name}: {NEEDS_METAL[name]}; this machine has no Metal")
    cache = make_prompt_cache(model)
    prefill = model(mx.array([[1, 2, 3]]), cache=cache)
    decode = model(mx.argmax(prefill[:, -1:], axis=-1), cache=cache)
    vocab = ARCHITECTURES[name].get("vocab_size", 128)
    assert prefill.shape == (1, 3, vocab) and decode.shape == (1, 1, vocab)
    assert mx.all(mx.isfinite(decode)).item()
