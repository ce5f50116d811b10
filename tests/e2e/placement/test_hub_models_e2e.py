"""Catalog models with a Hub `source` (issue 51), real processes: a router and a host agent on
this machine, a local server speaking the Hub's file API (tests/support/hub_server.py) with a
tiny random llama, throttled so a fetch takes seconds. A streamed request waits for the first
fetch with a percentage in its `: loading` comments, then answers; Ollama's /api/pull fetches
another with its progress in the status lines; a host agent SIGKILLed
midway through a fetch is started again and resumes it (the Hub sends fewer bytes than the
whole file); a file served with a wrong byte is refused with a 503 naming it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import ollama
import pytest

from fleet.launch import free_port
from tests.support.hub_server import HubServer, serving
from tests.support.launched import get_json, spawn, stop_all, wait_for
from tests.support.tp_group import save_tiny_model

pytestmark = pytest.mark.slow
KV = 64 << 20
THROTTLE = 40_000  # bytes a second: the tiny model's ~180 KB of weights take ~4.5 s


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("hub") / "tiny", seed=5)


def config_text(port: int, zmq: str) -> str:
    models = ""
    names = ("tiny", "again", "bad", "pulled")
    for model_id, repo in ((n, f"org/{n}") for n in names):
        models += f'[[models]]\nid = "{model_id}"\nsource = "{repo}"\nkv_memory = "{KV}"\n'
    return (
        models + f'[router]\nport = {port}\nzmq_bind = "{zmq}"\nheartbeat_timeout_s = 3.0\n'
        f'[worker]\nrouter = "{zmq}"\n'
    )


def killed(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def streamed_chat(url: str, model: str) -> list[str]:
    """The lines of a streamed chat completion, comments included."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}],
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return [line.decode().rstrip("\n") for line in response]


def chat(url: str, model: str) -> tuple[int, dict]:
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def fetch_of(url: str, model: str) -> dict | None:
    try:
        hosts = get_json(f"{url}/v1/cluster")["hosts"]
    except OSError:
        return None
    return next((f for h in hosts if h["alive"] for f in h["fetches"] if f["model"] == model), None)


def placement(url: str, model: str) -> dict:
    return next(m["placement"] for m in get_json(f"{url}/v1/models")["data"] if m["id"] == model)


def test_hub_models_fetch_with_progress_resume_after_a_kill_and_refuse_a_bad_file(tiny, tmp_path):
    repos = {f"org/{name}": tiny for name in ("tiny", "again", "bad", "pulled")}
    hub = HubServer(repos)  # throttled only where the test must see a fetch under way
    hub.corrupt = {"org/bad/model.safetensors"}
    port, zmq = free_port(), f"tcp://127.0.0.1:{free_port()}"
    config = tmp_path / "fleet.toml"
    config.write_text(config_text(port, zmq))
    with serving(hub):
        base = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_ENDPOINT": hub.url}
        base.pop("HF_HUB_OFFLINE", None)
        router_env = {**base, "HF_HUB_CACHE": str(tmp_path / "router-cache")}
        host_env = {**base, "HF_HUB_CACHE": str(tmp_path / "host-cache")}
        py = [sys.executable, "-m"]
        host_cmd = py + ["fleet.host", "--config", str(config), "--host-id", "host-a"]
        host_cmd += ["--memory-budget", "8GiB", "--log-dir", str(tmp_path / "host-a")]
        router = spawn(
            py + ["router", "--config", str(config)], tmp_path / "router.log", router_env
        )
        host = spawn(host_cmd, tmp_path / "host.log", host_env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _one_host(url), 90, "the host agent")
            # the router fetched config and tokenizer only
            assert hub.served["org/tiny/model.safetensors"] == 0
            assert hub.served["org/tiny/config.json"] > 0
            hub.throttle = THROTTLE

            # 1. first demand: the streamed request says how far the fetch is, then answers
            lines = streamed_chat(url, "tiny")
            notes = [line for line in lines if line.startswith(": loading tiny")]
            percents = [int(m.group(1)) for n in notes if (m := re.search(r"(\d+)%", n))]
            assert percents, lines[:10]
            assert "fetching its files from the Hub" in notes[0]
            assert "data: [DONE]" in lines, lines[-5:]
            assert any(line.startswith("data: {") for line in lines)
            weights = (tiny / "model.safetensors").stat().st_size
            assert hub.served["org/tiny/model.safetensors"] == weights
            assert placement(url, "tiny")["held_on"] == ["host-a"]

            # 2. Ollama's /api/pull fetches onto the host, its progress in the status lines
            pulled = list(ollama.Client(host=url).pull("pulled", stream=True))
            progress = [p for p in pulled if p.total]
            published = sum(f.stat().st_size for f in tiny.iterdir())
            assert progress and all(p.total == published for p in progress)
            assert 0 < progress[-1].completed <= published
            assert pulled[0].status == "pulling manifest" and pulled[-1].status == "success"
            assert placement(url, "pulled")["held_on"] == ["host-a"]
            assert hub.served["org/pulled/model.safetensors"] == weights
            assert ollama.Client(host=url).pull("pulled").status == "success"  # held: at once

            # 3. a wrong byte: refused, the 503 names the file (no need to watch it fetched)
            hub.throttle = None
            status, body = chat(url, "bad")
            assert status == 503, body
            message = body["error"]["message"] if "error" in body else body["message"]
            assert "model.safetensors" in message and "checksum" in message, message

            # 4. the host agent killed midway through a fetch: started again, it resumes
            hub.throttle = THROTTLE
            result: dict = {}
            waiter = threading.Thread(target=lambda: result.update(reply=chat(url, "again")))
            waiter.start()
            wait_for(
                lambda: (f := fetch_of(url, "again")) and f["done_bytes"] > weights // 4,
                60,
                "the fetch of 'again' under way",
            )
            assert placement(url, "again")["fetching"]["host-a"]["percent"] > 0
            killed(host)
            before = hub.served["org/again/model.safetensors"]
            assert 0 < before < weights
            host = spawn(host_cmd, tmp_path / "host.log", host_env)
            waiter.join(timeout=120)
            status, body = result["reply"]
            assert status == 200, body
            resumed = hub.served["org/again/model.safetensors"] - before
            assert 0 < resumed < weights, (before, resumed, weights)
        finally:
            stop_all([host, router])


def _one_host(url: str) -> bool:
    try:
        return len(get_json(f"{url}/v1/cluster")["hosts"]) == 1
    except (OSError, KeyError):
        return False
