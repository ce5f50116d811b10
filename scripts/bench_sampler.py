"""Cost of the sampler's logit processing per step, on logits of the default model's width.

One JSON line per configuration: batch B, how many rows carry penalties + bias, and the
median time of `sample()` (evaluated) over the runs. Baseline: the same batch with no
processors, in the same run. Also: the per-step alternative to the per-sequence device state,
a scatter of counts built from each row's host token history (`--history` tokens per row).

    python scripts/bench_sampler.py [--batch 32] [--vocab 49152] [--history 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
import numpy as np

from shared.sampling import LogitBias, SamplingParams
from worker.runner.logits_processors import LogitsState
from worker.runner.sampler import sample

PENALIZED = SamplingParams(
    presence_penalty=0.5,
    frequency_penalty=0.5,
    repetition_penalty=1.1,
    logit_bias=(LogitBias(5, 3.0),),
)


def _time(fn, runs: int) -> float:
    fn()  # warm
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _with_states(logits, batch, rows, vocab, history):
    params = [PENALIZED if i < rows else SamplingParams() for i in range(batch)]
    prompt = list(np.random.default_rng(0).integers(0, vocab, history))
    states = [LogitsState.create(p, prompt, vocab, None) for p in params]

    def run():
        out, _ = sample(logits, params, [None] * batch, states)
        mx.eval(out.arrays())

    return run


def _scatter_from_host(logits, batch, rows, vocab, history):
    """The alternative: per step, counts scattered from host token lists."""
    hist = np.random.default_rng(0).integers(0, vocab, (rows, history))

    def run():
        row_idx = mx.array(np.repeat(np.arange(rows), history), dtype=mx.int32)
        tok_idx = mx.array(hist.reshape(-1), dtype=mx.int32)
        counts = mx.zeros((rows, vocab), dtype=mx.float32).at[row_idx, tok_idx].add(1.0)
        sub = logits[:rows] - 0.5 * counts - 0.5 * (counts > 0)
        mx.eval(mx.argmax(sub, axis=-1))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--history", type=int, default=512)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    logits = mx.random.normal((args.batch, args.vocab))
    mx.eval(logits)
    for rows in (0, 1, args.batch // 4, args.batch):
        ms = _time(_with_states(logits, args.batch, rows, args.vocab, args.history), args.runs)
        line = {
            "batch": args.batch,
            "penalized_rows": rows,
            "method": "device_state",
            "ms": round(ms, 3),
        }
        print(json.dumps(line))
    for rows in (1, args.batch // 4, args.batch):
        ms = _time(
            _scatter_from_host(logits, args.batch, rows, args.vocab, args.history), args.runs
        )
        line = {
            "batch": args.batch,
            "penalized_rows": rows,
            "method": "host_scatter",
            "history": args.history,
            "ms": round(ms, 3),
        }
        print(json.dumps(line))


if __name__ == "__main__":
    main()
