"""The first request after a start (issue 50): sent as soon as the router answers /health,
before any worker has registered ("starting"), it waits for its worker and is answered, not
refused with 503 no_workers_available. The worker is started seconds after the router, as a
slow model load (or a remote Mac still booting) would register."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error

import openai
import pytest

from fleet.launch import free_port
from tests.support.launched import get_json, spawn, stop_all
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow


def first_health(url: str, timeout: float = 90) -> tuple[int, dict]:
    """/health's first answer (status code, body), polled as fast as a script would."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return 200, get_json(f"{url}/health", timeout=2)
        except urllib.error.HTTPError as e:  # 503 while starting: a balancer waits
            return e.code, json.loads(e.read())
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"the router did not answer /health in {timeout}s")


def test_a_request_sent_when_health_first_answers_waits_for_its_worker(tmp_path):
    tiny = save_tiny_model(tmp_path / "tiny", seed=5)
    http, zmq = free_port(), f"tcp://127.0.0.1:{free_port()}"
    config = tmp_path / "fleet.toml"
    config.write_text(f'[router]\nport = {http}\nzmq_bind = "{zmq}"\n')
    py = [sys.executable, "-m"]
    router_cmd = py + ["router", "--config", str(config), "--model", str(tiny)]
    router_cmd += ["--model-id", "tiny"]
    worker_cmd = py + ["worker", "--router", zmq, "--model", str(tiny), "--model-id", "tiny"]
    worker_cmd += ["--kv-memory", "16MiB"]
    procs = []

    url = f"http://127.0.0.1:{http}"
    result: dict = {}
    try:
        procs.append(spawn(router_cmd, tmp_path / "router.log"))
        code, health = first_health(url)
        assert (code, health["status"]) == (503, "starting"), health

        def ask() -> None:
            api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
            try:
                result["reply"] = api.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=3,
                    temperature=0,
                )
            except openai.APIError as e:
                result["error"] = e

        client = threading.Thread(target=ask)
        client.start()
        time.sleep(2.0)  # the request waits at the router, no worker yet
        assert client.is_alive() and not result
        procs.append(spawn(worker_cmd, tmp_path / "worker.log"))
        client.join(timeout=150)
        assert "error" not in result, result.get("error")
        assert result["reply"].choices[0].finish_reason in ("stop", "length")
        assert get_json(f"{url}/health")["status"] == "ok"
    finally:
        stop_all(procs)
