"""Tiny random models whose head_dim (64) MLX can quantize in groups of 32 or 64."""

from __future__ import annotations

import pytest

from tests.support.engine_fixtures import tiny_quantizable_model

__all__ = ["tiny_quantizable_model"]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def qmodel(request):
    return tiny_quantizable_model(request.param)
