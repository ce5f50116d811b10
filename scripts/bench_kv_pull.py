#!/usr/bin/env python
"""TTFT of a ~2k-token prefix on a worker that does not hold it: recomputed, vs pulled from a
peer that does over the loopback KV channel (worker/peer) and then admitted. One process, two
engines sharing the model's weights, one run of each (no loops: run it on a quiet machine).

Prints one JSON line per case, then the ratio.
Usage: scripts/bench_kv_pull.py [--prefix-tokens 2048] [--kv-memory-mib 512]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import reexec_with_openblas  # noqa: E402


def ttft(engine, request_id: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token, and how many prompt tokens came from a cache."""
    from shared.sampling import SamplingParams

    start = time.perf_counter()
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0))
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
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--kv-memory-mib", type=int, default=512)
    args = parser.parse_args()
    reexec_with_openblas()
    from shared.models.loading import load_model
    from shared.models.store import resolve_model
    from shared.protocol import Generate, PullHint
    from worker.config import EngineConfig
    from worker.engine.engine import Engine
    from worker.peer.channel import PeerChannel
    from worker.peer.node import PeerNode

    model, tokenizer = load_model(resolve_model(None))
    words = "The fleet keeps long agent sessions warm across machines and restarts. "
    prefix = tokenizer.encode(words * (args.prefix_tokens // 10))[: args.prefix_tokens]
    questions = [tokenizer.encode(f" Question {i}: summarise.") for i in range(2)]
    config = EngineConfig(kv_memory_bytes=args.kv_memory_mib << 20)
    holder, puller = (Engine.create(model, config, max_context=8192) for _ in range(2))
    nodes = [PeerNode(e, PeerChannel("tcp://127.0.0.1:0"), lambda: None) for e in (holder, puller)]
    for node in nodes:
        node.start()
    try:
        recompute, _ = ttft(holder, "a", prefix + questions[0])
        blocks = len(prefix) // holder.block_size
        prompt = prefix + questions[1]
        start = time.perf_counter()
        nodes[1].park(
            Generate("b", tuple(prompt), pull=PullHint("holder", nodes[0].endpoint, blocks))
        )
        while not nodes[1].turn():
            nodes[0].turn()
            time.sleep(0.001)
        pull_s = time.perf_counter() - start
        rest, cached = ttft(puller, "b", prompt)
    finally:
        for node in nodes:
            node.stop()
    moved = nodes[1].pulled_blocks * nodes[1].blocks.layout.nbytes
    print(
        json.dumps(
            {"case": "recompute", "prompt_tokens": len(prompt), "ttft_s": round(recompute, 3)}
        )
    )
    print(json.dumps({"case": "pull", "prompt_tokens": len(prompt), "pulled_blocks": nodes[1].pulled_blocks,
                      "pull_failures": nodes[1].pull_failures, "bytes": moved, "pull_s": round(pull_s, 3),
                      "cached_tokens": cached, "ttft_s": round(pull_s + rest, 3)}))  # fmt: skip
    print(json.dumps({"recompute_over_pull": round(recompute / (pull_s + rest), 1),
                      "pull_mb_per_s": round(moved / pull_s / 1e6, 1)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
