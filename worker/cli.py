"""`cluster-worker`: load a model, connect to a router, serve until told to stop."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import time

from shared.blas import openblas_active, reexec_with_openblas

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}  # fmt: skip


def parse_size(text: str) -> int:
    """'2GiB', '512MB', '1e9'-free plain bytes -> bytes."""
    m = _SIZE_RE.match(text)
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 512MB, 1048576)")
    return int(float(m.group(1)) * _UNITS[unit])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-worker",
        description="An mlx-fleet worker: runs one model replica and serves the router at --router.",
    )
    p.add_argument("--router", default="tcp://127.0.0.1:5555", help="the router's ZeroMQ address")
    p.add_argument("--model", help="model dir, .gguf, HF repo id; default: SmolLM2-135M-Instruct")
    p.add_argument(
        "--model-id", help="model name to register (default: the model directory's name)"
    )
    p.add_argument("--worker-id", help="unique name of this worker (default: HOST-PID)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv-memory", type=parse_size, help="KV cache budget, e.g. 2GiB")
    kv.add_argument(
        "--kv-fraction", type=float, help="KV budget as a fraction of device memory (default 0.25)"
    )
    p.add_argument("--block-size", type=int, default=32, help="tokens per KV block (default 32)")
    p.add_argument("--max-running", type=int, default=64, help="most sequences decoding at once")
    p.add_argument(
        "--prefill-chunk", type=int, default=256, help="most prompt tokens per sequence per step"
    )
    p.add_argument("--step-token-budget", type=int, default=1024, help="tokens per engine step")
    p.add_argument(
        "--compute-dtype", default="auto", help="auto, float32, float16, bfloat16, quantized"
    )
    p.add_argument("--log-level", default="INFO")
    return p


def engine_config(args):
    from worker.config import EngineConfig

    extra = {}
    if args.kv_memory:
        extra["kv_memory_bytes"] = args.kv_memory
    if args.kv_fraction:
        extra["kv_memory_fraction"] = args.kv_fraction
    return EngineConfig(
        block_size=args.block_size,
        max_running=args.max_running,
        prefill_chunk=args.prefill_chunk,
        step_token_budget=max(args.step_token_budget, args.prefill_chunk),
        compute_dtype=args.compute_dtype,
        **extra,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reexec_with_openblas()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("worker")
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"

    from shared.model_store import ModelNotFound, resolve_model, stderr_progress
    from worker.engine import Engine
    from worker.server import WorkerServer

    try:
        model_dir = resolve_model(args.model, stderr_progress)
        config = engine_config(args)
        config.validate()
    except (ModelNotFound, ValueError) as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    engine = Engine.from_path(model_dir, config)
    log.info(
        "%s: %s loaded in %.1fs, %d KV blocks of %d tokens, OpenBLAS %s",
        worker_id, model_dir.name, time.perf_counter() - start, engine.pool.num_blocks - 1,
        config.block_size, "on" if openblas_active() else "off",
    )  # fmt: skip
    server = WorkerServer(engine, args.router, worker_id, args.model_id or model_dir.name)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    return server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
