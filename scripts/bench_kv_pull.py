#!/usr/bin/env python
"""TTFT of a returning tenant's ~2k-token prompt on a worker that does not hold it: recomputed
(the holder's own cold prefill of it), vs its full blocks pulled from the holder over the
loopback KV channel (worker/peer) and the rest computed. The same prompt both ways, greedy, so
the outputs must be equal. One process, two engines sharing the model's weights, one run of
each (no loops: run it on a quiet machine).

Prints one JSON line per case, then the ratio and whether the outputs are equal; exits 1 if
they differ or nothing was pulled.
Usage: scripts/bench_kv_pull.py [--prefix-tokens 2048] [--kv-memory-mib 512] [--max-tokens 8]
                                [--kv-bits 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import reexec_with_blas  # noqa: E402


def ttft(engine, request_id: str, prompt: list[int], max_tokens: int, start: float):
    """Seconds from `start` to the first token, how many prompt tokens came from a cache, and
    the greedy output's token ids."""
    from shared.sampling import SamplingParams

    engine.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    cached, first, tokens = 0, None, []
    while engine.has_work():
        for delta in engine.step():
            if delta.token_ids and first is None:
                first = time.perf_counter() - start
            tokens += delta.token_ids
            if delta.usage is not None:
                cached = delta.usage.cached_tokens
    return first, cached, tokens


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--kv-memory-mib", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8, help="greedy output compared")
    parser.add_argument("--kv-bits", type=int, choices=(4, 8, 16), help="quantized KV pool")
    args = parser.parse_args()
    reexec_with_blas()
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
    prompt = prefix + tokenizer.encode(" Question: summarise.")
    config = EngineConfig(kv_memory_bytes=args.kv_memory_mib << 20, kv_bits=args.kv_bits)
    holder, puller = (Engine.create(model, config, max_context=8192) for _ in range(2))
    nodes = [PeerNode(e, PeerChannel("tcp://127.0.0.1:0"), lambda: None) for e in (holder, puller)]
    for node in nodes:
        node.start()
    try:
        warm = tokenizer.encode("Warm up: first calls compile.")  # shares no block with it
        for i, engine in enumerate((holder, puller)):
            ttft(engine, f"warm-{i}", warm, 2, time.perf_counter())
        recompute, _, recomputed = ttft(holder, "a", prompt, args.max_tokens, time.perf_counter())
        blocks = len(prompt) // holder.block_size
        start = time.perf_counter()
        nodes[1].park(
            Generate("b", tuple(prompt), pull=PullHint("holder", nodes[0].endpoint, blocks))
        )
        while not nodes[1].turn():
            nodes[0].turn()
            time.sleep(0.001)
        pull_s = time.perf_counter() - start
        pulled_ttft, cached, pulled = ttft(puller, "b", prompt, args.max_tokens, start)
    finally:
        for node in nodes:
            node.stop()
    moved = nodes[1].pulled_blocks * nodes[1].blocks.layout.nbytes
    print(
        json.dumps(
            {"case": "recompute", "prompt_tokens": len(prompt), "ttft_s": round(recompute, 3)}
        )
    )
    print(
        json.dumps(
            {
                "case": "pull",
                "prompt_tokens": len(prompt),
                "pulled_blocks": nodes[1].pulled_blocks,
                "pull_failures": nodes[1].pull_failures,
                "bytes": moved,
                "pull_s": round(pull_s, 3),
                "cached_tokens": cached,
                "ttft_s": round(pulled_ttft, 3),
            }
        )
    )
    ratio = recompute / pulled_ttft
    equal = pulled == recomputed
    print(
        json.dumps(
            {
                "recompute_over_pull": round(ratio, 1),
                "outputs_equal": equal,
                "pull_mb_per_s": round(moved / pull_s / 1e6, 1),
            }
        ),
        flush=True,
    )
    print(
        f"pulled TTFT is {ratio:.1f}x faster than recomputing the prompt; greedy outputs "
        f"({len(pulled)} tokens) {'equal' if equal else 'DIFFER'}",
        file=sys.stderr,
    )
    return 0 if equal and nodes[1].pulled_blocks > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
