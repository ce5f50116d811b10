#!/usr/bin/env python
"""Interactive chat beside a Batch API batch: does low priority keep its promise?

Starts launch-cluster (the default model, `--workers` workers), then, same run, same cluster,
for each pattern of interactive traffic (`--pattern`), `--repeats` times:

  - back-to-back: one client sending streamed chat requests one after another, no pause
    (issue 50: between two requests its worker runs no interactive job for a moment);
  - busy: `--concurrency` clients (default 2 per worker) in a closed loop, keeping the
    workers busy (issue 43's pattern);

each measured twice for `--seconds`, TTFT to the first content chunk (`--max-tokens` out):

  - alone: the interactive clients alone;
  - with_batch: a batch of `--lines` chat lines (4 tenants' system prompts, new ones for each
    batch so that every batch starts uncached, `--batch-tokens` out each) submitted, then the
    same clients for the same time while it runs; then the batch is waited for (its lines per
    second, start to end) before the next measurement.

Prints one JSON line per configuration, one `summary` line per repeat (the ratios of the
interactive TTFT with the batch / alone, the batch's throughput) and one `median` line per
pattern: medians over the repeats, the target (issue 50: TTFT p50 beside the batch within
1.3x of alone, in both patterns) and whether every batch completed.

Usage: scripts/bench_batch.py [--pattern both] [--repeats 3] [--lines 500] [--seconds 60]
                              [--workers 1]
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
PATTERNS = ("back-to-back", "busy")
TARGET_P50_RATIO = 1.3  # issue 50's bar, in both patterns
FINAL = ("completed", "failed", "cancelled", "expired")


def tenants(batch: int) -> list[str]:
    """The 4 system prompts of batch number `batch`: ~450 tokens each, none shared with
    another batch's (a later batch would otherwise find them cached and run faster)."""
    return [
        f"Batch {batch}. "
        + " ".join(
            f"Rule {i} of desk {t}: item {i} ships in {(i * 7 + t) % 11} days." for i in range(30)
        )
        for t in range(4)
    ]


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))] if values else 0.0


def clients_of(pattern: str, args) -> int:
    """How many interactive clients a pattern runs."""
    if pattern == "back-to-back":
        return 1
    return args.concurrency or 2 * args.workers


def patterns_of(choice: str) -> tuple[str, ...]:
    return PATTERNS if choice == "both" else (choice,)


async def interactive(url: str, seconds: float, concurrency: int, max_tokens: int) -> dict:
    """`concurrency` clients, each sending its next request as soon as its last one ended."""
    ttfts: list[float] = []
    worst: list[tuple[float, float]] = []  # (seconds into the window it started, its TTFT)
    opened = time.monotonic()
    deadline = opened + seconds

    async def client(k: int, session: aiohttp.ClientSession) -> None:
        n = 0
        while time.monotonic() < deadline:
            body = {
                "model": MODEL,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "messages": [
                    {
                        "role": "user",
                        "content": f"Client {k}, question {n}: tell me a short fact about the sea.",
                    }
                ],
            }
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
    return {
        "requests": len(ttfts),
        "ttft_p50_s": round(statistics.median(ttfts), 3),
        "ttft_p95_s": round(p(ttfts, 0.95), 3),
        "ttft_worst": sorted(worst, key=lambda w: -w[1])[:3],
    }


async def submit_batch(url: str, lines: int, max_tokens: int, batch: int) -> str:
    items = []
    prompts = tenants(batch)
    for i in range(lines):
        body = {
            "model": MODEL,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": prompts[i % 4]},
                {"role": "user", "content": f"When does item {i % 30} ship?"},
            ],
        }
        items.append(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
        )
    data = "".join(json.dumps(x) + "\n" for x in items).encode()
    async with aiohttp.ClientSession() as session:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename="bench.jsonl")
        async with session.post(f"{url}/v1/files", data=form) as r:
            file_id = (await r.json())["id"]
        create = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        async with session.post(f"{url}/v1/batches", json=create) as r:
            return (await r.json())["id"]


async def batch_state(url: str, batch_id: str) -> dict:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v1/batches/{batch_id}") as r,
    ):
        return await r.json()


