"""Two routers, one set of workers (launch-cluster --routers 2), real processes: requests
through either router succeed, each router's index follows the workers' caches, and with
one router SIGKILLed mid-load every request sent to the other afterwards succeeds; and a
Responses conversation started on one router continues on the other through the routers'
shared Redis store (`state_url`, a real redis-server: tests/support/redis_server.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.routers.fleet_processes import (
    chat,
    cluster,
    index_matches_caches,
    launched,
    router_pid,
    stream_chat,
    wait_for,
)

pytestmark = pytest.mark.slow

PORT, ZMQ_PORT = 18751, 18761  # router 2: 18752 and 18762


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_two_routers_serve_one_fleet_and_survive_each_other(model_cache, tmp_path, redis_url):
    first, second = f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT + 1}"
    config = tmp_path / "fleet.toml"
    config.write_text(f'[router]\nstate_url = "{redis_url}"\n')
    args = ["--workers", "2", "--routers", "2", "--kv-memory", "256MiB", "--config", str(config)]
    with launched(args, PORT, ZMQ_PORT, tmp_path / "logs") as launcher:
        for url in (first, second):
            assert set(cluster(url)) == {"worker-0", "worker-1"}
        reply = chat(first, "What is the code of item 3?")
        assert reply["choices"][0]["message"]["content"]
        again = chat(second, "What is the code of item 3?")  # the other router, same prefix
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again["usage"]
        # a conversation started on one router continues on the other (the shared store)
        model = "SmolLM2-135M-Instruct"
        turn = _post(
            first,
            "/v1/responses",
            {"model": model, "input": "Name a colour.", "max_output_tokens": 8, "temperature": 0},
        )
        follow = _post(
            second,
            "/v1/responses",
            {
                "model": model,
                "input": "And another?",
                "previous_response_id": turn["id"],
                "max_output_tokens": 8,
                "temperature": 0,
            },
        )
        # (an unknown previous_response_id would be a 404; 8 tokens end it "incomplete")
        assert follow["status"] in ("completed", "incomplete") and follow["output"], follow
        assert follow["previous_response_id"] == turn["id"]
        with urllib.request.urlopen(f"{second}/v1/responses/{turn['id']}", timeout=30) as r:
            assert json.loads(r.read())["id"] == turn["id"]
        for url in (first, second):  # each router's index holds the workers' blocks
            index = wait_for(lambda u=url: index_matches_caches(u), timeout=10)
            assert index and sum(index.values()) > 0, cluster(url)

        failures: list[str] = []
        stop = threading.Event()
        served = Counter()  # requests each load loop has completed

        def load(url: str, name: str) -> int:
            done = 0
            while not stop.is_set():
                try:
                    stream_chat(url, f"Say something about {name} {done}.", max_tokens=12)
                    done += 1
                    served[name] += 1
                except Exception:  # noqa: BLE001 - the dying router's requests may fail
                    if url == second:
                        failures.append(f"{name}: request {done} on the survivor failed")
                    return done
            return done

        with ThreadPoolExecutor(4) as pool:
            loads = [
                pool.submit(load, url, f"{url[-4:]}-{i}")
                for url in (first, second)
                for i in range(2)
            ]
            # every loop has been served once and has its next request in flight
            assert wait_for(lambda: len(served) == len(loads), timeout=60), served
            os.kill(router_pid(launcher.pid, PORT), signal.SIGKILL)
            killed = time.monotonic()
            after = [pool.submit(stream_chat, second, f"After the kill, {i}?") for i in range(4)]
            after += [pool.submit(chat, second, f"And after the kill, {i}?") for i in range(2)]
            for future in after:
                future.result(timeout=180)  # raises if any of them failed
            stop.set()
            counts = [f.result(timeout=180) for f in loads]
        assert not failures, failures
        print(
            f"\nafter the kill: {len(after)} new requests on the survivor, all served in "
            f"{time.monotonic() - killed:.1f}s; load loops completed {counts}"
        )
        # the killed router comes back with its index whole again (the workers' inventories)
        assert wait_for(lambda: index_matches_caches(first), timeout=60), cluster(first)
