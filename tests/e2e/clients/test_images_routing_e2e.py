"""A returning image goes to the worker that holds it: two workers serving one tiny Gemma 3
vision model (real processes, the official openai SDK). The router hashes a prompt's image
keys like any other tokens (shared/models/vision.py), so each of several screenshots, sent
again, is routed to the worker whose cache holds it and hits there; and the first sends of
different screenshots are spread over both workers (the load balance is not lost)."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.support.launched import get_json, launch_cluster, wait_for_models

pytest.importorskip("mlx_vlm", reason="the vision extra (pip install 'mlx-fleet[vision]')")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from tests.support.arch_zoo.vision import build_vision_model

    work = tmp_path_factory.mktemp("images-routing")
    path = build_vision_model("gemma3", work / "gemma")
    args = ["--model", str(path), "--workers", "2", "--kv-memory", "64MiB"]
    with launch_cluster(args, work) as (base, _):
        wait_for_models(base, {"gemma": 2})
        yield base


def _message(seed: int) -> list[dict]:
    from tests.support.arch_zoo.vision import sample_image

    data = base64.b64encode(sample_image(40, 60, seed=seed)).decode()
    text = "hello world, you are a helpful assistant; answer the user. " * 3
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                {"type": "text", "text": text},
            ],
        }
    ]


def test_a_returning_image_is_routed_to_its_holder(url):
    model = "gemma"
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120) as client:

        def ask(seed: int):
            return client.chat.completions.create(
                model=model, messages=_message(seed), max_tokens=2, temperature=0
            ).usage

        firsts = [ask(seed) for seed in range(4)]
        # the image comes first: a first send hits at most the chat template's header
        assert all(u.prompt_tokens_details.cached_tokens < u.prompt_tokens // 2 for u in firsts)
        served = [w["requests_served"] for w in get_json(f"{url}/v1/cluster")["workers"]]
        assert sum(served) == 4 and min(served) >= 1  # four screenshots, over both workers
        for _ in range(2):
            for seed in range(4):
                usage = ask(seed)
                # all its whole blocks: only the worker that computed it holds them
                assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 16
