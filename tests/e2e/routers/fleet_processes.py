"""launch-cluster with real processes for the router tests: started on fixed ports (the second
router takes the next one), its routers found by pid, requests made as a plain client does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import ROOT

MODEL = "SmolLM2-135M-Instruct"
# a ~420-token system prompt, as the reproduction used
SYSTEM = " ".join(f"Fact {i}: the code of item {i} is {(i * 37) % 101}." for i in range(42))


@contextlib.contextmanager
def launched(
    args: list[str], port: int, zmq_port: int, log_dir: Path
) -> Iterator[subprocess.Popen]:
    """`launch-cluster ARGS` on HTTP `port` (router i on port + i), serving when yielded; its
    children run this checkout's code (PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "fleet.launch",
        *args,
        "--port",
        str(port),
        "--zmq-port",
        str(zmq_port),
        "--log-dir",
        str(log_dir),
        "--startup-timeout",
        "300",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "is serving" in line, f"the cluster did not come up: {line!r}"
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for log in sorted(log_dir.iterdir()):
            print(f"---- {log.name}\n{log.read_text()[-2500:]}")


def router_pid(launcher_pid: int, port: int) -> int:
    """The pid of the launcher's router child listening on HTTP `port`."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        is_router = ppid == launcher_pid and args[1:3] == ["-m", "router"]
        if is_router and args[args.index("--port") + 1] == str(port):
            return int(entry)
    raise AssertionError(f"no router on port {port}")


def get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def cluster(url: str) -> dict[str, dict] | None:
    """/v1/cluster's workers by id, or None while the router does not answer."""
    try:
        return {w["id"]: w for w in get_json(f"{url}/v1/cluster", timeout=2)["workers"]}
    except (OSError, ValueError):
        return None


def chat(url: str, question: str, system: str = SYSTEM, max_tokens: int = 8) -> dict:
    """A plain chat completion; the reply's JSON (raises on any HTTP or connection error)."""
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def stream_chat(url: str, question: str, max_tokens: int = 24, model: str = MODEL) -> int:
    """A streamed chat completion read to its end (`: loading` comments and all); the number
    of chunks. Raises unless the stream ends with [DONE] and no error event."""
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": [{"role": "user", "content": question}],
    }
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    chunks = 0
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                return chunks
            if line.startswith("data: "):
                assert "error" not in json.loads(line[6:]), line
                chunks += 1
    raise AssertionError("the stream ended without [DONE]")


def wait_for(predicate, timeout: float, step: float = 0.1):
    """Poll until `predicate()` is truthy; its value, or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(step)
    return None


def served_by(url: str, before: dict[str, dict]) -> str:
    """The worker whose requests_served rose since `before` (one request in between)."""
    after = cluster(url)
    risen = [
        w
        for w in after
        if after[w]["requests_served"] > before.get(w, {}).get("requests_served", 0)
    ]
    assert len(risen) == 1, risen
    return risen[0]


def index_matches_caches(url: str) -> dict[str, int] | None:
    """Per worker, the blocks the router's index holds, when it equals every worker's own
    cached blocks (its heartbeat's) for every worker; else None."""
    workers = cluster(url)
    if not workers or not all(w["healthy"] for w in workers.values()):
        return None
    pairs = {wid: (w["index_blocks"], w["kv_cached_blocks"]) for wid, w in workers.items()}
    if all(index == cached for index, cached in pairs.values()):
        return {wid: index for wid, (index, _) in pairs.items()}
    return None
