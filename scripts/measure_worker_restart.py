"""How long a SIGKILLed worker of launch-cluster takes to serve again, and where the time goes.

    PYTHONPATH=$PWD python scripts/measure_worker_restart.py [--model DIR] [--rounds 2]

Starts `launch-cluster --workers 1` with per-process logs, kills the worker with SIGKILL,
sends a 1-token completion every 100 ms until one succeeds, then reads the new worker's log to
split the time: death noticed + backoff + interpreter start (to "process up"), imports of
mlx / mlx-lm / the engine, model load (to "KV block pool"), warm-up, registration, and the
first request served. One JSON line per round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from fleet.launch import free_port

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\S+) \w+ (.*)$")


def get_json(url: str, body: dict | None = None, timeout: float = 5) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout) as r:
        return json.loads(r.read())


def serves(url: str, model: str) -> bool:
    try:
        body = {"model": model, "prompt": "Hi", "max_tokens": 1}
        return bool(get_json(f"{url}/v1/completions", body)["choices"])
    except (OSError, ValueError, KeyError):
        return False


def worker_pid(url: str) -> int | None:
    try:
        workers = get_json(f"{url}/v1/cluster")["workers"]
    except (OSError, ValueError):
        return None
    healthy = [w for w in workers if w["healthy"]]
    return healthy[0]["pid"] if healthy else None


def log_events(log: Path, since: float) -> dict[str, float]:
    """Epoch seconds of the new worker's milestones (log lines written after `since`)."""
    marks = {
        "process_up": lambda n, m: m.startswith("process up "),
        "imports_done": lambda n, m: m.startswith("imports (mlx"),
        "pool_built": lambda n, m: m.startswith("KV block pool:"),
        "loaded": lambda n, m: n == "worker" and " loaded in " in m,
        "warm_up_done": lambda n, m: m.startswith("warm-up took"),
        "registered": lambda n, m: m.startswith("registered with the router"),
    }
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = STAMP.match(line)
        if not match:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at < since - 0.01:
            continue
        for key, test in marks.items():
            if key not in found and test(match[2], match[3]):
                found[key] = at
    return found


def one_round(url: str, model: str, log_dir: Path) -> dict:
    pid = worker_pid(url)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    while not serves(url, model):
        time.sleep(0.1)
    serving = time.time()
    ev = log_events(log_dir / "worker-0.log", killed)
    split = {"serving_again_s": round(serving - killed, 2)}
    prev, prev_name = killed, "killed"
    for key in ("process_up", "imports_done", "pool_built", "warm_up_done", "registered"):
        if key in ev:
            split[f"{prev_name}_to_{key}_s"] = round(ev[key] - prev, 2)
            prev, prev_name = ev[key], key
    split[f"{prev_name}_to_serving_s"] = round(serving - prev, 2)
    return split


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model for launch-cluster (default: the default model)")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    port, log_dir = free_port(), Path(tempfile.mkdtemp(prefix="mlx-fleet-restart-"))
    cmd = [
        sys.executable,
        "-m",
        "fleet.launch",
        "--workers",
        "1",
        "--port",
        str(port),
        "--kv-memory",
        "256MiB",
        "--log-dir",
        str(log_dir),
    ]
    if args.model:
        cmd += ["--model", args.model]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = launcher.stdout.readline()  # "mlx-fleet is serving NAME at URL/v1 ..."
        model = line.split(" serving ", 1)[1].split(" at ", 1)[0]
        url = f"http://127.0.0.1:{port}"
        for n in range(args.rounds):
            time.sleep(2)  # let the heartbeat settle
            print(json.dumps({"round": n + 1, **one_round(url, model, log_dir)}), flush=True)
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
