#!/usr/bin/env python
"""Image requests arriving while a batch decodes: how long the engine thread is held.

A batch of text sequences decodes (pipelined steps); every `--every` steps an image request
(a `--size` PNG) arrives. Each turn of the engine thread is what the worker loop does: take
the arrivals, then one `engine.step()`. Two ways to take an image request, same run:

  - inline: `engine.add_request(..., images=...)` on the engine thread (decoding, the image
    processor and the rope index there: the path before issue 41);
  - off_thread: its images prepared on a thread (`engine.intake.prepare`, as the worker
    loop's ImagePreparer does), then `add_request(prepared=...)` on the engine thread.

Measured (engine thread, wall): the median time `add_request` of an image request holds it
(its intake); per turn, median and p95 of the turns where an image request arrived (their
step also prefills it: the vision tower runs there either way), of the others; and the text
batch's decode rate. Model: the Qwen2.5-VL shape of
`scripts/bench_vision.py` (M-RoPE: its images have a rope index), random weights.

Prints one JSON line per way and one with the ratios.   Usage: scripts/bench_image_intake.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.blas import active_blas, reexec_with_blas  # noqa: E402


def _bench_vision():
    spec = importlib.util.spec_from_file_location("bench_vision", ROOT / "scripts/bench_vision.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def run(engine, way: str, args, keyed, images, text_ids) -> dict:
    from shared.sampling import SamplingParams

    engine.forget_cache()
    for i in range(args.batch):
        engine.add_request(f"t{i}", text_ids[i:], SamplingParams(max_tokens=args.steps + 8))
    for _ in range(4):  # past the text prefill, into steady decode
        engine.step()
    pool = ThreadPoolExecutor(2)
    pending: list = []
    arrival, other, intake = [], [], []
    decoded = 0
    start = time.perf_counter()
    for step in range(args.steps):
        turn = time.perf_counter()
        arrived = False
        if step % args.every == 0:
            rid, image_sampling = f"img{step}", SamplingParams(max_tokens=2)
            if way == "inline":
                at = time.perf_counter()
                engine.add_request(rid, keyed, image_sampling, images=images)
                intake.append(time.perf_counter() - at)
                arrived = True
            else:
                job = pool.submit(engine.intake.prepare, keyed, images)
                pending.append((rid, job))
        for rid, job in [p for p in pending if p[1].done()]:
            pending.remove((rid, job))
            at = time.perf_counter()
            engine.add_request(rid, keyed, image_sampling, images=images, prepared=job.result())
            intake.append(time.perf_counter() - at)
            arrived = True
        deltas = engine.step()
        decoded += sum(len(d.token_ids) for d in deltas if d.request_id.startswith("t"))
        (arrival if arrived else other).append(time.perf_counter() - turn)
    elapsed = time.perf_counter() - start
    pool.shutdown()
    while engine.has_work():
        engine.step()
    ms = lambda s: round(s * 1e3, 2)  # noqa: E731
    return {
        "way": way,
        "intake_on_engine_thread_p50_ms": ms(statistics.median(intake)),
        "arrival_turn_p50_ms": ms(statistics.median(arrival)),
        "arrival_turn_p95_ms": ms(_p95(arrival)),
        "other_turn_p50_ms": ms(statistics.median(other)),
        "text_decode_tok_s": round(decoded / elapsed, 1),
        "arrivals": len(arrival),
        "turns": args.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="text sequences decoding")
    parser.add_argument("--steps", type=int, default=80, help="turns measured")
    parser.add_argument("--every", type=int, default=8, help="an image request every n turns")
    parser.add_argument("--size", type=int, nargs=2, default=(1280, 960), help="image w h")
    args = parser.parse_args()
    reexec_with_blas()
    from tests.support.arch_zoo.vision import build_vision_model, sample_image
    from worker.config import EngineConfig
    from worker.engine.engine import Engine

    text, vision = _bench_vision().SHAPES["qwen2_5_vl"]
    directory = build_vision_model(
        "qwen2_5_vl", Path(tempfile.mkdtemp()) / "vlm", text=text, vision=vision
    )
    engine = Engine.from_path(directory, EngineConfig(block_size=16, num_blocks=2048))
    image = sample_image(*args.size, seed=1)
    _, keyed, images = _bench_vision().prompt(directory, image)
    text_ids = list(range(100, 160))
    results = {}
    for way in ("inline", "off_thread", "inline", "off_thread"):  # the second pair reported
        results[way] = run(engine, way, args, keyed, images, text_ids)
    for result in results.values():
        print(json.dumps({**result, "image": list(args.size), "batch": args.batch}))
    inline, off = results["inline"], results["off_thread"]
    print(
        json.dumps(
            {
                "measure": "ratios",
                "blas": active_blas(),
                "intake_inline_vs_off": round(
                    inline["intake_on_engine_thread_p50_ms"]
                    / off["intake_on_engine_thread_p50_ms"],
                    1,
                ),
                "arrival_turn_p50_inline_vs_off": round(
                    inline["arrival_turn_p50_ms"] / off["arrival_turn_p50_ms"], 2
                ),
                "text_decode_off_vs_inline": round(
                    off["text_decode_tok_s"] / inline["text_decode_tok_s"], 2
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
