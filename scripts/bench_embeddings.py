#!/usr/bin/env python
"""Embedding throughput of the worker's Embedder: batched vs one input per forward.

The model: the default model (SmolLM2-135M, float32 on CPU) served as a decoder embedding
model (`task = "embed"`, last-token pooling), the way an embedding worker loads it. Inputs:
`--inputs` random token arrays of lengths drawn from 8..`--max-len`. Two ways, same run:

  - one_per_forward: the baseline, `max_batch_tokens` = the longest input (each forward one row);
  - batched: the worker's default (sorted by length, up to 8192 padded tokens, 64 rows).

Prints one JSON line per way (median of `--repeats`: seconds, inputs/s, tokens/s) and one
with the speed-up.   Usage: scripts/bench_embeddings.py [--inputs 64] [--max-len 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.blas import active_blas, reexec_with_blas  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reexec_with_blas()
    import numpy as np

    from shared.models.embedding import embedding_spec
    from shared.models.store import resolve_model
    from worker.embed.embedder import DEFAULT_MAX_BATCH_TOKENS, Embedder
    from worker.embed.trunk import load_trunk

    model_dir = resolve_model(None)
    spec = embedding_spec(model_dir, "embed")
    trunk = load_trunk(model_dir, spec, "auto")
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, args.max_len + 1, args.inputs)
    inputs = [rng.integers(100, 40_000, n).tolist() for n in lengths]
    tokens = int(lengths.sum())
    ways = {"one_per_forward": args.max_len, "batched": DEFAULT_MAX_BATCH_TOKENS}
    embedders = {way: Embedder(trunk, spec, budget) for way, budget in ways.items()}
    times: dict[str, list[float]] = {way: [] for way in ways}
    vectors = {}
    embedders["batched"].vectors(inputs[:2])  # warm up
    for _ in range(args.repeats):  # the ways interleaved: a busy machine slows both alike
        for way, embedder in embedders.items():
            start = time.perf_counter()
            vectors[way] = embedder.vectors(inputs)
            times[way].append(time.perf_counter() - start)
    results = {}
    for way, embedder in embedders.items():
        seconds = statistics.median(times[way])
        results[way] = (seconds, vectors[way])
        print(
            json.dumps(
                {
                    "way": way,
                    "inputs": args.inputs,
                    "tokens": tokens,
                    "seconds": round(seconds, 3),
                    "inputs_per_s": round(args.inputs / seconds, 1),
                    "tokens_per_s": round(tokens / seconds, 1),
                    "forwards": len(embedder.batches(inputs)),
                    "blas": active_blas(),
                }
            )
        )
    one, batched = results["one_per_forward"], results["batched"]
    cos = min(
        float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        for a, b in zip(one[1], batched[1], strict=True)
    )
    print(json.dumps({"speedup": round(one[0] / batched[0], 2), "min_cosine": round(cos, 6)}))


if __name__ == "__main__":
    main()
