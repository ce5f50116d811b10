#!/usr/bin/env python
"""Micro-benchmark of the worker's KV memory (no model): one JSON line per configuration.

- match / insert: cost per prompt token for several prompt lengths and cache sizes; the
  claim to check is that cost follows prompt length, not cache size (`vs_smallest_cache` is
  the ratio to the smallest cache measured in the same run). `baseline_hash_ns_per_token`
  is a chained-hash lookup of the same prompt (what a hash-indexed cache would pay).
- evict: cost per freed block with the cache full of small unheld leaves.
- memory_waste: slots lost to partial last blocks for random sequence lengths, against the
  baseline of reserving the maximum length per sequence.

The pool has 1 layer, 1 KV head, head dim 1, so its storage is tiny.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from shared.hashing import hash_blocks  # noqa: E402
from worker.kv import BlockPool, RadixCache  # noqa: E402

VOCAB = 32_000
SYSTEM_PROMPT_TOKENS = 512  # every cached sequence starts with it, like a shared system prompt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--cache-tokens", type=int, nargs="+", default=[10_240, 102_400])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per configuration")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def make_cache(num_blocks: int, block_size: int) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(
        num_blocks, block_size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=mx.float16
    )
    return pool, RadixCache(pool, block_size)


def cache_sequence(pool: BlockPool, cache: RadixCache, tokens: list[int]) -> None:
    """Inserts `tokens` the way a finished request does, leaving its blocks unheld."""
    blocks = pool.allocate(pool.blocks_for_tokens(len(tokens)))
    cache.insert(tokens, blocks)
    pool.decref(blocks)


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def fill(pool, cache, rng, system, cache_tokens, seq_tokens) -> list[list[int]]:
    """Caches sequences of `seq_tokens` (system prompt + random) until `cache_tokens` are
    cached; returns them."""
    seqs = []
    while cache.cached_blocks * pool.block_size < cache_tokens:
        seqs.append(system + random_tokens(rng, seq_tokens - len(system)))
        cache_sequence(pool, cache, seqs[-1])
    return seqs


def median_ns(fn, repeats: int) -> float:
    fn()  # warm-up (and the one split a new match boundary needs)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples)


def bench_prefix(args, rng, cache_tokens: int, prompt_tokens: int) -> tuple[dict, dict]:
    bs, longest = args.block_size, max(args.prompt_tokens)
    seq_tokens = max(longest, SYSTEM_PROMPT_TOKENS) + 4 * bs
    pool, cache = make_cache((cache_tokens + 2 * seq_tokens) // bs + 8, bs)
    system = random_tokens(rng, SYSTEM_PROMPT_TOKENS)
    seqs = fill(pool, cache, rng, system, cache_tokens, seq_tokens)
    cached_tokens = cache.cached_blocks * bs
    hit = rng.choice(seqs)[:prompt_tokens]  # fully cached
    match_ns = median_ns(lambda: cache.match_prefix(hit), args.repeats)
    by_hash = {h: i for i, h in enumerate(hash_blocks(hit, bs))}
    hash_ns = median_ns(lambda: [by_hash.get(h) for h in hash_blocks(hit, bs)], args.repeats)

    def insert_new() -> None:
        blocks = pool.allocate(pool.blocks_for_tokens(prompt_tokens))
        prompt = random_tokens(rng, prompt_tokens)  # a miss: every block is new
        start = time.perf_counter_ns()
        cache.insert(prompt, blocks)
        insert_samples.append(time.perf_counter_ns() - start)
        pool.decref(blocks)
        cache.evict(len(blocks))  # untimed: only the new prompt is unlocked, so it goes

    insert_samples: list[int] = []
    for seq in seqs:  # lock the cached sequences so the cache keeps its size
        cache.lock(cache.match_prefix(seq).node)
    for _ in range(args.repeats):
        insert_new()
    common = {
        "cache_tokens": cached_tokens,
        "prompt_tokens": prompt_tokens,
        "block_size": bs,
    }
    match = {
        "bench": "match",
        **common,
        "ns_per_token": round(match_ns / prompt_tokens, 1),
        "baseline_hash_ns_per_token": round(hash_ns / prompt_tokens, 1),
    }
    insert = {
        "bench": "insert",
        **common,
        "ns_per_token": round(statistics.median(insert_samples) / prompt_tokens, 1),
    }
    return match, insert


def bench_evict(args, rng, cache_tokens: int) -> dict:
    bs, leaf_tokens = args.block_size, 256
    pool, cache = make_cache(cache_tokens // bs + 64, bs)
    system = random_tokens(rng, SYSTEM_PROMPT_TOKENS)
    fill(pool, cache, rng, system, cache_tokens, SYSTEM_PROMPT_TOKENS + leaf_tokens)
    total = cache.evictable_blocks
    start = time.perf_counter_ns()
    freed = 0
    while True:
        step = cache.evict(64)
        if not step:
            break
        freed += step
    elapsed = time.perf_counter_ns() - start
    return {
        "bench": "evict",
        "cache_tokens": total * bs,
        "leaf_tokens": leaf_tokens,
        "block_size": bs,
        "blocks_freed": freed,
        "ns_per_block": round(elapsed / freed, 1),
    }


def bench_memory_waste(args, rng, num_seqs: int = 10_000, max_len: int = 8192) -> dict:
    bs = args.block_size
    lengths = [rng.randint(1, max_len) for _ in range(num_seqs)]
    wasted = [-(-n // bs) * bs - n for n in lengths]
    return {
        "bench": "memory_waste",
        "block_size": bs,
        "sequences": num_seqs,
        "max_len": max_len,
        "mean_wasted_slots": round(statistics.mean(wasted), 2),
        "max_wasted_slots": max(wasted),
        "wasted_fraction": round(sum(wasted) / (sum(wasted) + sum(lengths)), 5),
        "baseline_reserve_max_len_wasted_fraction": round(
            1 - sum(lengths) / (num_seqs * max_len), 5
        ),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    smallest: dict[tuple[str, int], float] = {}
    for cache_tokens in sorted(args.cache_tokens):
        for prompt_tokens in args.prompt_tokens:
            for record in bench_prefix(args, rng, cache_tokens, prompt_tokens):
                key = (record["bench"], prompt_tokens)
                smallest.setdefault(key, record["ns_per_token"])
                record["vs_smallest_cache"] = round(record["ns_per_token"] / smallest[key], 2)
                emit(record)
    for cache_tokens in sorted(args.cache_tokens):
        emit(bench_evict(args, rng, cache_tokens))
    emit(bench_memory_waste(args, rng))


if __name__ == "__main__":
    main()
