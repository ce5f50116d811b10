#!/usr/bin/env python
"""One decode forward of the default model: mlx-lm's dense KV cache vs our paged runner.

Prints a JSON line per batch size with ms per forward for each, measured in the same run.
Usage: scripts/profile_forward.py [--batch-sizes 1,32] [--context 100] [--iters 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import reexec_with_blas  # noqa: E402


def timed(fn, iters: int) -> float:
    import mlx.core as mx

    for _ in range(3):
        mx.eval(fn())
    start = time.perf_counter()
    for _ in range(iters):
        mx.eval(fn())
    return (time.perf_counter() - start) / iters * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32]
    )
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    reexec_with_blas()
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from shared.models.loading import load_model
    from shared.models.store import resolve_model
    from shared.sampling import SamplingParams
    from worker.attention import resolve_backend
    from worker.engine.sequence import Sequence
    from worker.engine.step_kind import StepPlan, forward_input
    from worker.kv.block_pool import BlockPool
    from worker.runner.model_runner import ModelRunner
    from worker.runner.model_support import probe_shape
    from worker.runner.plan import StepKind

    model, _ = load_model(resolve_model(None))
    shape = probe_shape(model)
    for batch in args.batch_sizes:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.zeros((batch, args.context), dtype=mx.int32), cache=cache))
        dense = timed(
            lambda b=batch, c=cache: model(mx.zeros((b, 1), dtype=mx.int32), cache=c), args.iters
        )
        blocks = -(-(args.context + 1) // 32)
        pool = BlockPool(
            1 + batch * blocks,
            32,
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=shape.kv_dtype,
        )
        runner = ModelRunner(
            model, pool, pool.allocate(1)[0], resolve_backend("auto"), shape.layout()
        )
        seqs = []
        for i in range(batch):
            seq = Sequence(str(i), args.context, [1] * (args.context + 1), SamplingParams(), i)
            seq.block_ids, seq.num_computed = pool.allocate(blocks), args.context
            seqs.append(seq)
        plan = forward_input(StepPlan(StepKind.DECODE, seqs, [], []), [])
        paged = timed(lambda p=plan, m=runner: m.run(p).outputs, args.iters)
        print(
            json.dumps(
                {
                    "batch": batch,
                    "context": args.context,
                    "dense_mlx_lm_ms": round(dense, 1),
                    "paged_ms": round(paged, 1),
                    "ratio": round(paged / dense, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
