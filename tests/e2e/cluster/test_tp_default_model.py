"""Tensor-parallel groups on the default model (9 query heads, 3 KV heads: K = 3), with real
rank processes: greedy tokens equal the unsharded engine's; `launch-cluster --tp 3` serves
over HTTP, shows the group's ranks, and comes back as a whole after one rank is killed."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.cluster.test_cluster_e2e import QUESTION, Cluster
from tests.support.launched import PIPED, launch_cluster
from tests.support.tp_group import run_group_case
from tests.unit.worker.engine.test_tp import unsharded_outputs

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write one sentence about the sea.",
]


def chat_ids(model_dir, question: str) -> list[int]:
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(model_dir)
    messages = [{"role": "user", "content": question}]
    return tok.apply_chat_template(messages, add_generation_prompt=True)


def test_tp3_group_greedy_equals_unsharded_engine_on_the_default_model(default_model_dir, tmp_path):
    prompts = [chat_ids(default_model_dir, q) for q in QUESTIONS]
    case = {
        # 8 usable blocks of 16 tokens for three ~40-token prompts decoding 16 tokens each:
        # preemption; the shared system prompt: cache hits; chunks of 16: chunked prefill
        "config": dict(block_size=16, num_blocks=9, prefill_chunk=16, step_token_budget=48),
        "max_context": 8192,
        "phases": [
            [{"id": "first", "prompt": prompts[0], "max_tokens": 8}],
            [{"id": f"q{i}", "prompt": p, "max_tokens": 16} for i, p in enumerate(prompts)],
        ],
    }
    with ThreadPoolExecutor(1) as pool:
        # the ranks start and run while the unsharded engine computes here
        group = pool.submit(run_group_case, default_model_dir, case, 3, tmp_path, 600)
        expected, stats = unsharded_outputs(default_model_dir, case)
        got = group.result()
    assert stats["cache_hit_tokens"] > 0 and stats["preemptions"] > 0
    assert got["outputs"] == expected
    assert got["stats"]["preemptions"] == stats["preemptions"]


@pytest.fixture(scope="module")
def tp_cluster(model_cache, tmp_path_factory):
    logs = tmp_path_factory.mktemp("tp-cluster-logs")
    with launch_cluster(["--workers", "1", "--tp", "3", "--kv-memory", "64MiB"], logs, **PIPED) as (
        base,
        proc,
    ):
        c = Cluster(base, proc)
        c.wait_healthy(1, timeout=400)
        yield c


def ask(cluster: Cluster) -> str:
    # "The capital of France is Paris" is 6 tokens; each one costs the 3 ranks a step in sync
    reply = cluster.client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, max_tokens=6, temperature=0
    )
    return reply.choices[0].message.content


def group_of(cluster: Cluster) -> dict:
    (worker,) = cluster.state()["workers"]
    return worker


def test_launch_cluster_tp3_serves_shows_ranks_and_survives_a_killed_rank(tp_cluster):
    assert "Paris" in ask(tp_cluster)
    worker = group_of(tp_cluster)
    group = worker["tensor_parallel"]
    assert group["size"] == 3 and [r["rank"] for r in group["ranks"]] == [0, 1, 2]
    pids = [r["pid"] for r in group["ranks"]]
    assert pids[0] == worker["pid"] and len(set(pids)) == 3

    os.kill(pids[2], signal.SIGKILL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the whole group restarts: rank 0 is a new process
        try:
            worker = group_of(tp_cluster)
            if worker["healthy"] and worker["pid"] != pids[0]:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    else:
        raise AssertionError("the group did not come back")
    new_pids = [r["pid"] for r in worker["tensor_parallel"]["ranks"]]
    assert not set(new_pids) & set(pids)
    assert "Paris" in ask(tp_cluster)
