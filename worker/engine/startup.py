"""Before an Engine serves: its KV memory sized, its disk tier opened, then the model checked
and warmed up.

Sizing and the disk tier are assembly (no forward pass) and run in `Engine.__init__`; the
checks and the warm-up run forward passes, so they are a step of their own (`prepare`) that
`Engine.create` takes after building the engine. A tensor-parallel follower mirrors exactly
these forwards, in this order: the shape probe, the model check, the warm-up.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from shared.config.choices import DEFAULT_KV_DISK_DIR
from shared.protocol import KVGroupReport
from shared.sampling import SamplingParams
from worker.attention.prefix_kv import PREFIX_KV, PREFIX_KV_BYTES
from worker.engine.sequence import Sequence
from worker.engine.states import plan_states
from worker.engine.stats import EngineStats
from worker.engine.step_kind import forward_costs
from worker.kv.block_io import block_layout, model_fingerprint
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
from worker.runner.layer_groups import LayerKind, group_layers
from worker.runner.model_support import (
    COVERED_ARCHITECTURES,
    ModelShape,
    UnsupportedModel,
    decide_modes,
    model_type,
    reference_greedy,
    verification_prompt,
)
from worker.runner.plan import PrefillChunk, StepKind, StepPlan

if TYPE_CHECKING:
    from worker.config import EngineConfig
    from worker.engine.engine import Engine
    from worker.kv.block_pool import BlockPool
    from worker.kv.radix_cache import RadixCache

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
        budget, weights, kv_wanted, per_token, config.step_token_budget, config.block_size,
        kept_max=PREFIX_KV_BYTES,
    )  # fmt: skip
    step = plan.step_tokens
    config = replace(config, step_token_budget=step, prefill_chunk=min(config.prefill_chunk, step))
    quant = kv_quantization(config)
    config, kv_bytes = plan_states(config, shape, plan.kv)
    if not shape.num_layers:  # recurrent layers only: blocks keep tokens' hashes, no K/V
        log.info("%s; %d state slots", plan.describe(), config.max_running)
        return config, 4 * config.max_running * -(-config.prefill_chunk // config.block_size), plan
    shapes, windowed = shape.shapes(), _window_layers(config, shape)
    # a pool with window pages is units of its full layers' size (worker/kv/window_pages.py)
    unit = [s for i, s in enumerate(shapes) if i not in windowed] if windowed else shapes
    blocks = kv_bytes // layers_bytes_per_block(config.block_size, unit, shape.kv_dtype, **quant)
    if blocks < 2:  # the scratch block and one to serve with
        raise MemoryBudgetTooSmall(f"no room for the KV pool: {plan.describe()}")
    log.info("%s; %d KV blocks", plan.describe(), blocks)
    return config, blocks, plan


def make_pool(config: EngineConfig, shape: ModelShape, num_blocks: int) -> BlockPool:
    """The paged K/V pool `size_memory` sized, with its window pages and quantization."""
    from worker.kv.block_pool import BlockPool

    return BlockPool(
        num_blocks, config.block_size, num_layers=shape.num_layers,
        num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim, dtype=shape.kv_dtype,
        layer_shapes=shape.shapes(), **window_layout(config, shape), **kv_quantization(config),
    )  # fmt: skip


def _window_layers(config: EngineConfig, shape: ModelShape) -> list[int]:
    """The layers whose K/V go in window pages: the sliding-window ones, when full-attention
    layers of the same K/V shape sit beside them and `release_windows` is on."""
    kinds = shape.kinds()
    windowed = [i for i, kind in enumerate(kinds) if kind.window is not None]
    if not config.release_windows or len(windowed) == len(kinds) or not shape.uniform:
        return []
    return windowed


def window_layout(config: EngineConfig, shape: ModelShape) -> dict:
    """The pool's window arguments: which layers keep window pages, and the widest window."""
    windowed = _window_layers(config, shape)
    if not windowed:
        return {}
    window = max(k.window for k in shape.kinds() if k.window is not None)
    return {"window_layers": windowed, "window": window, "window_chunk": config.prefill_chunk}


def kv_quantization(config: EngineConfig) -> dict:
    """The pool's K/V quantization (`kv_bits`, `kv_group_size`) as configured: none at 16."""
    if config.kv_bits is None or config.kv_bits >= 16:
        return {}
    return {"kv_bits": config.kv_bits, "kv_group_size": config.kv_group_size}


