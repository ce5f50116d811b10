"""Starting one rank of a tensor-parallel group (see `worker.tp.runner`): the leader gets an Engine
whose runner broadcasts each forward; a follower mirrors the Engine's start-up forwards and
then runs whatever the leader sends."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from worker.attention import select_backend
from worker.engine.engine import Engine
from worker.kv.memory import MemoryBudgetTooSmall
from worker.runner.model_runner import ModelRunner
from worker.runner.model_support import probe_shape
from worker.tp.pool_plan import PoolPlan
from worker.tp.runner import (
    GroupError,
    LeaderRunner,
    StepWire,
    Watchdog,
    gather_ranks,
    group_lost,
    init_group,
    serve_follower,
)
from worker.tp.runner import shard as shard_model

if TYPE_CHECKING:
    from worker.config import EngineConfig

log = logging.getLogger(__name__)


def load_sharded(model_dir: Path, config: EngineConfig, group: mx.distributed.Group):
    """This rank's shard of the model: loaded lazily and cut before any weight is read, so
    a rank holds its shard (plus, briefly, the tensor being sliced), not the whole model."""
    from shared.models.loading import load_model

    if config.kv_disk_bytes is not None:
        raise GroupError("the KV disk tier (--kv-disk) is not supported in tensor-parallel groups")
    model, tokenizer = load_model(model_dir, config.compute_dtype, lazy=True)
    return shard_model(model, group), tokenizer


def leader_engine(
    model: nn.Module,
    config: EngineConfig,
    group: mx.distributed.Group,
    max_context: int,
    timeout_s: float,
    grammars=None,
) -> tuple[Engine, LeaderRunner]:
    """Rank 0's Engine (its probe and warm-up forwards run on every rank) and its runner."""
    watchdog = Watchdog(timeout_s, "rank 0")
    engine = Engine.create(
        model,
        config,
        max_context,
        grammars=grammars,
        make_runner=LeaderRunner.factory(group, watchdog),
    )
    return engine, engine.runner


def follow(
    model: nn.Module, config: EngineConfig, group: mx.distributed.Group, timeout_s: float
) -> int:
    """A follower rank, until the leader stops the group (0); exits if the group breaks."""
    rank = f"rank {group.rank()}"
    watchdog = Watchdog(timeout_s, rank)
    try:
        shape = probe_shape(model)  # the leader's Engine runs this same forward first
        wire = StepWire(group)
        plan = PoolPlan(*wire.receive()[1])  # sent as the leader's Engine makes its runner
        pool = plan.pool(shape)  # this rank's KV heads, the leader's blocks and K/V layout
        backend, _ = select_backend(config.attention_backend, shape, config.block_size, pool)
        runner = ModelRunner(model, pool, plan.scratch_block, backend, shape.layout())
    except RuntimeError as exc:  # the leader failed to start: its sockets closed
        group_lost(rank, exc)
    return serve_follower(runner, wire, watchdog)


def ring_env_from_hosts(hosts: tuple[str, ...], rank: int, default_port: int) -> None:
    """Point MLX at a ring of `hosts` (IP or IP:port each, rank 0 first) as this `rank`: the
    hostfile and variables `mlx.launch` would set."""
    ring = []
    for entry in hosts:
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        ip = socket.gethostbyname(host)  # the ring backend wants addresses, not names
        ring.append([f"{ip}:{port or default_port}"])
    hostfile = Path(tempfile.gettempdir()) / f"mlx-fleet-ring-{os.getpid()}.json"
    hostfile.write_text(json.dumps(ring))
    os.environ.update(MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile))


def serve_group_rank(
    worker, model_id: str, model_dir: Path, config: EngineConfig, worker_id: str, configure_socket
) -> int:
    """`cluster-worker` as one rank of a group: rank 0 serves the router, the others follow."""
    from shared.models.store import context_length
    from worker.loop import WorkerLoop

    try:
        if worker.tp_hosts:
            ring_env_from_hosts(worker.tp_hosts, worker.tp_rank, worker.tp_port)
        group = init_group()
        ranks = gather_ranks(group)
        model, tokenizer = load_sharded(model_dir, config, group)
    except (GroupError, OSError) as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2
    log.info("rank %d of %d: %s sharded", group.rank(), group.size(), model_dir.name)
    if group.rank() != 0:
        return follow(model, config, group, worker.tp_timeout_s)
    from worker.runner.grammar import GrammarCompiler

    # the vocabulary from the config: a probe forward here would run collectives the other
    # ranks are not running
    grammars = GrammarCompiler.from_hf_tokenizer(tokenizer, model.args.vocab_size)
    try:  # a layout the model cannot take (--kv-group-size), no room: the followers exit too
        engine, leader = leader_engine(
            model, config, group, context_length(model_dir), worker.tp_timeout_s, grammars
        )
    except (ValueError, MemoryBudgetTooSmall) as exc:
        print(f"cluster-worker: error: {exc}", file=sys.stderr)
        return 2
    server = WorkerLoop(
        engine,
        worker.router,
        worker_id,
        model_id,
        configure_socket,
        ranks,
        leader.keepalive,
        otlp_endpoint=worker.otlp_endpoint,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    try:
        return server.serve_forever()
    finally:
        leader.stop()
