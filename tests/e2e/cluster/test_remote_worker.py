"""A worker started on its own (as on another Mac) joins a running router over CURVE and
serves; a worker whose key the router does not list never joins."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import openai
import pytest

from fleet.launch import free_port
from shared.curve import generate_keypair

pytestmark = pytest.mark.slow


def cluster_workers(url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{url}/v1/cluster", timeout=2) as r:
            return {w["id"]: w for w in json.loads(r.read())["workers"]}
    except OSError:
        return {}


def start(cmd: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def test_curve_worker_joins_and_unknown_key_is_refused(default_model_dir, tmp_path):
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    router_pub, _ = generate_keypair(keys, "router")
    good_pub, good_secret = generate_keypair(keys, "worker-a")
    _, bad_secret = generate_keypair(keys, "worker-b")
    authorized.mkdir()
    (authorized / good_pub.name).write_text(good_pub.read_text())
    http, zmq_port = free_port(), free_port()
    config = tmp_path / "fleet.toml"
    config.write_text(
        f'[router]\nport = {http}\nzmq_bind = "tcp://127.0.0.1:{zmq_port}"\n'
        f'curve_secret_key = "{keys / "router.key_secret"}"\ncurve_authorized_keys = "{authorized}"\n'
    )
    url = f"http://127.0.0.1:{http}"
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("router", "good", "bad")}  # noqa: SIM115
    router = start(
        [
            sys.executable,
            "-m",
            "router",
            "--config",
            str(config),
            "--model",
            str(default_model_dir),
            "--model-id",
            "smol",
        ],
        logs["router"],
    )
    worker_cmd = [
        sys.executable,
        "-m",
        "worker",
        "--router",
        f"tcp://127.0.0.1:{zmq_port}",
        "--model",
        str(default_model_dir),
        "--kv-memory",
        "128MiB",
        "--curve-server-key",
        str(router_pub),
    ]
    good = start(
        [*worker_cmd, "--worker-id", "remote-a", "--curve-secret-key", str(good_secret)],
        logs["good"],
    )
    bad = start(
        [*worker_cmd, "--worker-id", "remote-b", "--curve-secret-key", str(bad_secret)], logs["bad"]
    )
    try:
        deadline = time.monotonic() + 240
        while "remote-a" not in cluster_workers(url) and time.monotonic() < deadline:
            assert router.poll() is None and good.poll() is None
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=12,
        )
        assert "Paris" in r.choices[0].message.content
        # the unauthorized worker loaded its model and kept trying, but never got in
        deadline = time.monotonic() + 120
        while (
            b"loaded in" not in (tmp_path / "bad.log").read_bytes() and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        time.sleep(3)
        assert "remote-b" not in cluster_workers(url)
        assert b"registered with the router" not in (tmp_path / "bad.log").read_bytes()
        assert cluster_workers(url)["remote-a"]["requests_served"] == 1
    finally:
        stop(router, good, bad)
        for f in logs.values():
            f.close()
        for name in logs:
            print(f"---- {name}\n{(tmp_path / f'{name}.log').read_text()[-2000:]}")
