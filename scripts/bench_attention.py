"""Benchmark the MLX paged-attention strategies and the cost of writing K/V into the pools.

Prints one JSON line per configuration.

attention: decode at batch 1, 8, 32 over contexts of 128-1024 tokens, a prefill chunk (Lq=256
over a 1024-token prefix), and two long contexts (decode at batch 4 over 8192 tokens, Lq=256
over a 4096-token prefix); 9 heads, 3 KV heads, head dim 64, block size 32, float32,
shuffled block ids. Strategies: "tiled" (the "mlx" backend's default), "gather" (untiled),
"blockwise" (online softmax, 1 or 8 blocks per step). Each is timed against dense
`mx.fast.scaled_dot_product_attention` over contiguous `(B, Hkv, max_len, D)` K/V with the same
mask (what a contiguous batched cache would run), in the same run, taking turns; `*_vs_dense`
is time / dense time (< 1: faster).

shared: decode rows that share tenants' prefixes (G tenants x R rows, prefix and own-tail
lengths), as a cache-aware worker's batch holds them: "tiled" against "shared_prefix" (each
tenant's prefix gathered once for its rows; "shared_kept": with the gathered prefixes kept
across calls, as a worker's decode ticks run it), checked against the plain gather. The last
cases nest: all tenants share a header (an agent fleet's tool preamble), then diverge.

window: a decode tick of a sliding-window layer (W 128, as gpt-oss's, and 1024) at context 4W,
batch 1 and 8, through `AttentionPlan` (the "mlx" backend, prepared once as a forward does):
"window" (the plan built with `window=W`: it gathers W keys a row), "window_sinks" (with
per-head sinks too), "full" (the same rows, no window: 4W keys a row) and "full_at_w" (no
window at context exactly W: what a windowed tick should cost; rows of unequal length would
add masked padding, which here cost up to 2x by itself); medians of rounds, taking turns.
`window_vs_full` and `window_vs_full_at_w` are time ratios (< 1: the window is faster).

scatter: a decode-like write loop, 30 layers, 32 new slots per layer per step, eval per step,
for pools of 10k/30k/100k slots (x 3 KV heads x 64 dims, float32: up to 4.6 GB for K and V of
all layers). "sole": the pools hold the only reference to their buffers (what write_kv needs);
"stray_view": an evaluated slice of each old pool is kept alive across the write; "self_copy":
the written values are read from the same pool in the same graph (`k[dst] = k[src]`, as a
copy-on-write would do without evaluating `k[src]` first). Both make MLX copy the whole pool;
they run at 10k and 30k slots only (at 100k a step took 3-10 s). Per-step time flat in pool
size = no copy.

On Linux, preload OpenBLAS for representative numbers; on a small shared machine one BLAS
thread gives steadier timings (with two, runs here varied more under the neighbours' load):
  OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
    python scripts/bench_attention.py
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.attention import PrefixKV, slot_ids, write_kv  # noqa: E402
from worker.attention.mlx_ops import blockwise_attention, gather_attention  # noqa: E402
from worker.attention.paged import BACKENDS, AttentionPlan  # noqa: E402
from worker.attention.shared_prefix import (  # noqa: E402
    plan_shared_prefixes,
    shared_prefix_attention,
)
from worker.attention.tiles import prepare_tiles, tiled_attention  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 32
NUM_LAYERS, WRITES_PER_STEP = 30, 32

STRATEGIES: dict[str, Callable[..., mx.array]] = {
    "tiled": tiled_attention,  # the "mlx" backend's default
    "gather": gather_attention,
    "blockwise": blockwise_attention,
    "blockwise8": partial(blockwise_attention, blocks_per_step=8),
}
TILE_SWEEP = {f"tiled{mb}m": partial(tiled_attention, tile_bytes=mb << 20) for mb in (2, 4, 16)}


def make_case(rng: np.random.Generator, lengths: list[int], num_queries: int) -> dict:
    """Pools with spare blocks, shuffled block tables, queries and a contiguous copy of the KV."""
    blocks_each = [math.ceil(n / BLOCK_SIZE) for n in lengths]
    num_blocks = sum(blocks_each) + 16
    ids = rng.permutation(num_blocks)
    tables = np.zeros((len(lengths), max(blocks_each)), np.int32)
    used = 0
    for b, n in enumerate(blocks_each):
        tables[b, :n] = ids[used : used + n]
        used += n
    shape = (num_blocks * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_pool = mx.array(rng.standard_normal(shape, np.float32))
    v_pool = mx.array(rng.standard_normal(shape, np.float32))
    queries = mx.array(
        rng.standard_normal((len(lengths), NUM_HEADS, num_queries, HEAD_DIM), np.float32)
    )
    block_tables, context_lengths = mx.array(tables), mx.array(np.array(lengths, np.int32))
    slots = slot_ids(block_tables, mx.zeros(len(lengths), mx.int32), max(lengths), BLOCK_SIZE)
    key_pos = mx.arange(max(lengths))
    query_pos = context_lengths[:, None] - num_queries + mx.arange(num_queries)
    case = {
        "queries": queries,
        "k_pool": k_pool,
        "v_pool": v_pool,
        "block_tables": block_tables,
        "context_lengths": context_lengths,
        "dense_k": mx.contiguous(k_pool[slots].swapaxes(1, 2)),
        "dense_v": mx.contiguous(v_pool[slots].swapaxes(1, 2)),
        "dense_mask": (key_pos <= query_pos[:, :, None])[:, None],
    }
    mx.eval(list(case.values()))
    return case


def interleaved_ms(runs: dict[str, Callable[[], mx.array]], args) -> dict[str, list[float]]:
    """Per contender, the mean time of `args.iters` evaluated calls in each of `args.rounds`
    rounds, the contenders taking turns within each round so background load hits them alike
    (the machine is shared)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        mx.eval(run())
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(args.iters):
                mx.eval(run())
            times[name].append((time.perf_counter() - start) / args.iters * 1e3)
    return times


