"""The Batch API end to end with the official openai SDK against launch-cluster (real
processes, the default model): files.create -> batches.create -> poll -> files.content, each
line's answer equal to a live request's (greedy); a batch cancelled mid-way; the router
SIGKILLed mid-batch, brought back by the launcher on the same store, and the batch completed
with every line answered once."""

from __future__ import annotations

import json
import os
import signal
import time

import openai
import pytest

from tests.e2e.clients.test_agent_api_e2e import wait_healthy
from tests.e2e.clients.test_responses_restart_e2e import router_pid, serving_again
from tests.support.launched import launch_cluster

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = "You are a terse assistant. Answer in one short sentence."


def line(custom_id: str, question: str, max_tokens: int) -> dict:
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def submit(api: openai.OpenAI, lines: list[dict]):
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    source = api.files.create(file=("input.jsonl", data), purpose="batch")
    return api.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def wait(api: openai.OpenAI, batch_id: str, until, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            batch = api.batches.retrieve(batch_id)
        except (openai.APIConnectionError, openai.InternalServerError):
            batch = None  # the router is coming back
        if batch is not None and until(batch):
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} did not get there in {timeout}s")


def final(batch) -> bool:
    return batch.status in ("completed", "failed", "expired", "cancelled")


def entries(api: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in api.files.content(file_id).text.splitlines()]


def test_batches_end_to_end_with_the_sdk(model_cache, tmp_path):
    config = tmp_path / "fleet.toml"
    config.write_text(f'[router]\nresponses_store_path = "{tmp_path / "store.sqlite3"}"\n')
    args = ["--workers", "1", "--kv-memory", "256MiB", "--config", str(config)]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    with launch_cluster(args, tmp_path / "logs", env=env) as (url, launcher):
        wait_healthy(url)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

        # 1. every line answered as a live request is (greedy)
        questions = [
            "What is the capital of France?",
            "Name a primary colour.",
            "What is 2 + 2?",
            "Say hello.",
        ]
        lines = [line(f"q{i}", q, 12) for i, q in enumerate(questions)]
        done = wait(api, submit(api, lines).id, final)
        assert done.status == "completed", done
        assert done.request_counts.completed == len(lines) and done.error_file_id is None
        output = {e["custom_id"]: e for e in entries(api, done.output_file_id)}
        for x in lines:
            live = api.chat.completions.create(**x["body"])
            body = output[x["custom_id"]]["response"]["body"]
            assert body["choices"][0]["message"]["content"] == live.choices[0].message.content
            assert body["choices"][0]["finish_reason"] == live.choices[0].finish_reason

        # 2. cancelled mid-way: the answered lines kept, the others batch_cancelled
        many = [line(f"c{i:02}", f"Count from {i} to {i + 30}.", 24) for i in range(24)]
        batch = submit(api, many)
        wait(api, batch.id, lambda b: b.request_counts.completed >= 1)
        assert api.batches.cancel(batch.id).status == "cancelling"
        done = wait(api, batch.id, final)
        assert done.status == "cancelled"
        kept, dropped = entries(api, done.output_file_id), entries(api, done.error_file_id)
        assert 1 <= len(kept) < len(many)
        assert {e["error"]["code"] for e in dropped} == {"batch_cancelled"}
        assert sorted(e["custom_id"] for e in kept + dropped) == [x["custom_id"] for x in many]

        # 3. the router SIGKILLed mid-batch: back on the same store, it finishes the batch
        lines = [line(f"k{i:02}", f"Write the number {i} in words.", 16) for i in range(16)]
        batch = submit(api, lines)
        before = wait(api, batch.id, lambda b: b.request_counts.completed >= 2)
        pid = router_pid(launcher.pid)
        os.kill(pid, signal.SIGKILL)
        back = serving_again(url, pid, launcher.pid)
        done = wait(api, batch.id, final)
        print(f"\nkilled after {before.request_counts.completed} lines; back in {back:.1f}s")
        assert done.status == "completed", done
        output = entries(api, done.output_file_id)
        assert sorted(e["custom_id"] for e in output) == [x["custom_id"] for x in lines]
        assert all(e["response"]["status_code"] == 200 for e in output)
        assert done.request_counts.completed == len(lines) and done.error_file_id is None
