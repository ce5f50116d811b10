#!/usr/bin/env python
"""Window pages under a shared system prompt: the tiny Gemma 3 config of the architecture zoo
(sliding window 8 on half its layers, blocks of 8), four sequences of 148 tokens (142 of prompt,
6 generated, greedy) run together, once with prompts that share nothing and once with a
64-token system prompt in common. One JSON line per case: the peak of live page units (units
holding window pages not spare), blocks whose pages went spare while their sequence ran,
whether every output equals mlx-lm's; then the ratio of the shared peak to the unshared one.

  scripts/bench_window_share.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEQUENCES, PROMPT, GENERATED, SYSTEM = 4, 142, 6, 64


def prompts(shared: bool) -> dict[str, list[int]]:
    system = [(5 * i + 2) % 120 + 1 for i in range(SYSTEM)]
    out = {}
    for s in range(SEQUENCES):
        own = [(11 * i + 7 * s + 3) % 120 + 1 for i in range(PROMPT)]
        out[f"s{s}"] = system + own[SYSTEM:] if shared else own
    return out


def run(engine, requests: dict[str, list[int]]) -> tuple[dict, int]:
    """Every request added before the first step; their tokens, and the peak of live units."""
    from shared.sampling import SamplingParams

    for rid, prompt in requests.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=GENERATED))
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    pages, peak = engine.pool.pages, 0
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None, delta.error
            tokens[delta.request_id] += delta.token_ids
        peak = max(peak, pages.units_held - pages.spare_units())
    return tokens, peak


def measure(shared: bool) -> dict:
    from tests.support.arch_zoo import build
    from tests.support.engine_fixtures import make_engine, reference_greedy

    model = build("gemma3_text")
    engine = make_engine(model)
    requests = prompts(shared)
    tokens, peak = run(engine, requests)
    equal = all(tokens[r] == reference_greedy(model, p, GENERATED) for r, p in requests.items())
    engine.check_integrity()
    return {
        "case": "shared 64-token system prompt" if shared else "nothing shared",
        "live_page_units_peak": peak,
        "blocks_released": engine.pool.pages.released,
        "greedy_equal_mlx_lm": equal,
    }


def main() -> None:
    alone, shared = measure(False), measure(True)
    for row in (alone, shared):
        print(json.dumps(row))
    ratio = shared["live_page_units_peak"] / alone["live_page_units_peak"]
    print(json.dumps({"shared_over_unshared": round(ratio, 2)}))


if __name__ == "__main__":
    main()