def open_disk_tier(
    config: EngineConfig, model: nn.Module, pool: BlockPool, cache: RadixCache,
    refused: str | None = None,
) -> DiskTier | None:  # fmt: skip
    """The KV tier on disk, when configured: its files from an earlier run indexed, and the
    cache's evictions copied to it. `refused`: why the model's cache kinds rule it out."""
    if config.kv_disk_bytes is None:
        return None
    if refused is not None:
        log.warning("KV disk tier off: %s", refused)
        return None
    if not pool.uniform:
        log.warning(
            "KV disk tier off: this model's layers keep K/V of different shapes (%s), which "
            "the disk tier's block format does not carry yet",
            sorted(set(pool.layer_shapes)),
        )
        return None
    layout = block_layout(pool)
    root = Path(config.kv_disk_dir or DEFAULT_KV_DISK_DIR).expanduser()
    store = DiskKVStore(root, model_fingerprint(model, layout), layout, config.kv_disk_bytes)
    kept = store.scan()
    log.info("KV disk tier at %s: %d blocks from earlier runs", store.dir, kept)
    tier = DiskTier(pool, store)
    cache.set_evict_listener(tier.save)
    return tier


def prepare(engine: Engine) -> None:
    """Check the model, warm up (unless `config.warmup` is off), then announce the disk
    tier's blocks: what `Engine.create` runs after assembly. MLX's memory limits are set
    to the budget first (when the engine sized itself from one)."""
    if engine.memory is not None:
        apply_limits(engine.memory.budget)
        PREFIX_KV.budget = engine.memory.kept_prefixes  # (within the budget, or none)
    engine.scheduler.costs = forward_costs(engine.model, engine.pool)  # the fold rule's prices
    check_model(engine)
    if engine.config.warmup:
        warm_up(engine)
    engine.kv_events.announce_disk_blocks()


def set_layer_modes(runner, kinds: list[LayerKind], gathered: list[bool]) -> None:
    """Each cache slot's kind and mode (gathered, else paged) on the runner (a tensor-parallel
    leader's own runner: its followers run every layer paged and full, so it refuses others)."""
    inner = getattr(runner, "inner", runner)
    if inner is not runner and (any(gathered) or any(k.window is not None for k in kinds)):
        raise UnsupportedModel(
            "tensor-parallel groups serve only models whose every layer is plain full "
            "attention; serve this one with one worker per model replica"
        )
    inner.kinds, inner.gathered = list(kinds), list(gathered)


def kv_groups(pool: BlockPool, kinds: list[LayerKind], gathered: list[bool]):
    """The pool's layer groups as the worker reports them (`/v1/cluster`, `/metrics`)."""
    quant = {"kv_bits": pool.kv_bits, "kv_group_size": pool.kv_group_size}
    return tuple(
        KVGroupReport(
            group.kind.describe(),
            len(group.layers),
            layers_bytes_per_block(
                1, [pool.layer_shapes[i] for i in group.layers], pool.dtype, **quant
            ),
            sum(not gathered[i] for i in group.layers),
        )
        for group in group_layers(kinds)
    )


