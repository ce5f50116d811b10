"""Tiny vision-language model directories (the families the router places images for), the
images sent in the tests, and a router serving one of them before stand-in workers."""

from __future__ import annotations

import base64

import pytest

from router.config import ModelSpec

VLM = "vlm"


@pytest.fixture(scope="session")
def vision_dirs(tmp_path_factory):
    pytest.importorskip("mlx_vlm", reason="the vision extra builds the tiny checkpoints")
    from tests.support.arch_zoo.vision import FAMILIES, build_vision_model

    root = tmp_path_factory.mktemp("vision-models")
    return {family: build_vision_model(family, root / family) for family in FAMILIES}


@pytest.fixture(params=["gemma3", "mistral3", "qwen2_5_vl", "qwen3_vl"])
def vision_dir(request, vision_dirs):
    return vision_dirs[request.param]


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def png(width: int = 40, height: int = 60, seed: int = 0) -> bytes:
    from tests.support.arch_zoo.vision import sample_image

    return sample_image(width, height, seed)


def chat_image(data: bytes, text: str = "What is this?", **image_url) -> dict:
    """An OpenAI chat body with one user message: text, then the image."""
    part = {"type": "image_url", "image_url": {"url": data_url(data), **image_url}}
    content = [{"type": "text", "text": text}, part]
    return {"model": VLM, "max_tokens": 3, "messages": [{"role": "user", "content": content}]}


@pytest.fixture
async def vision_cluster(make_cluster, vision_dirs):
    """A router serving the tiny gemma3 as 'vlm' (no workers yet), with extra settings."""

    async def make(family: str = "gemma3", **settings):
        return await make_cluster(models=(ModelSpec(vision_dirs[family], id=VLM),), **settings)

    return make
