"""launch-cluster heals itself, with real processes: a SIGKILLed worker serves again within
seconds (the time is printed), and no child outlives a SIGKILLed launcher, even without
Linux's PDEATHSIG (the macOS situation: the children's own parent watch must do it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fleet.launch import free_port
from fleet.supervisor import NO_PDEATHSIG_ENV
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def request(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def serves(url: str) -> bool:
    try:
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 1}
        return bool(request(f"{url}/v1/completions", body)["choices"])
    except (OSError, ValueError, KeyError):
        return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.fixture
def launched(default_model_dir, tmp_path):
    """`launch-cluster --workers 1` without PDEATHSIG, serving; yields (launcher, url)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{NO_PDEATHSIG_ENV: "1"})
    cmd = [
        sys.executable,
        "-m",
        "fleet.launch",
        "--workers",
        "1",
        "--port",
        str(port),
        "--kv-memory",
        "128MiB",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert "is serving" in launcher.stdout.readline(), "the cluster did not come up"
    yield launcher, f"http://127.0.0.1:{port}"
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)


def test_killed_worker_serves_again_within_seconds(launched):
    _, url = launched
    (worker,) = request(f"{url}/v1/cluster")["workers"]
    os.kill(worker["pid"], signal.SIGKILL)
    killed = time.monotonic()
    while not serves(url):
        assert time.monotonic() - killed < 60, "the worker never came back"
        time.sleep(0.1)
    back = time.monotonic() - killed
    print(f"\nworker serving again {back:.1f}s after SIGKILL")
    (again,) = request(f"{url}/v1/cluster")["workers"]
    assert again["pid"] != worker["pid"]
    assert back < 20, f"the worker took {back:.1f}s to serve again"


def test_children_exit_when_the_launcher_is_sigkilled(launched):
    launcher, url = launched
    (worker,) = request(f"{url}/v1/cluster")["workers"]
    children = [worker["pid"], *_router_children(launcher.pid)]
    assert len(children) == 2 and all(alive(p) for p in children)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in children), "a child outlived launch-cluster"


def _router_children(launcher_pid: int) -> list[int]:
    """The launcher's child running `-m router` (not the worker)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == launcher_pid and args[1:3] == [b"-m", b"router"]:
            found.append(int(entry))
    return found
