#!/usr/bin/env python
"""Interactive chat beside a Batch API batch: does low priority keep its promise?

Starts launch-cluster (the default model, `--workers` workers), then, same run, same cluster:

  - alone: `--concurrency` interactive clients in a closed loop for `--seconds` (streamed
    chat, `--max-tokens` out), TTFT measured to the first content chunk;
  - with_batch: a batch of `--lines` chat lines (4 tenants' system prompts, `--batch-tokens`
    out each) submitted, then the same interactive load for the same time while it runs;
    then the batch is waited for (its lines per second, start to end).

Prints one JSON line per configuration and one with the ratio of the interactive TTFT p95
(with the batch / alone; the issue asks for <= 1.3) and the batch's throughput.

Usage: scripts/bench_batch.py [--lines 500] [--seconds 60] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.launch import free_port  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
TENANTS = [
    " ".join(f"Rule {i} of desk {t}: item {i} ships in {(i * 7 + t) % 11} days." for i in range(30))
    for t in range(4)
]


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))] if values else 0.0


async def interactive(url: str, seconds: float, concurrency: int, max_tokens: int) -> dict:
    ttfts: list[float] = []
    worst: list[tuple[float, float]] = []  # (seconds into the window it started, its TTFT)
    opened = time.monotonic()
    deadline = opened + seconds

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        n = 0
        while time.monotonic() < deadline:
            body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": f"Client {k}, question {n}: "
                                  "tell me a short fact about the sea."}]}  # fmt: skip
            n += 1
            started = time.monotonic()
            first = None
            async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                async for raw in r.content:
                    line = raw.decode().strip()
                    if first is None and line.startswith("data: {") and '"content"' in line:
                        first = time.monotonic() - started
            if first is not None:
                ttfts.append(first)
                worst.append((round(started - opened, 1), round(first, 3)))

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(k, session) for k in range(concurrency)))
    return {"requests": len(ttfts), "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_p95_s": round(p(ttfts, 0.95), 3),
            "ttft_worst": sorted(worst, key=lambda w: -w[1])[:3]}  # fmt: skip


async def submit_batch(url: str, lines: int, max_tokens: int) -> str:
    items = []
    for i in range(lines):
        body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "system", "content": TENANTS[i % 4]},
                             {"role": "user", "content": f"When does item {i % 30} ship?"}]}  # fmt: skip
        items.append({"custom_id": f"line-{i}", "method": "POST",
                      "url": "/v1/chat/completions", "body": body})  # fmt: skip
    data = "".join(json.dumps(x) + "\n" for x in items).encode()
    async with aiohttp.ClientSession() as session:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename="bench.jsonl")
        async with session.post(f"{url}/v1/files", data=form) as r:
            file_id = (await r.json())["id"]
        create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                  "completion_window": "24h"}  # fmt: skip
        async with session.post(f"{url}/v1/batches", json=create) as r:
            return (await r.json())["id"]


async def batch_state(url: str, batch_id: str) -> dict:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v1/batches/{batch_id}") as r,
    ):
        return await r.json()


async def main(args) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp / "cache"), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "fleet.launch", "--workers", str(args.workers), "--port",
           str(port), "--log-dir", str(tmp / "logs"), "--kv-memory", args.kv_memory]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "is serving" in proc.stdout.readline(), "the cluster did not come up"
        await interactive(url, 5, args.concurrency, args.max_tokens)  # warm-up
        alone = await interactive(url, args.seconds, args.concurrency, args.max_tokens)
        print(json.dumps({"config": "alone", **alone}), flush=True)
        started = time.monotonic()
        batch_id = await submit_batch(url, args.lines, args.batch_tokens)
        beside = await interactive(url, args.seconds, args.concurrency, args.max_tokens)
        during = (await batch_state(url, batch_id))["request_counts"]["completed"]
        window_end = time.monotonic()
        print(json.dumps({"config": "with_batch", **beside, "batch_lines_during": during}),
              flush=True)  # fmt: skip
        while (state := await batch_state(url, batch_id))["status"] not in (
            "completed", "failed", "cancelled", "expired"
        ):  # fmt: skip
            await asyncio.sleep(1)
        took = time.monotonic() - started
        counts = state["request_counts"]
        print(json.dumps({
            "config": "summary", "workers": args.workers, "lines": args.lines,
            "batch_status": state["status"], "batch_completed": counts["completed"],
            "batch_failed": counts["failed"], "batch_seconds": round(took, 1),
            "batch_lines_per_s": round(counts["completed"] / took, 2),
            # after the interactive window the worker is the batch's alone: its idle rate
            "batch_idle_lines_per_s": round(
                (counts["completed"] - during) / (time.monotonic() - window_end), 2
            ),
            "batch_beside_lines_per_s": round(during / (window_end - started), 2),
            "ttft_p95_ratio": round(beside["ttft_p95_s"] / alone["ttft_p95_s"], 2),
            "ttft_p50_ratio": round(beside["ttft_p50_s"] / alone["ttft_p50_s"], 2),
        }), flush=True)  # fmt: skip
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--batch-tokens", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--kv-memory", default="512MiB")
    asyncio.run(main(parser.parse_args()))
