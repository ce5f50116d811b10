"""A launch-cluster process for end-to-end tests: started on a free port, stopped (SIGINT, then
SIGKILL to its process group) however the test ends; and single fleet processes (a router, a
host agent, a worker) started and stopped the same way (`spawn`, `stop_all`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from fleet.launch import free_port

# the launcher's own output in a pipe (it prints little; its children log to the log dir)
PIPED = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}


@contextlib.contextmanager
def launch_cluster(
    args: list[str], log_dir: Path, **popen
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`launch-cluster ARGS --port P --log-dir LOG_DIR`: yields (base URL, process); waiting
    for it to be ready is the caller's (what is ready differs between tests)."""
    port = free_port()
    popen = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet.launch",
            *args,
            "--port",
            str(port),
            "--log-dir",
            str(log_dir),
        ],
        start_new_session=True,
        **popen,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_for_models(url: str, workers: dict[str, int], timeout: float = 300) -> None:
    """Until the router's /health counts `workers` (model id -> registered workers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if get_json(f"{url}/health")["models"] == workers:
                return
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the workers {workers} did not register in {timeout}s")


def wait_for(what, timeout: float = 15.0, about: str = "the condition", step: float = 0.25):
    """`what()` once it is truthy, polled every `step` seconds; AssertionError naming `about`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(step)
    raise AssertionError(f"{about} not within {timeout}s")


def spawn(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """`cmd` in a process group of its own, its output appended to `log` (a restarted host
    agent keeps one log), unbuffered."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop_all(procs) -> None:
    """SIGTERM to each running process's group, then SIGKILL to those not gone in 30 s."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
