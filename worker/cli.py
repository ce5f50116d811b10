"""`cluster-worker`: load a model, connect to a router, serve until told to stop."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import socket
import sys
import time

from shared.blas import openblas_active, reexec_with_openblas
from shared.config.fleet import MODEL_ID_ENV
from shared.parent_watch import SPAWNED_AT_ENV, watch_parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-worker",
        description="An mlx-fleet worker: runs one model replica and serves the router at --router.",
    )
    p.add_argument(
        "--config", help="fleet TOML file (deploy/fleet.example.toml); flags override it"
    )
    p.add_argument("--router", help="the router's ZeroMQ address (default tcp://127.0.0.1:5555)")
    p.add_argument("--model", help="model dir, .gguf, HF repo id; default: SmolLM2-135M-Instruct")
    p.add_argument(
        "--model-id",
        default=os.environ.get(MODEL_ID_ENV),
        help="the model's name, registered with the router (default: $MLX_FLEET_MODEL_ID, else "
        "the model directory's name); with a --config listing [[models]], picks the one this "
        "worker serves",
    )
    p.add_argument("--worker-id", help="unique name of this worker (default: HOST-PID)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv-memory", help="KV cache budget, e.g. 2GiB")
    kv.add_argument(
        "--kv-fraction", type=float, help="KV budget as a share of device memory (default 0.25)"
    )
    p.add_argument("--block-size", type=int, help="tokens per KV block (default 32)")
    p.add_argument("--max-running", type=int, help="most sequences decoding at once (default 64)")
    p.add_argument(
        "--prefill-chunk", type=int, help="most prompt tokens per sequence per step (default 256)"
    )
    p.add_argument(
        "--compute-dtype", help="auto (default: float32 on CPU, quantized on Metal), float32, ..."
    )
    p.add_argument(
        "--attention-backend",
        choices=("auto", "metal", "mlx"),
        help="paged attention: auto (default: the Metal kernel where it passes its self-test "
        "at start, else MLX ops), metal, mlx",
    )
    p.add_argument(
        "--speculative",
        choices=("off", "ngram"),
        help="speculative decoding: ngram (prompt-lookup drafts for greedy requests, verified "
        "in the batch; output unchanged) or off (default: it did not pay on CPUs measured)",
    )
    p.add_argument(
        "--kv-disk",
        help="keep KV blocks evicted from memory on disk, up to this size (e.g. 20GiB), and "
        "read them back when a prompt returns; survives restarts (default: off)",
    )
    p.add_argument("--kv-disk-dir", help="folder of the disk tier (default ~/.cache/mlx-fleet/kv)")
    p.add_argument(
        "--curve-secret-key", help="this worker's CURVE secret key file (mlx-fleet-keys)"
    )
    p.add_argument("--curve-server-key", help="the router's CURVE public key file")
    tp = p.add_argument_group(
        "tensor parallel",
        "one model replica over several ranks (see docs/deploy.md); also joins a group when "
        "started by mlx.launch (MLX_RANK, MLX_HOSTFILE set)",
    )
    tp.add_argument(
        "--tp-hosts", type=lambda s: tuple(h for h in s.split(",") if h),
        help="every rank's IP or IP:port, rank 0 first, e.g. 10.0.0.1,10.0.0.2",
    )  # fmt: skip
    tp.add_argument("--tp-rank", type=int, help="this worker's rank (its place in --tp-hosts)")
    tp.add_argument("--tp-port", type=int, help="ring port of a host given without one (52100)")
    tp.add_argument(
        "--tp-timeout-s", type=float,
        help="a rank exits when its group makes no progress this long (default 60)",
    )  # fmt: skip
    p.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR")
    return p


def engine_config(worker, model):
    """EngineConfig from the merged [worker] and [model] settings (None = the engine default)."""
    from worker.config import EngineConfig

    given = {
        "kv_memory_bytes": worker.kv_memory,
        "kv_memory_fraction": worker.kv_fraction,
        "block_size": worker.block_size,
        "max_running": worker.max_running,
        "prefill_chunk": worker.prefill_chunk,
        "compute_dtype": model.compute_dtype,
        "attention_backend": worker.attention_backend,
        "kv_disk_bytes": worker.kv_disk,
        "speculative": worker.speculative,
        "kv_disk_dir": str(worker.kv_disk_dir) if worker.kv_disk_dir else None,
    }
    config = EngineConfig(**{k: v for k, v in given.items() if v is not None})
    if config.step_token_budget < config.prefill_chunk:  # a bigger chunk widens the step
        config = dataclasses.replace(config, step_token_budget=config.prefill_chunk)
    config.validate()
    return config


def load_settings(parser: argparse.ArgumentParser, argv: list[str] | None):
    """(args, [worker] section, [model] section), flags over the --config file."""
    from shared.config.fleet import ConfigError, load_with_flags
    from shared.curve import CurveError, require_curve

    renames = {"worker": {}, "model": {"model": "path", "model_id": "id"}}
    try:
        args, fleet = load_with_flags(parser, argv, renames)
        require_curve(fleet.worker.router, fleet.worker.curve_enabled, "--router")
    except (ConfigError, CurveError) as exc:
        parser.error(str(exc))
    model = fleet.model
    if args.model_id is not None and model.id is None:  # from $MLX_FLEET_MODEL_ID
        model = dataclasses.replace(model, id=args.model_id)
    return args, fleet.worker, model


def socket_setup(worker):
    """What the link applies to its DEALER socket before connecting: CURVE, when configured."""
    if not worker.curve_enabled:
        return None
    from shared.curve import configure_client

    return lambda sock: configure_client(sock, worker.curve_secret_key, worker.curve_server_key)


def log_since_spawn(log: logging.Logger) -> None:
    """Started by launch-cluster: how long the interpreter took to get here (restart time)."""
    try:
        spawned = float(os.environ.get(SPAWNED_AT_ENV, ""))
    except ValueError:
        return
    log.info("process up %.2fs after launch-cluster spawned it", time.time() - spawned)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, worker, model = load_settings(parser, argv)
    reexec_with_openblas()
    logging.basicConfig(
        level=worker.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("worker")
    worker_id = worker.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    log_since_spawn(log)
    imports = time.perf_counter()
    from shared.models.store import ModelNotFound, resolve_model, stderr_progress
    from worker.engine.engine import Engine
    from worker.loop import WorkerLoop

    log.info("imports (mlx, mlx-lm, engine) took %.2fs", time.perf_counter() - imports)

    try:
        model_dir = resolve_model(model.path, stderr_progress)
        config = engine_config(worker, model)
    except (ModelNotFound, ValueError) as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2
    if worker.tp_hosts or "MLX_HOSTFILE" in os.environ:  # one rank of a tensor-parallel group
        from worker.tp.start import serve_group_rank

        return serve_group_rank(
            worker, model.name, model_dir, config, worker_id, socket_setup(worker)
        )
    start = time.perf_counter()
    engine = Engine.from_path(model_dir, config)
    log.info(
        "%s: %s (%s) loaded in %.1fs, %d KV blocks of %d tokens, OpenBLAS %s",
        worker_id, model.name, model_dir, time.perf_counter() - start, engine.pool.num_blocks - 1,
        config.block_size, "on" if openblas_active() else "off",
    )  # fmt: skip
    server = WorkerLoop(engine, worker.router, worker_id, model.name, socket_setup(worker))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    watch_parent()  # started by launch-cluster: go when it goes (macOS has no PDEATHSIG)
    return server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
