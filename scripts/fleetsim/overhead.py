"""The router's own CPU per request on the real routing path, and what it means at a rate.

Per request, in this process (time.process_time): render the chat template and tokenize
(router.text.tokenizer, the default model's tokenizer), then `Dispatcher.start` (block hashing,
prefix-index match over every worker, affinity, policy) and encoding the Generate frame, and
the finishing delta. The fleet (16 workers by default) and its index were filled by a
simulated warm-up, so the index holds what a busy fleet's would.

One event loop serves requests one at a time, so the overhead at an offered rate is that
service time plus queueing behind other requests: a single-server queue fed Poisson arrivals
with the measured service times (Lindley's recursion). At rate x mean service >= 1 the loop is
saturated: its ceiling is 1 / mean service time. Aiohttp's own HTTP parsing and the SSE
writes are not in these numbers (they come on top). The `threads_` columns are the same queue
with the tokenizer's encode off the loop (--tokenizer-threads, given enough cores for it).
"""

from __future__ import annotations

import random
import statistics
import time

from scripts.fleetsim.fleet import Fleet
from scripts.fleetsim.scenarios import fleet
from scripts.loadgen.workloads import Shape, multi_tenant
from shared.hashing import hash_blocks
from shared.models.store import resolve_model
from shared.protocol import TokenDelta, Usage, encode
from shared.sampling import SamplingParams


def measure_service_times(workers: int = 16, samples: int = 600, seed: int = 0) -> dict:
    """Per-request CPU seconds of each step of the routing path, over `samples` requests."""
    from router.text.tokenizer import ModelTokenizer  # loads transformers: only when measuring

    tokenizer = ModelTokenizer.load(resolve_model(None))
    scenario = fleet(workers, seed, requests_per_worker=60)
    warm = Fleet(scenario.fleet, "cache_aware")
    warm.run(_scenario_requests(scenario))
    dispatcher = warm.dispatcher
    # from here the dispatcher's socket only encodes the frame (the CPU part of a send)
    dispatcher._send = lambda identity, msg: encode(msg)
    prompts = multi_tenant(samples, seed, Shape(tenants=24, prefix_words=1300))
    render, tokenize, route, hashing = [], [], [], []
    for k, prompt in enumerate(prompts):
        t0 = time.process_time()
        text = tokenizer.render_chat(prompt.messages)
        t_render = time.process_time()
        token_ids = tokenizer.encode_text(text)
        t1 = time.process_time()
        job = dispatcher.start(f"m{k}", token_ids, SamplingParams(max_tokens=32))
        state = warm.registry.get(job.worker_id)
        usage = Usage(len(token_ids), 32, 0)
        dispatcher.on_delta(state, TokenDelta(job.wire_id, (), "stop", usage))
        t2 = time.process_time()
        hash_blocks(token_ids, 32)
        t3 = time.process_time()
        render.append(t_render - t0)
        tokenize.append(t1 - t0)
        route.append(t2 - t1)
        hashing.append(t3 - t2)
    return {
        "workers": workers,
        "prompt_tokens": len(token_ids),
        "tokenize_s": tokenize,
        "render_s": render,
        "route_s": route,
        "hash_s": hashing,
    }


def _scenario_requests(scenario):
    from scripts.fleetsim.workload import Traffic

    rate = scenario.rate_per_worker * scenario.fleet.workers
    return Traffic(scenario.traffic, scenario.seed).requests(scenario.requests, rate)


def overhead_at(rate_per_s: float, service_s: list[float], seed: int = 0) -> dict:
    """p50/p99 routing overhead (queueing + service) on one loop at `rate_per_s` offered."""
    rng = random.Random(seed)
    utilization = rate_per_s * statistics.fmean(service_s)
    if utilization >= 1:
        return {"rate": rate_per_s, "utilization": round(utilization, 2), "saturated": True}
    latencies, wait = [], 0.0
    for _ in range(20_000):
        service = rng.choice(service_s)
        latencies.append(wait + service)
        wait = max(0.0, wait + service - rng.expovariate(rate_per_s))
    latencies.sort()
    return {
        "rate": rate_per_s,
        "utilization": round(utilization, 3),
        "saturated": False,
        "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 3),
    }


def summarize(measured: dict, rates: list[float]) -> list[dict]:
    per_request = [a + b for a, b in zip(measured["tokenize_s"], measured["route_s"], strict=True)]
    mean_us = {
        k: round(statistics.fmean(measured[k]) * 1e6, 1)
        for k in ("tokenize_s", "render_s", "route_s", "hash_s")
    }
    # with --tokenizer-threads the HF encode (GIL released) leaves the loop; the template
    # render and the body checks still hold the GIL, so they count against the loop
    on_loop = statistics.fmean(measured["render_s"]) + statistics.fmean(measured["route_s"])
    base = {
        "scenario": "router-overhead",
        "workers": measured["workers"],
        "prompt_tokens": measured["prompt_tokens"],
        "cpu_us_per_request": round(statistics.fmean(per_request) * 1e6, 1),
        **{f"{k[:-2]}_us": v for k, v in mean_us.items()},
        "loop_ceiling_req_per_s": round(1 / statistics.fmean(per_request)),
        "loop_ceiling_tokenize_threads_req_per_s": round(1 / on_loop),
    }
    offloaded = [a + b for a, b in zip(measured["render_s"], measured["route_s"], strict=True)]
    rows = []
    for rate in rates:
        threaded = {
            f"threads_{k}": v for k, v in overhead_at(rate, offloaded).items() if k not in ("rate",)
        }
        rows.append({**base, **overhead_at(rate, per_request), **threaded})
    return rows
