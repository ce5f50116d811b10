#!/usr/bin/env python
"""Engine throughput vs mlx-lm's own batching, and prefill with vs without the radix cache.

One process, one run, the same model object and prompts for both systems:
  - batch sizes 1, 8, 32: generated tokens/s (prefill included) of mlx-lm's `batch_generate`
    (BatchGenerator) and of our engine, and their ratio; greedy outputs are compared too;
  - shared prefix: N prompts sharing a long system prompt, prefill time with the radix
    cache vs without it.
  - --open-loop: requests arrive as a Poisson process (a tokens target: N requests x
    max_tokens); prints static (all at once), continuous (open loop, whole run) and
    steady-window tokens/s, and the time in ramp (until the first request finishes), steady
    (until the last arrival) and tail, with the decode spikes (ticks over 200 ms).
Prints one JSON line per configuration.   Usage: scripts/bench_engine.py [--help]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import active_blas, reexec_with_blas  # noqa: E402

TOPICS = [
    "the sea",
    "mountains",
    "a city at night",
    "autumn",
    "a library",
    "coffee",
    "the moon",
    "trains",
    "a garden",
    "snow",
    "bridges",
    "a market",
    "clocks",
    "rivers",
    "a lighthouse",
    "deserts",
]


def chat_prompts(tokenizer, n: int, offset: int = 0) -> list[list[int]]:
    prompts = []
    for i in range(offset, offset + n):
        text = f"Write a short paragraph about {TOPICS[i % len(TOPICS)]}, idea number {i}."
        prompts.append(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
        )
    return prompts


def run_engine(
    model, tokenizer, prompts, max_tokens, **config
) -> tuple[float, list[list[int]], dict]:
    import gc

    import mlx.core as mx

    from shared.sampling import SamplingParams
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    gc.collect()  # the previous run's engine and its KV pool go before this one's come
    mx.clear_cache()
    # 2 GiB of KV holds every run here; the default (a quarter of memory) per engine, with
    # a few engines alive at once, would not fit a 24 GB machine
    config.setdefault("kv_memory_bytes", 2 << 30)
    engine = Engine.create(model, EngineConfig(**config), max_context=8192)
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=tuple(tokenizer.eos_token_ids))
    outputs = {i: [] for i in range(len(prompts))}
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    while engine.has_work():
        for d in engine.step():
            outputs[int(d.request_id)].extend(d.token_ids)
            if d.finish_reason == "stop":
                outputs[int(d.request_id)].append(tokenizer.eos_token_id)  # mlx-lm counts it
    return time.perf_counter() - start, [outputs[i] for i in range(len(prompts))], engine.stats()


def run_mlx_lm(model, tokenizer, prompts, max_tokens) -> tuple[float, list[list[int]]]:
    from mlx_lm.generate import batch_generate

    start = time.perf_counter()
    result = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens, return_token_ids=True)
    return time.perf_counter() - start, [list(ids) for ids in result.token_ids]


def bench_batches(model, tokenizer, args) -> None:
    for i, batch in enumerate(args.batch_sizes):
        prompts = chat_prompts(tokenizer, batch, offset=100 * i)
        run_mlx_lm(model, tokenizer, prompts[:1], 4)  # warm both paths
        mlx_time, mlx_out = run_mlx_lm(model, tokenizer, prompts, args.max_tokens)
        ours_time, ours_out, stats = run_engine(
            model, tokenizer, prompts, args.max_tokens, max_running=max(batch, 1)
        )
        plain_time, plain_out, _ = run_engine(
            model,
            tokenizer,
            prompts,
            args.max_tokens,
            max_running=max(batch, 1),
            pipeline_decode=False,
        )
        spec_time, spec_out, spec_stats = run_engine(
            model,
            tokenizer,
            prompts,
            args.max_tokens,
            max_running=max(batch, 1),
            speculative="ngram",
        )
        spec_tps = sum(map(len, spec_out)) / spec_time
        mlx_tps = sum(map(len, mlx_out)) / mlx_time
        ours_tps = sum(map(len, ours_out)) / ours_time
        plain_tps = sum(map(len, plain_out)) / plain_time
        same = sum(a == b for a, b in zip(mlx_out, ours_out, strict=True))
        print(
            json.dumps(
                {
                    "bench": "throughput",
                    "batch": batch,
                    "max_tokens": args.max_tokens,
                    "mlx_lm_tok_s": round(mlx_tps, 1),
                    "engine_tok_s": round(ours_tps, 1),
                    "ratio": round(ours_tps / mlx_tps, 2),
                    "identical_outputs": f"{same}/{batch}",
                    "engine_unpipelined_tok_s": round(plain_tps, 1),
                    "pipelining_gain": round(ours_tps / plain_tps, 2),
                    "engine_spec_tok_s": round(spec_tps, 1),
                    "spec_ratio": round(spec_tps / mlx_tps, 2),
                    "spec_acceptance": round(spec_stats["spec_acceptance"], 2),
                    "spec_identical": spec_out == ours_out,
                    "engine_decode_step_p50_ms": round(stats["decode_step_p50_ms"], 1),
                }
            ),
            flush=True,
        )


def bench_shared_prefix(model, tokenizer, args) -> None:
    system = " ".join(
        f"Rule {i}: answer politely, briefly and with care about topic {i}."
        for i in range(args.prefix_rules)
    )
    prompts = []
    for i in range(args.prefix_prompts):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question {i}: what is {i} plus {i}?"},
        ]
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    timings = {}
    for cached in (False, True):
        elapsed, _, stats = run_engine(
            model, tokenizer, prompts, 1, enable_prefix_cache=cached, max_running=64
        )
        timings[cached] = (elapsed, stats["prefill_tokens"])
    print(
        json.dumps(
            {
                "bench": "shared_prefix",
                "prompts": len(prompts),
                "prompt_tokens": len(prompts[0]),
                "prefill_s_without_cache": round(timings[False][0], 2),
                "prefill_s_with_cache": round(timings[True][0], 2),
                "prefill_tokens_without": timings[False][1],
                "prefill_tokens_with": timings[True][1],
                "speedup": round(timings[False][0] / timings[True][0], 2),
            }
        ),
        flush=True,
    )


def bench_open_loop(model, tokenizer, args) -> None:
    from shared.sampling import SamplingParams
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    n, rate = args.open_loop_requests, args.rate
    prompts = chat_prompts(tokenizer, n, offset=1000)
    static_time, static_out, _ = run_engine(model, tokenizer, prompts, args.max_tokens)
    rng = random.Random(0)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    engine = Engine.create(model, EngineConfig(), max_context=8192)
    params = SamplingParams(
        max_tokens=args.max_tokens, stop_token_ids=tuple(tokenizer.eos_token_ids)
    )
    pending = deque(zip(arrivals, range(n), strict=True))
    produced: list[tuple[float, int]] = []  # (time, tokens) per step
    first_finish = None
    start = time.perf_counter()
    while pending or engine.has_work():
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            _, i = pending.popleft()
            engine.add_request(str(i), prompts[i], params)
        if not engine.has_work():
            time.sleep(min(0.01, max(0.0, pending[0][0] - now)))
            continue
        deltas = engine.step()
        now = time.perf_counter() - start
        produced.append((now, sum(len(d.token_ids) for d in deltas)))
        if first_finish is None and any(d.finish_reason for d in deltas):
            first_finish = now
    total = produced[-1][0]
    tokens = sum(k for _, k in produced)
    ramp_end, steady_end = first_finish or total, max(arrivals[-1], first_finish or total)
    steady = sum(k for t, k in produced if ramp_end < t <= steady_end)
    stats = engine.stats()
    print(
        json.dumps(
            {
                "bench": "open_loop",
                "requests": n,
                "rate_req_s": rate,
                "max_tokens": args.max_tokens,
                "static_tok_s": round(sum(map(len, static_out)) / static_time, 1),
                "continuous_tok_s": round(tokens / total, 1),
                "steady_tok_s": round(steady / (steady_end - ramp_end), 1)
                if steady_end > ramp_end
                else None,
                "ramp_s": round(ramp_end, 2),
                "steady_s": round(steady_end - ramp_end, 2),
                "tail_s": round(total - steady_end, 2),
                "spikes": stats["decode_spikes"],
                "spike_s": round(stats["decode_spike_seconds"], 2),
                "decode_tick_p50_ms": round(stats["decode_step_p50_ms"], 1),
                "decode_tick_p95_ms": round(stats["decode_step_p95_ms"], 1),
                "prefill_chunk_p50_ms": round(stats["prefill_chunk_p50_ms"], 1),
                "kv_write_ms_p50": round(stats["kv_write_ms_p50"], 2),
                "attention_ms_p50": round(stats["attention_ms_p50"], 2),
                "decode_batch_mean": round(stats["decode_batch_mean"], 1),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model (default: the default model)")
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prefix-prompts", type=int, default=16)
    parser.add_argument(
        "--prefix-rules", type=int, default=60, help="length of the shared system prompt"
    )
    parser.add_argument("--skip", choices=["throughput", "prefix"], action="append", default=[])
    parser.add_argument(
        "--open-loop", action="store_true", help="only the open-loop (Poisson arrivals) run"
    )
    parser.add_argument("--open-loop-requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=2.0, help="open-loop arrivals per second")
    args = parser.parse_args()
    reexec_with_blas()

    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    model, tokenizer = load_model(resolve_model(args.model))
    print(json.dumps({"bench": "setup", "blas": active_blas()}), flush=True)
    if args.open_loop:
        bench_open_loop(model, tokenizer, args)
        return
    if "throughput" not in args.skip:
        bench_batches(model, tokenizer, args)
    if "prefix" not in args.skip:
        bench_shared_prefix(model, tokenizer, args)


if __name__ == "__main__":
    main()
