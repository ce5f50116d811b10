#!/usr/bin/env python
"""TTFT of a returning long prefix: recomputed, from the memory cache, from the disk tier
after eviction, and from the disk tier after a worker restart. One process, one run.

The prompt is a long shared prefix plus a short question; "returning" asks a new question
after the same prefix. Eviction is the prefix cache's own `evict` (what memory pressure does);
a restart is a new Engine on the same model and disk folder.
Prints one JSON line per case and the speedups over recomputing.
Usage: scripts/bench_kv_disk.py [--prefix-tokens 4096] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import reexec_with_blas  # noqa: E402


def ttft(engine, request_id: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token, and how many prompt tokens came from a cache."""
    from shared.sampling import SamplingParams

    start = time.perf_counter()
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=1))
    cached = 0
    while engine.has_work():
        for delta in engine.step():
            if delta.usage is not None:
                cached = delta.usage.cached_tokens
    return time.perf_counter() - start, cached


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefix-tokens", type=int, default=4096)
    parser.add_argument("--dir", type=Path, help="disk tier folder (default: a temporary one)")
    args = parser.parse_args()
    reexec_with_blas()
    from shared.models.loading import load_model
    from shared.models.store import resolve_model
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    model, tokenizer = load_model(resolve_model(None))
    words = "The fleet keeps long agent sessions warm across machines and restarts. "
    ids = tokenizer.encode(words * (args.prefix_tokens // 10))
    prefix = ids[: args.prefix_tokens]
    question = [tokenizer.encode(f" Question {i}: summarise.") for i in range(4)]
    folder = args.dir or Path(tempfile.mkdtemp(prefix="kv-disk-"))
    config = EngineConfig(kv_disk_bytes=8 << 30, kv_disk_dir=str(folder))

    def engine():
        return Engine.create(model, config, max_context=8192)

    first = engine()
    results = {}
    results["recompute"] = ttft(first, "a", prefix + question[0])
    results["memory_hit"] = ttft(first, "b", prefix + question[1])
    first.cache.evict(first.cache.evictable_blocks)
    first.disk.store.flush()
    results["disk_hit_after_eviction"] = ttft(first, "c", prefix + question[2])
    first.cache.evict(first.cache.evictable_blocks)
    first.disk.store.close()
    restart_start = time.perf_counter()
    second = engine()
    restart_s = time.perf_counter() - restart_start
    results["disk_hit_after_restart"] = ttft(second, "d", prefix + question[3])
    base = results["recompute"][0]
    for case, (seconds, cached) in results.items():
        print(
            json.dumps(
                {
                    "case": case,
                    "prompt_tokens": len(prefix) + len(question[0]),
                    "cached_tokens": cached,
                    "ttft_s": round(seconds, 3),
                    "speedup_vs_recompute": round(base / seconds, 1),
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "case": "restart",
                "engine_start_s": round(restart_s, 2),
                "disk_blocks": second.stats()["disk_blocks"],
                "disk_bytes": second.disk.store.used_bytes,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
