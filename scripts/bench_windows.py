#!/usr/bin/env python
"""Sliding-window models in one process: our engine against mlx-lm, and windows against full.

Models: a gpt-oss-shaped one (MoE, window 128 on alternate layers, attention sinks) and a
Gemma-3-shaped one (18 layers, one 256-wide KV head, window 512 on five layers of six), random
weights, sized so a forward is not trivial. For each:

  - throughput: generated tokens/s (prefill included) of mlx-lm's own `batch_generate` and of
    our engine on the same model object and prompts, at each batch size; medians of
    `--repeats` runs, the ratio, and whether greedy outputs agree;
  - tick: the decode tick (ms, median over steps) of `--tick-batch` sequences at a context of
    4 x the window, with the model's windows and with the same weights forced to full
    attention on every layer, and the ratio;
  - capacity: the most K/V tokens running sequences held at once in a 1 GiB pool (or
    `--capacity-kv-mib`), prompts of
    4 x the window submitted together, with out-of-window pages released and without
    (`EngineConfig.release_windows`).

Prints one JSON line per measurement.   Usage: scripts/bench_windows.py [--help]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_engine import run_engine, run_mlx_lm  # noqa: E402  (the same runs)
from shared.blas import active_blas, reexec_with_blas  # noqa: E402

VOCAB = 49152  # the default model's tokenizer drives mlx-lm's batch_generate

SHAPES = {
    "gpt_oss": dict(
        model_type="gpt_oss",
        hidden_size=512,
        num_hidden_layers=8,
        intermediate_size=512,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=128,
        rms_norm_eps=1e-5,
        rope_theta=150000.0,
        layer_types=["sliding_attention", "full_attention"] * 4,
        vocab_size=VOCAB,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text",
        hidden_size=640,
        num_hidden_layers=18,
        intermediate_size=2048,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        sliding_window_pattern=6,
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB,
    ),
}


def build(config: dict, full: bool = False):
    import importlib

    import mlx.core as mx

    config = dict(config)
    if full:  # the same weights, every window wider than any context: full attention
        config["sliding_window"] = 1 << 20
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def engine_for(model, **config):
    import mlx.core as mx

    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    gc.collect()
    mx.clear_cache()
    config.setdefault("kv_memory_bytes", 1 << 30)
    return Engine.create(model, EngineConfig(**config), max_context=8192)


def prompts_for(batch: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, VOCAB) for _ in range(length + 7 * i)] for i in range(batch)]


def bench_throughput(name, model, tokenizer, args) -> None:
    for batch in args.batch_sizes:
        prompts = prompts_for(batch, args.prompt_tokens, seed=batch)
        run_mlx_lm(model, tokenizer, prompts[:1], 2)  # warm both
        run_engine(model, tokenizer, prompts[:1], 2, max_running=8)
        ours, theirs, same = [], [], 0
        for _ in range(args.repeats):
            t_mlx, out_mlx = run_mlx_lm(model, tokenizer, prompts, args.max_tokens)
            t_ours, out_ours, _ = run_engine(
                model, tokenizer, prompts, args.max_tokens, max_running=max(8, batch)
            )
            theirs.append(sum(map(len, out_mlx)) / t_mlx)
            ours.append(sum(map(len, out_ours)) / t_ours)
            same = sum(a == b for a, b in zip(out_mlx, out_ours, strict=True))
        print(
            json.dumps(
                {
                    "bench": "throughput",
                    "model": name,
                    "batch": batch,
                    "repeats": args.repeats,
                    "mlx_lm_tok_s": round(statistics.median(theirs), 1),
                    "engine_tok_s": round(statistics.median(ours), 1),
                    "ratio": round(statistics.median(ours) / statistics.median(theirs), 2),
                    "identical_outputs": f"{same}/{batch}",
                }
            ),
            flush=True,
        )


def decode_tick_ms(model, batch: int, context: int, steps: int) -> float:
    from shared.sampling import SamplingParams

    engine = engine_for(model, max_running=batch, speculative="off")
    for i, p in enumerate(prompts_for(batch, context, seed=99)):
        engine.add_request(str(i), p[:context], SamplingParams(max_tokens=steps + 2))
    ticks = []
    while engine.has_work():
        decoding = not any(s.is_prefilling for s in engine.scheduler.running)
        start = time.perf_counter()
        engine.step()
        if decoding and len(engine.scheduler.running) == batch:
            ticks.append((time.perf_counter() - start) * 1000)
    return statistics.median(ticks[2:] or ticks)


def bench_tick(name, config, args) -> None:
    window = config["sliding_window"]
    context = 4 * window
    windowed = decode_tick_ms(build(config), args.tick_batch, context, args.tick_steps)
    full = decode_tick_ms(build(config, full=True), args.tick_batch, context, args.tick_steps)
    print(
        json.dumps(
            {
                "bench": "decode_tick",
                "model": name,
                "batch": args.tick_batch,
                "window": window,
                "context": context,
                "window_ms": round(windowed, 1),
                "full_ms": round(full, 1),
                "full_over_window": round(full / windowed, 2),
            }
        ),
        flush=True,
    )


def bench_capacity(name, model, args) -> None:
    """Peak tokens resident in a `--capacity-kv-mib` pool: `--capacity-requests` prompts of
    4 x the window submitted at once, generating until the pool is full, with out-of-window
    pages released and without; the most tokens running sequences held at once."""
    from shared.sampling import SamplingParams

    window = model.args.sliding_window
    context = 4 * window
    result = {}
    budget = args.capacity_kv_mib << 20
    for release in (True, False):
        engine = engine_for(
            model, release_windows=release, warmup=False, max_running=64, kv_memory_bytes=budget
        )
        for i, p in enumerate(prompts_for(args.capacity_requests, context, seed=7)):
            engine.add_request(str(i), p[:context], SamplingParams(max_tokens=100_000))
        # sequences that never finish: the pool fills, then admission stops; the peak is
        # what it holds (stop once every request runs, or none joined for 40 steps)
        peak, start, quiet, running = 0, time.perf_counter(), 0, 0
        while engine.scheduler.waiting and quiet < 40:
            engine.step()
            peak = max(peak, sum(s.num_computed for s in engine.scheduler.running))
            quiet = 0 if len(engine.scheduler.running) > running else quiet + 1
            running = max(running, len(engine.scheduler.running))
        pool = engine.pool
        result[release] = dict(
            peak=peak,
            units=pool.num_blocks,
            running=running,
            preemptions=engine.stats()["preemptions"],
            seconds=time.perf_counter() - start,
        )
    on, off = result[True], result[False]
    print(
        json.dumps(
            {
                "bench": "capacity",
                "model": name,
                "kv_budget_bytes": budget,
                "context": context,
                "requests": args.capacity_requests,
                "peak_tokens_released": on["peak"],
                "peak_tokens_unreleased": off["peak"],
                "ratio": round(on["peak"] / off["peak"], 2),
                "pool_tokens_ceiling_released": on["units"] * 32,
                "pool_tokens_unreleased": off["units"] * 32,
                "running_released": on["running"],
                "running_unreleased": off["running"],
                "preemptions_released": on["preemptions"],
                "preemptions_unreleased": off["preemptions"],
                "seconds_released": round(on["seconds"], 1),
                "seconds_unreleased": round(off["seconds"], 1),
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="gpt_oss,gemma3_text", help="comma-separated")
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32]
    )
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tick-batch", type=int, default=8)
    parser.add_argument("--tick-steps", type=int, default=12)
    parser.add_argument("--capacity-requests", type=int, default=48)
    parser.add_argument(
        "--capacity-kv-mib", type=int, default=1024, help="the KV budget of the capacity runs"
    )
    parser.add_argument(
        "--skip", choices=["throughput", "tick", "capacity"], action="append", default=[]
    )
    args = parser.parse_args()
    reexec_with_blas()

    from shared.models.loading import load_model
    from shared.models.store import resolve_model

    _, tokenizer = load_model(resolve_model(None))
    print(json.dumps({"bench": "setup", "blas": active_blas()}), flush=True)
    for name in args.models.split(","):
        config = SHAPES[name]
        if "capacity" not in args.skip:  # the same K/V shape, a narrower trunk: faster fills
            narrow = {**config, "hidden_size": 128, "intermediate_size": 256}
            bench_capacity(name, build(narrow), args)
        model = build(config)
        if "throughput" not in args.skip:
            bench_throughput(name, model, tokenizer, args)
        if "tick" not in args.skip:
            bench_tick(name, config, args)


if __name__ == "__main__":
    main()