def check_model(engine: Engine) -> None:
    """Refuse a model the paged KV would serve wrongly, and set each layer's mode (see
    `worker.runner.model_support`): a one-token forward with every layer gathered shows
    which layers the paged attention plan can serve."""
    # two rows at different positions: a model that reads one position for the whole batch
    # (`cache.offset` as a number) fails here, not on its first batch
    probes = []
    for length in (1, 2):
        probe = Sequence("__probe__", 1, [0] * length, SamplingParams(max_tokens=1), arrival=-1)
        probe.block_ids = [engine.scratch_block]
        probe.state_slot = engine.states.pool.allocate() if engine.states else -1
        probe.num_computed = length - 1
        probes.append(PrefillChunk(probe, 1))
    plan = StepPlan(StepKind.PREFILL, [], probes, [])
    runner = engine.runner
    kinds = engine.shape.kinds()
    name = model_type(engine.model)
    inner = getattr(runner, "inner", runner)
    inner.kinds, inner.gathered = kinds, [True] * len(kinds)
    try:
        mx.eval(*runner.run(plan).outputs)
    except Exception as exc:  # noqa: BLE001 - whatever breaks the probe is a refusal
        raise UnsupportedModel(
            f"model type {name!r} failed a one-token forward over the paged KV "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    for probe in (c.seq for c in probes if c.seq.state_slot >= 0):
        engine.states.pool.free(probe.state_slot)
    gathered = decide_modes(engine.model, kinds, runner.last_caches, inner.uncached_attention)
    runner.last_caches = []
    set_layer_modes(runner, kinds, gathered)
    engine.attention_report = replace(
        engine.attention_report, kv_groups=kv_groups(engine.pool, kinds, gathered)
    )
    log.info(
        "model type %r: %s; %d of %d layers paged, %d gathered",
        name,
        ", ".join(f"{len(g.layers)} x {g.kind.describe()}" for g in group_layers(kinds)),
        gathered.count(False),
        len(gathered),
        gathered.count(True),
    )
    if name not in COVERED_ARCHITECTURES:
        verify_greedy(engine, name)


def verify_greedy(engine: Engine, name: str) -> None:
    """For an architecture the tests do not cover: two prompts of different lengths decoded
    together, greedy, against plain mlx-lm alone; refuse the model unless the tokens match
    (a model that derives positions from the batch's K/V length passes alone, not batched)."""
    vocab = engine.shape.vocab_size
    prompts = [
        verification_prompt(vocab, engine.config.block_size + 5),
        verification_prompt(vocab, 3, salt=11),
    ]
    expected = [reference_greedy(engine.model, p, 6) for p in prompts]
    got = run_together(engine, prompts, 6)
    if got != expected:
        raise UnsupportedModel(
            f"model type {name!r} is not among the tested architectures "
            f"({', '.join(sorted(COVERED_ARCHITECTURES))}) and its greedy output over the "
            f"paged KV differs from mlx-lm's ({got} vs {expected})"
        )
    log.info("model type %r: paged greedy output matches mlx-lm; serving it", name)


def warm_up(engine: Engine) -> None:
    """Run a short request through prefill and decode, then forget it, so the first real
    request pays no one-time costs (allocations, graph construction)."""
    start = time.perf_counter()
    run_alone(engine, [0] * (engine.config.block_size + 3), 3)
    engine.stats_ = EngineStats()
    log.info("warm-up took %.2fs", time.perf_counter() - start)


def run_alone(engine: Engine, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of one internal request, run to the end; forgets its cache entries."""
    return run_together(engine, [prompt], max_tokens)[0]


def run_together(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens of internal requests decoded together, run to the end; forgets their
    cache entries."""
    ids = [f"__check{i}__" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens))
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_work():
        for delta in engine.step():
            if delta.error:
                raise UnsupportedModel(f"the load-time check failed: {delta.error}")
            tokens[delta.request_id] += delta.token_ids
    engine.forget_cache()
    return [tokens[rid] for rid in ids]


def open_vision(engine: Engine, model_dir: Path, tokenizer) -> Engine:
    """A vision model's image side (worker/vision), on the intake; or, on the intake, why
    its images are refused (no `vision` extra, a family not served). Returns the engine."""
    from shared.models.loading import resolve_compute_dtype
    from shared.models.vision import has_vision, read_config
    from worker.vision.encoder import open_vision as open_encoder

    if not has_vision(read_config(model_dir)):  # a text model never touches the vision code
        return engine
    name = resolve_compute_dtype(engine.config.compute_dtype)
    dtype = getattr(mx, name) if name != "quantized" else None
    embed = engine.runner.trunk.embedding
    encoder, note = open_encoder(model_dir, embed, dtype, tokenizer.convert_ids_to_tokens)
    if encoder is not None and encoder.mrope is not None:  # Qwen-VL: 3-D image positions
        from worker.vision.mrope import install_mrope

        install_mrope(engine.runner.trunk.module, *encoder.mrope)
    if encoder is not None and encoder.deepstack_layers:  # Qwen3-VL
        from worker.vision.deepstack import install_deepstack

        install_deepstack(engine.runner.trunk.module, encoder.deepstack_layers)
    engine.intake.vision = encoder
    engine.intake.vision_note = note or engine.intake.vision_note
    return engine
