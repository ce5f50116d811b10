"""Drive a workload against a server: closed loop (fixed concurrency) or open loop (Poisson
arrivals), bounded in requests and time, and build the run's report."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from scripts.loadgen.client import ChatParams, RequestResult, stream_chat
from scripts.loadgen.stats import (
    busy_per_worker,
    fleet_cache,
    pulled_blocks_per_worker,
    requests_per_worker,
    speculation,
    summarize,
)
from scripts.loadgen.workloads import Prompt, Shape, build

Send = Callable[[Prompt], Awaitable[RequestResult]]
Progress = Callable[[int, int], None]  # (requests done, requests planned)
HEARTBEAT_WAIT_S = 2.5  # > two heartbeats (1 s by default): the longest wait for the counters


@dataclass(frozen=True)
class LoadConfig:
    url: str  # the server's base URL, without /v1
    workload: str = "multi_tenant"
    requests: int = 64
    concurrency: int = 8  # closed loop: requests in flight
    rate: float | None = None  # open loop: mean arrivals per second (Poisson); None = closed
    seed: int = 0
    max_tokens: int = 32
    temperature: float = 0.0
    model: str | None = None  # None: the first id that /v1/models lists
    warmup: int = 1  # requests sent first and not measured (prompts outside the workload)
    max_duration_s: float = 600.0  # no new request starts after this
    request_timeout_s: float = 300.0
    shape: Shape = field(default_factory=Shape)

    @property
    def mode(self) -> str:
        return "closed" if self.rate is None else "open"


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Start offsets (seconds from 0) of n arrivals of a Poisson process with `rate` per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0 requests per second")
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(n):
        now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


async def closed_loop(
    send: Send, prompts: Sequence[Prompt], concurrency: int, deadline: float
) -> list[RequestResult]:
    """`concurrency` clients, each sending the next prompt as soon as its last one finished."""
    results: list[RequestResult | None] = [None] * len(prompts)
    indices = iter(range(len(prompts)))

    async def client() -> None:
        for i in indices:
            if time.perf_counter() > deadline:
                return
            results[i] = await send(prompts[i])

    await asyncio.gather(*(client() for _ in range(max(1, concurrency))))
    return [r for r in results if r is not None]


async def open_loop(
    send: Send, prompts: Sequence[Prompt], arrivals: Sequence[float], deadline: float
) -> list[RequestResult]:
    """Send prompt i at `arrivals[i]` seconds from now, whatever is still in flight."""
    start = time.perf_counter()
    tasks = []
    for prompt, offset in zip(prompts, arrivals, strict=True):
        at = start + offset
        if at > deadline:
            break
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.create_task(send(prompt)))
    return list(await asyncio.gather(*tasks))


async def get_json(session: aiohttp.ClientSession, url: str) -> dict | None:
    """GET a JSON object, or None when the server has no such endpoint or fails."""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                body = await resp.json(content_type=None)
                return body if isinstance(body, dict) else None
    return None


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    models = await get_json(session, f"{base_url}/v1/models")
    data = (models or {}).get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return data[0]["id"]


def warmup_prompts(config: LoadConfig) -> list[Prompt]:
    """Short prompts that share nothing with the workload (another seed, control shape)."""
    shape = dataclasses.replace(config.shape, prefix_words=20)
    return build("control", config.warmup, config.seed + 1_000_003, shape)


async def run_load(config: LoadConfig, progress: Progress | None = None) -> dict:
    """Run `config` once and return its report (a JSON-ready dict)."""
    prompts = build(config.workload, config.requests, config.seed, config.shape)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        base = config.url.rstrip("/")
        model = config.model or await served_model(session, base)
        params = ChatParams(model, config.max_tokens, config.temperature, config.request_timeout_s)
        cluster = f"{base}/v1/cluster"
        before = await get_json(session, cluster)
        warmups = [
            await stream_chat(session, base, prompt.messages, params)
            for prompt in warmup_prompts(config)
        ]
        if before is not None and warmups:  # their counters are in before the run starts
            before = await counted_snapshot(session, cluster, before, sum(r.ok for r in warmups))

        done = 0

        async def send(prompt: Prompt) -> RequestResult:
            nonlocal done
            own = prompt.max_tokens is not None and prompt.max_tokens != params.max_tokens
            use = dataclasses.replace(params, max_tokens=prompt.max_tokens) if own else params
            result = await stream_chat(session, base, prompt.messages, use)
            done += 1
            if progress is not None:
                progress(done, len(prompts))
            return result

        start = time.perf_counter()
        deadline = start + config.max_duration_s
        if config.rate is None:
            results = await closed_loop(send, prompts, config.concurrency, deadline)
        else:
            arrivals = poisson_arrivals(len(prompts), config.rate, config.seed)
            results = await open_loop(send, prompts, arrivals, deadline)
        elapsed = (max((r.end for r in results), default=start)) - start
        if before is None:
            after = await get_json(session, cluster)
        else:  # the workers' counters arrive by heartbeat
            after = await counted_snapshot(session, cluster, before, sum(r.ok for r in results))
    return build_report(config, model, results, elapsed, before, after)


async def counted_snapshot(
    session: aiohttp.ClientSession, url: str, before: dict, served: int
) -> dict | None:
    """/v1/cluster once the workers' counters (they arrive by heartbeat) count the `served`
    requests since `before`; at most HEARTBEAT_WAIT_S after the run, then as it stands."""
    give_up = time.perf_counter() + HEARTBEAT_WAIT_S
    while True:
        after = await get_json(session, url)
        counted = sum((requests_per_worker(before, after) or {}).values())
        if after is None or counted >= served or time.perf_counter() >= give_up:
            return after
        await asyncio.sleep(0.1)


def build_report(
    config: LoadConfig,
    model: str,
    results: Sequence[RequestResult],
    elapsed_s: float,
    before: dict | None,
    after: dict | None,
) -> dict:
    load = {"concurrency": config.concurrency} if config.rate is None else {"rate": config.rate}
    return {
        "url": config.url,
        "model": model,
        "workload": config.workload,
        "mode": config.mode,
        **load,
        "seed": config.seed,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "planned": config.requests,
        "not_sent": config.requests - len(results),
        **summarize(results, elapsed_s),
        "policy": after.get("policy") if after else None,
        "requests_per_worker": requests_per_worker(before, after),
        "busy_per_worker": busy_per_worker(before, after, elapsed_s),
        # prompt tokens hit locally vs pulled from a peer (the router's /v1/cluster `cache`)
        "fleet_cache": fleet_cache(before, after),
        "pulled_blocks_per_worker": pulled_blocks_per_worker(before, after),
        "speculation": speculation(before, after),
        # where each worker's step time went (recent window): the phase metrics, at the end
        "worker_phases": {w["id"]: w.get("phases") for w in (after or {}).get("workers", [])},
    }
