#!/usr/bin/env python
"""Chunked attention's pages, window rule against chunk rule (worker/engine/caches/chunks.py).

The tiny Llama 4 of the architecture zoo (chunks of 8 on three layers of four), three sequences
of 180, 230 and 280 prompt tokens and 24 generated (greedy) run together, prefilled in 32-token
pieces, with blocks of 8 and of 4: once with its pages kept as a window of a chunk (the rule
before `ChunkKind`, its `WindowKind` registered instead) and once by the chunk rule. One JSON
line per case: the peak and the mean over steps of live page units (units holding pages, not
spare), and whether every output equals mlx-lm's. Then, at real Llama 4's sizes (chunks of
8192, blocks of 32), what one sequence decoding to 64K keeps by each rule's own arithmetic
(`WindowPages.out_of_window` / `out_of_chunk`): its blocks with pages, at most and on average.

  scripts/bench_chunk_release.py
"""

from __future__ import annotations

import json
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS, GENERATED, PREFILL_CHUNK = (180, 230, 280), 24, 32


def prompts() -> dict[str, list[int]]:
    return {f"s{n}": [(13 * i + 7 * n + 3) % 90 + 1 for i in range(n)] for n in PROMPTS}


def run(engine, requests: dict[str, list[int]]) -> tuple[dict, int, float]:
    """Every request added before the first step: their tokens, the peak and the mean of live
    page units after each step."""
    from shared.sampling import SamplingParams

    for rid, prompt in requests.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=GENERATED))
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    pages, live = engine.pool.pages, []
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens[delta.request_id] += delta.token_ids
        live.append(pages.units_held - pages.spare_units())
    return tokens, max(live), sum(live) / len(live)


def measure(model, expected: dict, block_size: int, window_rule: bool) -> dict:
    from tests.support.engine_fixtures import make_engine
    from worker.engine.caches import WindowKind

    engine = make_engine(model, block_size=block_size, prefill_chunk=PREFILL_CHUNK)
    kv = engine.scheduler.kv
    if window_rule:  # the rule before ChunkKind: the same pages, kept as a window of a chunk
        kv.coordinator.kinds = []
        kv.register(WindowKind(kv.pool, kv.pool.pages))
    tokens, peak, mean = run(engine, prompts())
    engine.check_integrity()
    return {
        "block_size": block_size,
        "rule": "window of a chunk" if window_rule else "chunk",
        "kind": type(kv.kinds[0]).__name__,
        "live_page_units_peak": peak,
        "live_page_units_mean": round(mean, 1),
        "greedy_equal_mlx_lm": tokens == expected,
    }


def at_scale(chunk: int = 8192, block: int = 32, length: int = 65536) -> dict:
    """Blocks with pages one sequence holds as it runs to `length`, by each rule."""
    from worker.kv.window_pages import WindowPages

    pages = WindowPages(1, deque(), 1, chunk, block, chunked=True)
    kept: dict[str, list[int]] = {"window": [], "chunk": []}
    for n in range(block, length + 1, block):
        blocks = -(-n // block)
        kept["window"].append(blocks - min(pages.out_of_window(n), blocks))
        kept["chunk"].append(blocks - min(pages.out_of_chunk(max(0, n - 1)), blocks))
    row: dict = {"chunk": chunk, "block_size": block, "tokens": length}
    for rule, held in kept.items():
        row[f"{rule}_rule_blocks_max"] = max(held)
        row[f"{rule}_rule_blocks_mean"] = round(sum(held) / len(held), 1)
    return row


def main() -> None:
    from tests.support.arch_zoo import build
    from tests.support.engine_fixtures import reference_greedy

    model = build("llama4")
    expected = {rid: reference_greedy(model, p, GENERATED) for rid, p in prompts().items()}
    for block_size in (8, 4):
        before = measure(model, expected, block_size, window_rule=True)
        after = measure(model, expected, block_size, window_rule=False)
        print(json.dumps(before))
        print(json.dumps(after))
        ratio = after["live_page_units_peak"] / before["live_page_units_peak"]
        print(json.dumps({"block_size": block_size, "chunk_over_window_peak": round(ratio, 2)}))
    print(json.dumps(at_scale()))


if __name__ == "__main__":
    main()
