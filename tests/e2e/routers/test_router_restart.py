"""A router SIGKILLed under a warm two-worker cluster comes back knowing what the workers
cache: within 10 s of its return its prefix index per worker equals each worker's cached
blocks (the workers' inventories), and a returning prompt goes to the worker that holds it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.routers.fleet_processes import (
    chat,
    cluster,
    index_matches_caches,
    launched,
    router_pid,
    served_by,
    wait_for,
)

pytestmark = pytest.mark.slow

PORT, ZMQ_PORT = 18731, 18741
QUESTIONS = ["What is the code of item 7?", "Which item has code 3?", "List items 1 to 3."]


def test_the_index_survives_a_router_restart(model_cache, tmp_path):
    url = f"http://127.0.0.1:{PORT}"
    args = ["--workers", "2", "--kv-memory", "256MiB"]
    with launched(args, PORT, ZMQ_PORT, tmp_path / "logs") as launcher:
        holders = {}  # system prompt -> the worker that computed it
        for i in range(2):
            system = f"Ledger {i}. " + " ".join(
                f"Item {j} costs {(j * 13 + i) % 97}." for j in range(60)
            )
            before = cluster(url)
            chat(url, QUESTIONS[0], system)
            holders[system] = served_by(url, before)
        warm = wait_for(lambda: index_matches_caches(url), timeout=10)
        assert warm and sum(warm.values()) > 0, "the index never matched the caches"
        print(f"\nwarm: index blocks per worker {warm}, prompts on {sorted(holders.values())}")

        os.kill(router_pid(launcher.pid, PORT), signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: cluster(url) is None, timeout=5, step=0.02)  # it is gone
        assert wait_for(lambda: cluster(url) is not None, timeout=60, step=0.05)
        back = time.monotonic()
        restored = wait_for(lambda: index_matches_caches(url), timeout=10, step=0.05)
        assert restored, f"10 s after the router's return: {cluster(url)}"
        took = time.monotonic() - back
        print(
            f"router back {back - killed:.1f}s after SIGKILL; index equal to the caches "
            f"{took:.2f}s later: {restored}"
        )
        for holder in holders.values():  # every worker that computed a prompt still has it
            assert restored[holder] > 0

        for system, holder in holders.items():  # several times in a row, each prompt
            for question in QUESTIONS:
                before = cluster(url)
                usage = chat(url, question, system)["usage"]
                assert served_by(url, before) == holder
                assert usage["prompt_tokens_details"]["cached_tokens"] > 0, usage