def interleaved_best_ms(runs: dict[str, Callable[[], mx.array]], args) -> dict[str, float]:
    """The best round of each contender (`interleaved_ms`)."""
    return {name: min(ts) for name, ts in interleaved_ms(runs, args).items()}


def bench_attention_case(name: str, lengths: list[int], num_queries: int, args) -> dict:
    case = make_case(np.random.default_rng(args.seed), lengths, num_queries)
    scale = HEAD_DIM**-0.5
    runs = {
        "dense_sdpa": partial(
            mx.fast.scaled_dot_product_attention,
            case["queries"],
            case["dense_k"],
            case["dense_v"],
            scale=scale,
            mask=case["dense_mask"],
        )
    }
    reference = runs["dense_sdpa"]()
    strategies = {**STRATEGIES, **TILE_SWEEP} if args.tile_sweep else STRATEGIES
    for label, strategy in strategies.items():
        runs[label] = partial(
            strategy,
            case["queries"],
            case["k_pool"],
            case["v_pool"],
            case["block_tables"],
            case["context_lengths"],
            scale=scale,
            block_size=BLOCK_SIZE,
            max_context=max(lengths),
        )
        error = mx.abs(runs[label]() - reference).max().item()
        if error > 1e-4:
            raise AssertionError(f"{label} disagrees with dense SDPA on {name}: {error}")
    times = interleaved_best_ms(runs, args)
    row = {
        "case": name,
        "batch": len(lengths),
        "lq": num_queries,
        "context_min": min(lengths),
        "context_max": max(lengths),
        "context_sum": sum(lengths),
    }
    for label, ms in times.items():
        row[f"{label}_ms"] = round(ms, 3)
    for label in strategies:
        row[f"{label}_vs_dense"] = round(times[label] / times["dense_sdpa"], 2)
    return row


def attention_cases(rng: np.random.Generator) -> list[tuple[str, list[int], int]]:
    def mixed(batch: int) -> list[int]:
        return [int(n) for n in rng.integers(128, 1025, batch)]

    return [
        ("decode", [1000], 1),
        ("decode", mixed(8), 1),
        ("decode", mixed(32), 1),
        ("decode", [1024] * 32, 1),
        ("prefill_chunk", [1024 + 256], 256),
        # Contexts over the tile budget, which the tiled strategy walks in key steps.
        ("decode_long", [8192] * 4, 1),
        ("prefill_chunk_long", [4096 + 256], 256),
    ]


SHARED_CASES = (  # tenants, rows each, prefix tokens, longest own tail, header all share
    (4, 3, 512, 80, 0),
    (2, 8, 512, 80, 0),
    (8, 2, 1408, 40, 0),
    (16, 2, 512, 40, 0),
    (32, 2, 256, 20, 0),
    (2, 4, 1888, 60, 0),  # the agent load: 2 tenants' ~1.9k-token prompts, concurrency 8
    # nested: an agent fleet's common tool preamble, then each tenant's own prompt
    (4, 3, 1024, 80, 512),
    (8, 2, 1408, 40, 1024),
)


