#!/usr/bin/env python
"""A hybrid model's decode step against the size of its state pool: whether writing the
recurrent states back copies the whole pool.

The Qwen3-Next-shaped model of `scripts/bench_hybrid.py` decodes `--batch` sequences with a
state pool of 8 slots and of 64 (`state_snapshots` 0 and 56), in this checkout and in a
baseline revision (`--baseline`, unpacked with `git archive` into a temporary folder), each
measurement in its own process, the trees alternating, `--repeats` times. Per decode step:
wall time (median, and mean: the steps where a sequence crosses a block boundary copy its
states, `worker.engine.caches.states`), and how far MLX's peak memory rose over what was live before
it (median and most: a whole-pool copy shows as a state array's size, 8 MiB at 64 slots).
Prints one JSON line per tree and pool size (medians over the repeats), then the ratios.

Usage: scripts/bench_state_pool.py [--baseline REV] [--help]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(slots: int, batch: int, steps: int) -> dict:
    """In this process (the tree on sys.path): median decode step and peak rise."""
    import mlx.core as mx

    from scripts.bench_hybrid import build
    from shared.sampling import SamplingParams
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    model = build()
    config = EngineConfig(
        kv_memory_bytes=1 << 30, max_running=batch, state_snapshots=slots - batch, speculative="off"
    )
    engine = Engine.create(model, config, max_context=4096)
    for i in range(batch):
        prompt = [(31 * i + 7 * j) % 40000 + 100 for j in range(40 + i)]
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=steps + 8))
    while any(s.is_prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(4):  # warm, and the pipeline filled
        engine.step()
    times, rises = [], []
    for _ in range(steps):
        mx.reset_peak_memory()
        live = mx.get_active_memory()
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        rises.append(mx.get_peak_memory() - live)
    pool = engine.states.pool
    return {
        "slots": pool.num_slots,
        "step_ms": statistics.median(times) * 1000,
        "mean_step_ms": statistics.mean(times) * 1000,
        "peak_rise_mib": statistics.median(rises) / 2**20,
        "most_rise_mib": max(rises) / 2**20,
        "pool_mib": pool.num_slots * pool.bytes_per_slot / 2**20,
    }


def run_tree(tree: Path, slots: int, args) -> dict:
    cmd = [
        sys.executable,
        str(tree / "scripts" / "bench_state_pool.py"),
        "--child",
        str(slots),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", default="HEAD", help="git revision to compare against")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.batch, args.steps)), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(
            ["git", "archive", args.baseline], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        # this measuring script in both trees: the baseline may predate it
        (base / "scripts" / "bench_state_pool.py").write_text(Path(__file__).read_text())
        runs: dict[tuple[str, int], list[dict]] = {}
        for _ in range(args.repeats):
            for slots in (args.batch, 64):
                for name, tree in (("baseline", base), ("ours", ROOT)):
                    runs.setdefault((name, slots), []).append(run_tree(tree, slots, args))
    med = {}
    for (name, slots), rs in runs.items():
        med[name, slots] = {f: round(statistics.median(r[f] for r in rs), 2) for f in rs[0]}
        print(
            json.dumps(
                {
                    "bench": "state_pool",
                    "tree": name,
                    "baseline_rev": args.baseline,
                    "batch": args.batch,
                    "repeats": args.repeats,
                    **med[name, slots],
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "bench": "state_pool_ratio",
                "batch": args.batch,
                "step_64_slots_baseline_over_ours": round(
                    med["baseline", 64]["step_ms"] / med["ours", 64]["step_ms"], 2
                ),
                "mean_step_64_slots_baseline_over_ours": round(
                    med["baseline", 64]["mean_step_ms"] / med["ours", 64]["mean_step_ms"], 2
                ),
                "baseline_64_over_8_slots": round(
                    med["baseline", 64]["step_ms"] / med["baseline", args.batch]["step_ms"], 2
                ),
                "ours_64_over_8_slots": round(
                    med["ours", 64]["step_ms"] / med["ours", args.batch]["step_ms"], 2
                ),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
