"""Starting one rank of a tensor-parallel group (see `worker.tp`): the leader gets an Engine
whose runner broadcasts each forward; a follower mirrors the Engine's start-up forwards and
then runs whatever the leader sends."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from worker.attention_select import select_backend
from worker.config import EngineConfig
from worker.engine import Engine
from worker.model_support import probe_shape
from worker.tp import GroupError, LeaderRunner, StepWire, Watchdog, follower_runner, serve_follower
from worker.tp import shard as shard_model


def load_sharded(model_dir: Path, config: EngineConfig, group: mx.distributed.Group) -> nn.Module:
    """The model, loaded whole and then cut to this rank's shard."""
    from shared.model_loading import load_model

    if config.kv_disk_bytes is not None:
        raise GroupError("the KV disk tier (--kv-disk) is not supported in tensor-parallel groups")
    model, _ = load_model(model_dir, config.compute_dtype)
    return shard_model(model, group)


def leader_engine(
    model: nn.Module,
    config: EngineConfig,
    group: mx.distributed.Group,
    max_context: int,
    timeout_s: float,
) -> tuple[Engine, LeaderRunner]:
    """Rank 0's Engine (its probe and warm-up forwards run on every rank) and its runner."""
    watchdog = Watchdog(timeout_s, "rank 0")
    engine = Engine(model, config, max_context, make_runner=LeaderRunner.factory(group, watchdog))
    return engine, engine.runner


def follow(
    model: nn.Module, config: EngineConfig, group: mx.distributed.Group, timeout_s: float
) -> int:
    """A follower rank, until the leader stops the group (0); exits if the group breaks."""
    watchdog = Watchdog(timeout_s, f"rank {group.rank()}")
    shape = probe_shape(model)  # the leader's Engine runs this same forward first
    backend, _ = select_backend(config.attention_backend, shape, config.block_size)
    wire = StepWire(group)
    runner = follower_runner(model, wire, shape, backend)
    return serve_follower(runner, wire, watchdog)
