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

import zmq

from shared.blas import active_blas, reexec_with_blas
from shared.config.choices import DEFAULT_MODEL_NAME, MODEL_ID_ENV
from shared.config.flags import add_flags
from shared.config.sections import ModelSection, WorkerSection
from shared.parent_watch import SPAWNED_AT_ENV, watch_parent

# [worker] settings past the KV budget and batch shape, in --help order
ENGINE_FLAGS = ("attention_backend", "speculative", "kv_disk", "kv_disk_dir")
ENGINE_FLAGS += ("kv_bits", "kv_group_size", "pin_share", "batch_hold_s")
ENGINE_FLAGS += ("curve_secret_key", "curve_server_key", "kv_peer_bind", "kv_peer_key")
ENGINE_FLAGS += ("kv_peer_timeout_s", "role")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-worker",
        description="An mlx-fleet worker: runs one model replica and serves the router at --router.",
    )
    p.add_argument(
        "--config", help="fleet TOML file (deploy/fleet.example.toml); flags override it"
    )
    add_flags(p, WorkerSection, ["router"])
    p.add_argument("--model", help=f"model dir, .gguf, HF repo id; default: {DEFAULT_MODEL_NAME}")
    p.add_argument(
        "--model-id",
        default=os.environ.get(MODEL_ID_ENV),
        help=f"the model's name, registered with the router (default: ${MODEL_ID_ENV}, else "
        "the model directory's name); with a --config listing [[models]], picks the one this "
        "worker serves",
    )
    add_flags(p, WorkerSection, ["worker_id"])
    add_flags(p.add_mutually_exclusive_group(), WorkerSection, ["kv_memory", "kv_fraction"])
    add_flags(p, WorkerSection, ["memory_budget", "block_size", "max_running", "prefill_chunk"])
    add_flags(p, ModelSection, ["compute_dtype"])
    add_flags(p, WorkerSection, ENGINE_FLAGS)
    tp = p.add_argument_group(
        "tensor parallel",
        "one model replica over several ranks (see docs/deploy.md); also joins a group when "
        "started by mlx.launch (MLX_RANK, MLX_HOSTFILE set)",
    )
    add_flags(tp, WorkerSection, ["tp_hosts", "tp_rank", "tp_port", "tp_timeout_s"])
    add_flags(p, WorkerSection, ["watchdog_s", "log_level", "otlp_endpoint"])
    add_flags(p, WorkerSection, ["kv_events_publish", "kv_events_replay", "kv_events_topic"])
    return p


# EngineConfig field <- [worker] / [model] setting, where the names differ
ENGINE_FIELDS = {"kv_memory_bytes": "kv_memory", "kv_memory_fraction": "kv_fraction"}
ENGINE_FIELDS |= {"kv_disk_bytes": "kv_disk", "memory_budget_bytes": "memory_budget"}


def engine_config(worker, model):
    """EngineConfig from the merged [worker] and [model] settings (None = the engine default)."""
    from worker.config import EngineConfig

    given = {"compute_dtype": model.compute_dtype}
    for field in dataclasses.fields(EngineConfig):
        name = ENGINE_FIELDS.get(field.name, field.name)
        if field.name != "compute_dtype" and hasattr(worker, name):
            given[field.name] = getattr(worker, name)
    if given["kv_disk_dir"] is not None:
        given["kv_disk_dir"] = str(given["kv_disk_dir"])
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
        for router in fleet.worker.router:
            require_curve(router, fleet.worker.curve_enabled, "--router")
        peer_channel(fleet.worker)  # refuses a KV endpoint off loopback without a key
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


def peer_channel(worker):
    """The KV channel's settings for peer block transfer, or None when it is off."""
    from worker.peer.channel import PeerChannel

    return PeerChannel.from_settings(worker.kv_peer_bind, worker.kv_peer_key, worker.router)


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
    reexec_with_blas()
    logging.basicConfig(
        level=worker.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("worker")
    worker_id = worker.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    log_since_spawn(log)
    imports = time.perf_counter()
    from shared.models.store import ModelNotFound, resolve_section, stderr_progress
    from worker.engine.engine import Engine
    from worker.kv.memory import MemoryBudgetTooSmall
    from worker.loop import WorkerLoop

    log.info("imports (mlx, mlx-lm, engine) took %.2fs", time.perf_counter() - imports)

    try:
        model_dir = resolve_section(model, stderr_progress)
        config = engine_config(worker, model)
    except (ModelNotFound, ValueError) as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2
    embedding = embedding_model(model_dir, model.task)
    if isinstance(embedding, int):
        return embedding
    if embedding is not None:  # an embedding model: no engine, no KV pool (worker/embed/)
        from worker.embed.loop import serve_embeddings
        from worker.embed.trunk import TrunkUnavailable

        watch_parent()
        try:
            return serve_embeddings(
                model_dir, embedding, worker, model, config, worker_id, socket_setup(worker)
            )
        except TrunkUnavailable as exc:
            print(f"cluster-worker: error: {exc}", file=sys.stderr)
            return 2
    if worker.tp_hosts or "MLX_HOSTFILE" in os.environ:  # one rank of a tensor-parallel group
        from worker.tp.start import serve_group_rank

        return serve_group_rank(
            worker, model.name, model_dir, config, worker_id, socket_setup(worker)
        )
    start = time.perf_counter()
    try:
        engine = Engine.from_path(model_dir, config)
    except MemoryBudgetTooSmall as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2
    log.info(
        "%s: %s (%s) loaded in %.1fs, %d KV blocks of %d tokens, BLAS %s",
        worker_id,
        model.name,
        model_dir,
        time.perf_counter() - start,
        engine.kv.figures().total_blocks - 1,
        config.block_size,
        active_blas(),
    )
    try:
        publisher = kv_publisher(worker)
    except zmq.ZMQError as exc:
        print(f"cluster-worker: error: --kv-events-publish: {exc}", file=sys.stderr)
        return 2
    server = WorkerLoop(
        engine,
        worker.router,
        worker_id,
        model.name,
        socket_setup(worker),
        watchdog_s=worker.watchdog_s,
        otlp_endpoint=worker.otlp_endpoint,
        kv_publisher=publisher,
        peers=peer_channel(worker),
        pull_timeout_s=worker.kv_peer_timeout_s,
        role=worker.role,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    watch_parent()  # started by launch-cluster: go when it goes (macOS has no PDEATHSIG)
    return server.serve_forever()


def embedding_model(model_dir, task: str | None):
    """The model's EmbeddingSpec, None for a chat model, or 2 (the exit code) after saying
    why an embedding model cannot be served."""
    from shared.models.embedding import NotServable, embedding_spec

    try:
        return embedding_spec(model_dir, task)
    except NotServable as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2


def kv_publisher(worker):
    """The vLLM-format KV event publisher, when --kv-events-publish is given."""
    if not worker.kv_events_publish:
        return None
    from worker.kv_publish import VllmEventPublisher

    return VllmEventPublisher(
        worker.kv_events_publish, worker.kv_events_replay, worker.kv_events_topic
    )


if __name__ == "__main__":
    sys.exit(main())