def bench_shared_prefix_case(
    tenants: int, rows_each: int, prefix: int, tail: int, header: int, args
) -> dict:
    rng = np.random.default_rng(args.seed)
    prefix_blocks = prefix // BLOCK_SIZE
    tails = [int(n) for n in rng.integers(tail // 2, tail + 1, tenants * rows_each)]
    num_blocks = tenants * prefix_blocks + sum(math.ceil(n / BLOCK_SIZE) for n in tails) + 1
    ids = iter(int(i) for i in rng.permutation(np.arange(1, num_blocks)))
    header_ids = [next(ids) for _ in range(header // BLOCK_SIZE)]
    shared = [
        header_ids + [next(ids) for _ in range(prefix_blocks - len(header_ids))]
        for _ in range(tenants)
    ]
    tables = [
        shared[r // rows_each] + [next(ids) for _ in range(math.ceil(n / BLOCK_SIZE))]
        for r, n in enumerate(tails)
    ]
    lengths = [prefix + n for n in tails]
    shape = (num_blocks * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_pool = mx.array(rng.standard_normal(shape, np.float32))
    v_pool = mx.array(rng.standard_normal(shape, np.float32))
    queries = mx.array(rng.standard_normal((len(lengths), NUM_HEADS, 1, HEAD_DIM), np.float32))
    width = max(len(t) for t in tables)
    block_tables = mx.array([t + [0] * (width - len(t)) for t in tables], dtype=mx.int32)
    context_lengths = mx.array(lengths, dtype=mx.int32)
    scale = HEAD_DIM**-0.5
    common = dict(scale=scale, block_size=BLOCK_SIZE, max_context=max(lengths))
    tiles = prepare_tiles(
        lengths,
        1,
        NUM_HEADS,
        k_pool,
        BLOCK_SIZE,
        block_tables=block_tables,
        context_lengths=context_lengths,
    )
    plan = plan_shared_prefixes(tables, lengths, BLOCK_SIZE, NUM_KV_HEADS)
    # as a worker runs it: a store of the pool's kept prefixes, so their K/V are kept across
    # calls (a fresh one per case: these versions repeat from case to case, a worker's never do)
    store = PrefixKV([1] * num_blocks)
    kept = plan_shared_prefixes(tables, lengths, BLOCK_SIZE, NUM_KV_HEADS, store)
    runs = {
        "tiled": partial(
            tiled_attention,
            queries,
            k_pool,
            v_pool,
            block_tables,
            context_lengths,
            tiles=tiles,
            **common,
        ),
        "shared_prefix": partial(
            shared_prefix_attention, queries, k_pool, v_pool, plan, scale=scale
        ),
        "shared_kept": partial(shared_prefix_attention, queries, k_pool, v_pool, kept, scale=scale),
    }
    reference = gather_attention(queries, k_pool, v_pool, block_tables, context_lengths, **common)
    for label, run in runs.items():
        error = mx.abs(run() - reference).max().item()
        if error > 1e-4:
            raise AssertionError(f"{label} disagrees with the plain gather: {error}")
    times = interleaved_best_ms(runs, args)
    return {
        "case": "shared_prefix_decode",
        "tenants": tenants,
        "rows_each": rows_each,
        "prefix": prefix,
        "tail_max": tail,
        "header": header,
        "groups": len(plan.depths),
        **{f"{label}_ms": round(ms, 3) for label, ms in times.items()},
        "shared_vs_tiled": round(times["shared_prefix"] / times["tiled"], 2),
        "kept_vs_tiled": round(times["shared_kept"] / times["tiled"], 2),
    }


def interleaved_median_ms(runs: dict[str, Callable[[], mx.array]], args) -> dict[str, float]:
    """The median round of each contender (`interleaved_ms`)."""
    return {name: statistics.median(ts) for name, ts in interleaved_ms(runs, args).items()}


def bench_window_case(window: int, batch: int, args) -> dict:
    """One decode tick of a windowed layer at context 4W, against the same without a window."""
    rng = np.random.default_rng(args.seed)
    lengths = [4 * window - int(rng.integers(0, BLOCK_SIZE)) for _ in range(batch)]
    short = [window] * batch  # W keys a row, as the window reads: no masked padding
    case, at_w = make_case(rng, lengths, 1), make_case(rng, short, 1)
    sinks = mx.array(rng.standard_normal(NUM_HEADS, np.float32))
    scale = HEAD_DIM**-0.5

    def tick(c: dict, w: int | None, with_sinks: bool = False) -> Callable[[], mx.array]:
        plan = AttentionPlan(
            BACKENDS["mlx"],
            c["block_tables"],
            c["context_lengths"].tolist(),
            block_size=BLOCK_SIZE,
            window=w,
        )
        pools = (c["queries"], c["k_pool"], c["v_pool"])
        return partial(plan, *pools, scale=scale, sinks=sinks if with_sinks else None)

    runs = {
        "window": tick(case, window),
        "window_sinks": tick(case, window, with_sinks=True),
        "full": tick(case, None),
        "full_at_w": tick(at_w, None),
    }
    common = dict(scale=scale, block_size=BLOCK_SIZE, max_context=max(lengths), window=window)
    args_in = [case[k] for k in ("queries", "k_pool", "v_pool", "block_tables", "context_lengths")]
    for label, want in (
        ("window", gather_attention(*args_in, **common)),
        ("window_sinks", gather_attention(*args_in, **common, sinks=sinks)),
    ):
        error = mx.abs(runs[label]() - want).max().item()
        if error > 1e-4:
            raise AssertionError(f"{label} disagrees with the windowed gather: {error}")
    times = interleaved_median_ms(runs, args)
    return {
        "case": "window_decode",
        "window": window,
        "batch": batch,
        "context_max": max(lengths),
        **{f"{label}_ms": round(ms, 3) for label, ms in times.items()},
        "window_vs_full": round(times["window"] / times["full"], 2),
        "window_vs_full_at_w": round(times["window"] / times["full_at_w"], 2),
        "sinks_vs_window": round(times["window_sinks"] / times["window"], 2),
    }


def bench_scatter(num_slots: int, mode: str, steps: int) -> dict:
    """Per-step time of a 30-layer write loop, with the written slots read back per layer."""
    shape = (num_slots, NUM_KV_HEADS, HEAD_DIM)
    k_pools = [mx.zeros(shape) for _ in range(NUM_LAYERS)]
    v_pools = [mx.zeros(shape) for _ in range(NUM_LAYERS)]
    new_kv = mx.random.normal((WRITES_PER_STEP, NUM_KV_HEADS, HEAD_DIM))
    mx.eval(k_pools, v_pools, new_kv)
    times = []
    for step in range(steps):
        slots = (mx.arange(WRITES_PER_STEP) + step * WRITES_PER_STEP) % num_slots
        start = time.perf_counter()
        views = (
            [(k[:1], v[:1]) for k, v in zip(k_pools, v_pools, strict=True)]
            if mode == "stray_view"
            else []
        )
        mx.eval(views)
        read_back = []
        for k_pool, v_pool in zip(k_pools, v_pools, strict=True):
            if mode == "self_copy":
                write_kv(k_pool, v_pool, slots, k_pool[slots - 1], v_pool[slots - 1])
            else:
                write_kv(k_pool, v_pool, slots, new_kv, new_kv)
            read_back.append(mx.take(k_pool, slots, axis=0).sum() + v_pool[slots].sum())
        mx.eval(read_back)
        times.append(time.perf_counter() - start)
        del views
    pool_mb = 2 * NUM_LAYERS * num_slots * NUM_KV_HEADS * HEAD_DIM * 4 / 2**20
    return {
        "case": "scatter_write",
        "mode": mode,
        "pool_slots": num_slots,
        "pools_total_mb": round(pool_mb),
        "layers": NUM_LAYERS,
        "slots_per_layer_step": WRITES_PER_STEP,
        "step_ms": round(min(times[1:]) * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", choices=["attention", "shared", "window", "scatter"], help="run one section"
    )
    parser.add_argument("--iters", type=int, default=5, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the best one counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tile-sweep", action="store_true", help="also time tile budgets of 2, 4 and 16 MB"
    )
    args = parser.parse_args(argv)
    if args.only in (None, "attention"):
        for name, lengths, num_queries in attention_cases(np.random.default_rng(args.seed)):
            print(json.dumps(bench_attention_case(name, lengths, num_queries, args)), flush=True)
    if args.only in (None, "shared"):
        for case in SHARED_CASES:
            print(json.dumps(bench_shared_prefix_case(*case, args)), flush=True)
    if args.only in (None, "window"):
        for window in (128, 1024):
            for batch in (1, 8):
                print(json.dumps(bench_window_case(window, batch, args)), flush=True)
    if args.only in (None, "scatter"):
        for num_slots in (10_000, 30_000, 100_000):
            print(json.dumps(bench_scatter(num_slots, "sole", steps=5)), flush=True)
        # The copying modes cost seconds per step at 100k slots: show their growth below that.
        for num_slots in (10_000, 30_000):
            for mode in ("stray_view", "self_copy"):
                print(json.dumps(bench_scatter(num_slots, mode, steps=3)), flush=True)


if __name__ == "__main__":
    main()
