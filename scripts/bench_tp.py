#!/usr/bin/env python
"""What the tensor-parallel split costs: the decode tick of one model unsharded (one process)
and as a group of K ranks over the ring backend (loopback here), and the collective time of
one decode step inside it.

Collective time per step = the two plan broadcasts (header + rows) plus the 2 x num_layers
all_sums the sharded forward does (after o_proj and down_proj, each (batch, 1, hidden)),
timed as a chain of exactly those collectives on the same ranks, with no model compute between
them. In a real step each all_sum also waits for the slowest rank's compute, so the tick
minus this figure is the compute (and skew), not pure compute.

Prints one JSON line per (configuration, batch), the unsharded baseline first.
Usage: scripts/bench_tp.py [--model DIR] [--tp 3] [--batches 1,8] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.blas import reexec_with_blas  # noqa: E402

PROMPT_TOKENS = 16


def decode_tick_ms(engine, batch: int, tokens: int) -> float:
    """p50 decode tick of `batch` sequences decoding `tokens` tokens each."""
    from shared.sampling import SamplingParams
    from worker.engine.stats import EngineStats

    engine.stats_ = EngineStats()
    for i in range(batch):
        prompt = [(7 * i + j) % 1000 + 1 for j in range(PROMPT_TOKENS)]
        engine.add_request(f"b{batch}-{i}", prompt, SamplingParams(max_tokens=tokens))
    while engine.has_work():
        engine.step()
    return engine.stats()["decode_step_p50_ms"]


def collective_ms(group, batch: int, hidden: int, layers: int, reps: int = 20) -> float:
    """One decode step's collectives, chained as in the forward; median of `reps`."""
    import mlx.core as mx

    plan_ints = 2 + 1 + batch * (3 + 1 + 8)  # a decode row: header, token, start, ~8 blocks
    times = []
    for _ in range(reps + 2):
        start = time.perf_counter()
        mx.eval(mx.distributed.all_sum(mx.zeros((3,), mx.int32), group=group))
        mx.eval(mx.distributed.all_sum(mx.zeros((plan_ints,), mx.int32), group=group))
        x = mx.zeros((batch, 1, hidden), mx.float32)
        for _ in range(2 * layers):
            x = mx.distributed.all_sum(x, group=group) * 0.5
        mx.eval(x)
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times[2:])[reps // 2]


def engine_config():
    from worker.config import EngineConfig

    return EngineConfig(block_size=32, num_blocks=512, prefill_chunk=256, warmup=True)


def baseline(model_dir: Path, batches: list[int], tokens: int) -> None:
    from shared.models.loading import load_model
    from shared.models.store import context_length
    from worker.engine.engine import Engine

    model, _ = load_model(model_dir)
    engine = Engine.create(model, engine_config(), max_context=context_length(model_dir))
    for batch in batches:
        tick = decode_tick_ms(engine, batch, tokens)
        print(json.dumps({"config": "unsharded", "batch": batch, "decode_tick_ms": round(tick, 2)}))


def rank_main(model_dir: Path, batches: list[int], tokens: int) -> int:
    from shared.models.store import context_length
    from worker.tp.runner import init_group
    from worker.tp.start import follow, leader_engine, load_sharded

    group = init_group()
    config = engine_config()
    model, _ = load_sharded(model_dir, config, group)
    args = model.args
    comm = {b: collective_ms(group, b, args.hidden_size, args.num_hidden_layers) for b in batches}
    if group.rank() != 0:
        return follow(model, config, group, timeout_s=300)
    engine, leader = leader_engine(model, config, group, context_length(model_dir), 300)
    try:
        for batch in batches:
            tick = decode_tick_ms(engine, batch, tokens)
            line = {
                "config": f"tp{group.size()}",
                "batch": batch,
                "decode_tick_ms": round(tick, 2),
                "collective_ms": round(comm[batch], 2),
                "collective_share": round(comm[batch] / tick, 3),
            }
            print(json.dumps(line), flush=True)
    finally:
        leader.stop()
    return 0


def run_group(model_dir: Path, size: int, batches: list[int], tokens: int) -> None:
    from fleet.supervisor import ring_hostfile

    hostfile = ring_hostfile(size)
    try:
        argv = [
            sys.executable,
            __file__,
            "--model",
            str(model_dir),
            "--batches",
            ",".join(map(str, batches)),
            "--tokens",
            str(tokens),
            "--rank",
        ]
        threads = str(max(1, (os.cpu_count() or 1) // size))
        procs = [
            subprocess.Popen(
                argv,
                env=dict(
                    os.environ,
                    MLX_RANK=str(r),
                    MLX_HOSTFILE=str(hostfile),
                    OPENBLAS_NUM_THREADS=threads,
                ),
                stdout=None if r == 0 else subprocess.DEVNULL,
            )
            for r in range(size)
        ]
        for p in procs:
            p.wait()
    finally:
        hostfile.unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model dir (default: the default model)")
    p.add_argument("--tp", type=int, default=3, help="ranks in the group (default 3)")
    p.add_argument("--batches", default="1,8", help="decode batch sizes (default 1,8)")
    p.add_argument("--tokens", type=int, default=32, help="tokens decoded per sequence")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    reexec_with_blas()
    from shared.models.store import resolve_model

    model_dir = resolve_model(args.model)
    batches = [int(b) for b in args.batches.split(",")]
    if args.rank:
        sys.exit(rank_main(model_dir, batches, args.tokens))
    baseline(model_dir, batches, args.tokens)
    run_group(model_dir, args.tp, batches, args.tokens)


if __name__ == "__main__":
    main()
