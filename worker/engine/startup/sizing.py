"""Assembly before an Engine serves, with no forward pass (`Engine.__init__`): its memory
sized (weights, a step's activations, the KV pool), the pool made, the disk tier opened; and,
before the first forward (`Engine.create`), MLX's limits set to that sizing."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.nn as nn
from mlx.utils import tree_flatten

from shared.config.choices import DEFAULT_KV_DISK_DIR
from worker.attention.prefix_kv import PREFIX_KV_BYTES
from worker.engine.caches.states import plan_states
from worker.kv.block_io import block_layout, model_fingerprint
from worker.kv.block_pool import BlockPool
from worker.kv.disk_store import DiskKVStore
from worker.kv.disk_tier import DiskTier
from worker.kv.memory import (
    MemoryBudgetTooSmall,
    MemoryPlan,
    activation_bytes_per_token,
    apply_limits,
    default_budget_bytes,
    layers_bytes_per_block,
    memory_budget_bytes,
    plan_memory,
)
from worker.runner.model_support import ModelShape

if TYPE_CHECKING:
    from worker.config import EngineConfig

log = logging.getLogger(__name__)


def size_memory(
    config: EngineConfig, shape: ModelShape, model: nn.Module
) -> tuple[EngineConfig, int, MemoryPlan | None]:
    """(config, pool blocks, plan): as configured when `num_blocks` is given (tests); else
    the worker's memory budget split into weights, one step's activations (the step token
    budget and the largest prefill chunk cut to fit) and the KV pool (as large as the KV
    setting asks, within what is left). Raises MemoryBudgetTooSmall."""
    if config.num_blocks is not None:
        return plan_states(config, shape, None)[0], config.num_blocks, None
    budget = config.memory_budget_bytes or default_budget_bytes()
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    kv_wanted = config.kv_memory_bytes or memory_budget_bytes(config.kv_memory_fraction)
    per_token = activation_bytes_per_token(
        shape.vocab_size, shape.num_heads or shape.num_kv_heads, shape.head_dim
    )
    plan = plan_memory(
        budget,
        weights,
        kv_wanted,
        per_token,
        config.step_token_budget,
        config.block_size,
        kept_max=PREFIX_KV_BYTES,
    )
    step = plan.step_tokens
    config = replace(config, step_token_budget=step, prefill_chunk=min(config.prefill_chunk, step))
    quant = kv_quantization(config)
    config, kv_bytes = plan_states(config, shape, plan.kv)
    if not shape.num_layers:  # recurrent layers only: blocks keep tokens' hashes, no K/V
        log.info("%s; %d state slots", plan.describe(), config.max_running)
        return config, 4 * config.max_running * -(-config.prefill_chunk // config.block_size), plan
    shapes, windowed = shape.pool_shapes(bool(quant)), _window_layers(config, shape)
    # a pool with window pages is units of its full layers' size (worker/kv/window_pages.py)
    unit = [s for i, s in enumerate(shapes) if i not in windowed] if windowed else shapes
    blocks = kv_bytes // layers_bytes_per_block(config.block_size, unit, shape.kv_dtype, **quant)
    if blocks < 2:  # the scratch block and one to serve with
        raise MemoryBudgetTooSmall(f"no room for the KV pool: {plan.describe()}")
    log.info("%s; %d KV blocks", plan.describe(), blocks)
    return config, blocks, plan


def apply_memory_plan(plan: MemoryPlan) -> None:
    """MLX's memory limits set to the plan's budget: before the first forward
    (`Engine.create`). The kept prefixes' share reached the runner as it was made
    (`kept_prefix_bytes`)."""
    apply_limits(plan.budget)


def kept_prefix_bytes(plan: MemoryPlan | None) -> int:
    """What the runner's attention may keep of gathered prefix K/V across ticks (its
    `PrefixKV`): the plan's share of the budget, or `PREFIX_KV_BYTES` when the engine was
    not sized from one (`num_blocks` given: tests)."""
    return plan.kept_prefixes if plan is not None else PREFIX_KV_BYTES


def make_pool(config: EngineConfig, shape: ModelShape, num_blocks: int) -> BlockPool:
    """The paged K/V pool `size_memory` sized, with its window pages and quantization."""
    quant = kv_quantization(config)
    return BlockPool(
        num_blocks,
        config.block_size,
        num_layers=shape.num_layers,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=shape.kv_dtype,
        layer_shapes=shape.pool_shapes(bool(quant)),
        **window_layout(config, shape),
        **quant,
    )


def _window_layers(config: EngineConfig, shape: ModelShape) -> list[int]:
    """The layers whose K/V go in window pages: the sliding-window ones, when full-attention
    layers of the same K/V shape sit beside them and `release_windows` is on."""
    kinds = shape.kinds()
    windowed = [i for i, kind in enumerate(kinds) if kind.window is not None]
    if not config.release_windows or len(windowed) == len(kinds) or not shape.uniform:
        return []
    return windowed


def window_layout(config: EngineConfig, shape: ModelShape) -> dict:
    """The pool's window arguments: which layers keep window pages, the widest window, and
    whether they are all chunked attention of one chunk size (`WindowPages.chunked`)."""
    windowed = _window_layers(config, shape)
    if not windowed:
        return {}
    kinds = [shape.kinds()[i] for i in windowed]
    window = max(k.window for k in kinds)
    # Llama 4's chunks in whole blocks, no sliding window beside them: the exact chunk rule
    chunked = all(k.chunk == window for k in kinds) and window % config.block_size == 0
    return {
        "window_layers": windowed,
        "window": window,
        "window_chunk": config.prefill_chunk,
        "chunked": chunked,
    }


def kv_quantization(config: EngineConfig) -> dict:
    """The pool's K/V quantization (`kv_bits`, `kv_group_size`) as configured: none at 16."""
    if config.kv_bits is None or config.kv_bits >= 16:
        return {}
    return {"kv_bits": config.kv_bits, "kv_group_size": config.kv_group_size}


def open_disk_tier(
    config: EngineConfig,
    model: nn.Module,
    pool: BlockPool,
    refused: str | None = None,
) -> DiskTier | None:
    """The KV tier on disk, when configured: its files from an earlier run indexed (the KV
    manager copies the cache's evictions to it). `refused`: why the model's cache kinds rule
    it out, or the pool's layer shapes."""
    if config.kv_disk_bytes is None:
        return None
    if refused is not None:
        log.warning("KV disk tier off: %s", refused)
        return None
    layout = block_layout(pool)
    root = Path(config.kv_disk_dir or DEFAULT_KV_DISK_DIR).expanduser()
    store = DiskKVStore(root, model_fingerprint(model, layout), layout, config.kv_disk_bytes)
    kept = store.scan()
    log.info("KV disk tier at %s: %d blocks from earlier runs", store.dir, kept)
    return DiskTier(pool, store)