async def measure(url: str, args, pattern: str, repeat: int, batch: int) -> dict:
    """One repeat of one pattern: alone, then beside a new batch, which is waited for; prints
    its lines and returns its summary."""
    clients = clients_of(pattern, args)
    tag = {"pattern": pattern, "repeat": repeat, "clients": clients}
    alone = await interactive(url, args.seconds, clients, args.max_tokens)
    print(json.dumps({"config": "alone", **tag, **alone}), flush=True)
    started = time.monotonic()
    batch_id = await submit_batch(url, args.lines, args.batch_tokens, batch)
    beside = await interactive(url, args.seconds, clients, args.max_tokens)
    during = (await batch_state(url, batch_id))["request_counts"]["completed"]
    window_end = time.monotonic()
    print(
        json.dumps({"config": "with_batch", **tag, **beside, "batch_lines_during": during}),
        flush=True,
    )
    while (state := await batch_state(url, batch_id))["status"] not in FINAL:
        await asyncio.sleep(1)
    took = time.monotonic() - started
    counts = state["request_counts"]
    summary = {
        "config": "summary",
        **tag,
        "workers": args.workers,
        "lines": args.lines,
        "batch_status": state["status"],
        "batch_completed": counts["completed"],
        "batch_failed": counts["failed"],
        "batch_seconds": round(took, 1),
        "batch_lines_per_s": round(counts["completed"] / took, 2),
        # after the interactive window the workers are the batch's alone: its idle rate
        "batch_idle_lines_per_s": round(
            (counts["completed"] - during) / max(1e-9, time.monotonic() - window_end), 2
        ),
        "batch_beside_lines_per_s": round(during / (window_end - started), 2),
        "ttft_p50_alone_s": alone["ttft_p50_s"],
        "ttft_p50_beside_s": beside["ttft_p50_s"],
        "ttft_p95_alone_s": alone["ttft_p95_s"],
        "ttft_p95_beside_s": beside["ttft_p95_s"],
        "ttft_p95_ratio": round(beside["ttft_p95_s"] / alone["ttft_p95_s"], 2),
        "ttft_p50_ratio": round(beside["ttft_p50_s"] / alone["ttft_p50_s"], 2),
    }
    print(json.dumps(summary), flush=True)
    return summary


def median_line(pattern: str, runs: list[dict]) -> dict:
    """The `median` line of one pattern from its repeats' summaries: medians of the TTFTs and
    of the ratios (each ratio against the alone window of its own repeat), and whether every
    batch completed all its lines."""

    def med(key: str) -> float:
        return round(statistics.median(run[key] for run in runs), 3)

    finished = sum(
        run["batch_status"] == "completed" and run["batch_completed"] == run["lines"]
        for run in runs
    )
    p50_ratio = med("ttft_p50_ratio")
    return {
        "config": "median",
        "pattern": pattern,
        "repeats": len(runs),
        "ttft_p50_alone_s": med("ttft_p50_alone_s"),
        "ttft_p50_beside_s": med("ttft_p50_beside_s"),
        "ttft_p50_ratio": p50_ratio,
        "ttft_p95_alone_s": med("ttft_p95_alone_s"),
        "ttft_p95_beside_s": med("ttft_p95_beside_s"),
        "ttft_p95_ratio": med("ttft_p95_ratio"),
        "batch_lines_per_s": med("batch_lines_per_s"),
        "batch_finished": f"{finished}/{len(runs)}",
        "target_met": p50_ratio <= TARGET_P50_RATIO and finished == len(runs),
    }


async def main(args) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp / "cache"), PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "fleet.launch",
        "--workers",
        str(args.workers),
        "--port",
        str(port),
        "--log-dir",
        str(tmp / "logs"),
        "--kv-memory",
        args.kv_memory,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "is serving" in proc.stdout.readline(), "the cluster did not come up"
        await interactive(url, 5, clients_of("busy", args), args.max_tokens)  # warm-up
        runs: dict[str, list[dict]] = {pattern: [] for pattern in patterns_of(args.pattern)}
        batch = 0
        for repeat in range(args.repeats):  # patterns interleaved: a slow spell hits both
            for pattern in runs:
                runs[pattern].append(await measure(url, args, pattern, repeat, batch))
                batch += 1
        for pattern, summaries in runs.items():
            print(json.dumps(median_line(pattern, summaries)), flush=True)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pattern", choices=(*PATTERNS, "both"), default="both")
    parser.add_argument("--repeats", type=positive, default=3, help="medians are over these")
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--batch-tokens", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--concurrency", type=int, default=0, help="busy: clients (0: 2 per worker)"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--kv-memory", default="512MiB")
    return parser


if __name__ == "__main__":
    asyncio.run(main(build_parser().parse_args()))
