#!/usr/bin/env python
"""Does `mx.compile` pay on this machine? The decode step's pieces, eager vs compiled.

One process, one run, same inputs (default model's shapes: hidden 576, ffn 1536, 9 heads,
3 KV heads, head dim 64, float32), per batch size:
  - attention core of a decode step (scores, mask, softmax in base 2, weighted values), the
    ops left per layer once the gather rows and masks are made per forward;
  - one layer's norm + MLP + residual (the MLP's swiglu is already compiled inside mlx-lm).
Prints one JSON line per (piece, batch): eager and compiled ms per call and their ratio.
The engine compiles neither: see docs/internals.md for the numbers and the decision.
Usage: scripts/bench_compile.py [--batch-sizes 1,8,32] [--context 100] [--iters 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import reexec_with_blas  # noqa: E402


def timed(fn, args, iters: int) -> float:
    import mlx.core as mx

    for _ in range(3):
        mx.eval(fn(*args))
    start = time.perf_counter()
    for _ in range(iters):
        mx.eval(fn(*args))
    return (time.perf_counter() - start) / iters * 1000


def attention_core(q, keys, values, visible):
    import mlx.core as mx

    from worker.attention.mlx_ops import apply_mask, weighted_values

    scores = apply_mask(q @ keys.swapaxes(-1, -2), visible, 1)
    weights = mx.power(2.0, scores - scores.max(axis=-1, keepdims=True))
    return weighted_values(weights, values) / weights.sum(axis=-1).reshape(*q.shape[:3], 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    reexec_with_blas()
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.llama import MLP, ModelArgs

    margs = ModelArgs(
        model_type="llama",
        hidden_size=576,
        num_hidden_layers=1,
        intermediate_size=1536,
        num_attention_heads=9,
        rms_norm_eps=1e-5,
        vocab_size=32,
        num_key_value_heads=3,
    )
    mlp, norm = MLP(margs), nn.RMSNorm(576)
    mx.eval(mlp.parameters(), norm.parameters())

    def block(h):
        return h + mlp(norm(h))

    for batch in args.batch_sizes:
        ctx = args.context
        q = mx.random.normal((3, batch, 3, 64))
        keys, values = mx.random.normal((3, batch, ctx, 64)), mx.random.normal((3, batch, ctx, 64))
        visible = mx.ones((batch, 1, 1, ctx), dtype=mx.bool_)
        h = mx.random.normal((batch, 1, 576))
        pieces = {
            "attention_core": (attention_core, (q, keys, values, visible)),
            "norm_mlp_residual": (block, (h,)),
        }
        for name, (fn, inputs) in pieces.items():
            eager = timed(fn, inputs, args.iters)
            compiled = timed(mx.compile(fn), inputs, args.iters)
            print(
                json.dumps(
                    {
                        "piece": name,
                        "batch": batch,
                        "context": ctx,
                        "eager_ms": round(eager, 4),
                        "compiled_ms": round(compiled, 4),
                        "compiled_over_eager": round(compiled / eager, 3),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
