"""Router overhead benchmark: stand-in workers (no model), closed-loop load, localhost only.

For each configuration: start the router (`python -m router`) and stand-in worker processes,
run `concurrency` clients that each send one chat completion after another for `--seconds`
(or `--max-requests`), and print one JSON line: requests/s the router sustained and its latency
at p50/p99 next to the baseline measured in the same run, the same load sent straight to a
stand-in worker over the protocol (no HTTP, no router). `added_*_ms` is the difference.

    python scripts/bench_router.py --seconds 5 --concurrency 1 8 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import zmq
import zmq.asyncio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.protocol import Generate, RegisterAck, TokenDelta, decode, encode  # noqa: E402
from shared.sampling import SamplingParams  # noqa: E402
from tests.support.tiny_model import build_tiny_model  # noqa: E402

PREFIXES = 8  # distinct system prompts the load cycles through (cache-aware routing matters)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def spawn_workers(endpoint: str, n: int, token_delay: float) -> list[subprocess.Popen]:
    return [
        spawn(
            "tests.support.fake_worker",
            "--connect",
            endpoint,
            "--worker-id",
            f"w{i}",
            "--token-delay",
            str(token_delay),
        )
        for i in range(n)
    ]


def messages(i: int) -> list[dict]:
    system = f"You are assistant number {i % PREFIXES}. " + "Answer briefly and well. " * 8
    return [{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]


async def closed_loop(send, concurrency: int, seconds: float, max_requests: int):
    """Each of `concurrency` clients calls `send(i)` back to back; latencies in seconds."""
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    counter = iter(range(max_requests))

    async def client():
        nonlocal errors
        for i in counter:
            if time.perf_counter() > deadline:
                return
            start = time.perf_counter()
            try:
                await send(i)
                latencies.append(time.perf_counter() - start)
            except Exception:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, errors, time.perf_counter() - start


async def via_router(base: str, args, concurrency: int):
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def send(i: int):
            body = {
                "model": "bench",
                "messages": messages(i),
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(await resp.text())
                await resp.read()

        return await closed_loop(send, concurrency, args.seconds, args.max_requests)


async def direct(args, concurrency: int, token_ids: list[int]):
    """The same load straight to one stand-in worker: this script plays the router."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    (worker,) = spawn_workers(f"tcp://127.0.0.1:{port}", 1, args.token_delay)
    identity, _ = await sock.recv_multipart()  # Register
    await sock.send_multipart([identity, encode(RegisterAck(accepted=True))])
    waiters: dict[str, asyncio.Future] = {}

    async def receive():
        while True:
            _, frame = await sock.recv_multipart()
            msg = decode(frame)
            if isinstance(msg, TokenDelta) and msg.finish_reason is not None:
                waiters.pop(msg.request_id).set_result(None)

    async def send(i: int):
        done = asyncio.get_running_loop().create_future()
        waiters[str(i)] = done
        sampling = SamplingParams(max_tokens=args.max_tokens)
        await sock.send_multipart([identity, encode(Generate(str(i), tuple(token_ids), sampling))])
        await done

    receiver = asyncio.create_task(receive())
    try:
        return await closed_loop(send, concurrency, args.seconds, args.max_requests)
    finally:
        receiver.cancel()
        worker.kill()
        worker.wait()
        sock.close(linger=0)
        ctx.term()


async def wait_healthy(base: str, workers: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{base}/health") as resp:
                    if resp.status == 200 and (await resp.json())["healthy_workers"] == workers:
                        return
            await asyncio.sleep(0.2)
    raise TimeoutError("router or workers did not come up")


def percentiles_ms(latencies: list[float]) -> tuple[float, float]:
    if len(latencies) < 2:
        return float("nan"), float("nan")
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return round(q[49] * 1e3, 3), round(q[98] * 1e3, 3)


async def run_config(args, model_dir: Path, policy: str, workers: int, concurrency: int) -> dict:
    port, zmq_port = free_port(), free_port()
    router = spawn(
        "router",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--zmq-bind",
        f"tcp://127.0.0.1:{zmq_port}",
        "--policy",
        policy,
        "--log-level",
        "WARNING",
        "--max-pending",
        "100000",
    )
    procs = spawn_workers(f"tcp://127.0.0.1:{zmq_port}", workers, args.token_delay)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(base, workers)
        await via_router(base, argparse.Namespace(**{**vars(args), "seconds": 0.5}), concurrency)
        latencies, errors, elapsed = await via_router(base, args, concurrency)
    finally:
        for p in [router, *procs]:
            p.terminate()
        for p in [router, *procs]:
            p.wait()
    return {"latencies": latencies, "errors": errors, "elapsed": elapsed}


async def main_async(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "bench", context_length=4096)
        from router.text.tokenizer import ModelTokenizer

        token_ids = ModelTokenizer.load(model_dir).encode_chat(messages(0))
        for concurrency in args.concurrency:
            base_lat, _, base_elapsed = await direct(args, concurrency, token_ids)
            b50, b99 = percentiles_ms(base_lat)
            for policy in args.policies:
                r = await run_config(args, model_dir, policy, args.workers, concurrency)
                p50, p99 = percentiles_ms(r["latencies"])
                print(
                    json.dumps(
                        {
                            "policy": policy,
                            "workers": args.workers,
                            "concurrency": concurrency,
                            "max_tokens": args.max_tokens,
                            "token_delay_s": args.token_delay,
                            "requests": len(r["latencies"]),
                            "errors": r["errors"],
                            "rps": round(len(r["latencies"]) / r["elapsed"], 1),
                            "p50_ms": p50,
                            "p99_ms": p99,
                            "baseline_rps_one_worker": round(len(base_lat) / base_elapsed, 1),
                            "baseline_p50_ms": b50,
                            "baseline_p99_ms": b99,
                            "added_p50_ms": round(p50 - b50, 3),
                            "added_p99_ms": round(p99 - b99, 3),
                            "prompt_tokens": len(token_ids),
                            "cpus": os.cpu_count(),
                        }
                    ),
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="per configuration")
    p.add_argument("--max-requests", type=int, default=20000, help="per configuration")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--token-delay", type=float, default=0.0, help="stand-in seconds per token")
    asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    main()
