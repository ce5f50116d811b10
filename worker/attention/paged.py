"""Paged attention over the flat K/V slot pools, and the helpers that fill those pools.

Pools, per layer, K and V each: `(num_blocks * block_size, num_kv_heads, head_dim)`, slot =
`block_id * block_size + offset` (docs/architecture.md). Backends:

- "mlx": MLX ops only, any device; the reference and the fallback (`worker.attention.mlx_ops`).
- "metal": the Metal kernel, only where Metal is (`worker.attention.metal.kernel`).
- "auto": the first available of ("metal", "mlx").

A forward builds one `AttentionPlan` from host ints (lengths, block tables) and every layer
calls it: the backend is resolved, the lengths checked and the tiles planned once per forward,
and nothing in a layer reads device data on the host (on an Apple GPU one such read idles the
GPU until the step in flight ends).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import mlx.core as mx

from shared.config.choices import ATTENTION_BACKENDS
from worker.attention.metal import kernel as metal_kernel
from worker.attention.metal import plan as metal_planning
from worker.attention.mlx_ops import gather_attention
from worker.attention.prefix_kv import PrefixKV
from worker.attention.tiles import prepare_tiles, tiled_attention
from worker.attention.window import check_window


class BackendUnavailableError(RuntimeError):
    """A paged-attention backend was asked for by name where it can't run."""


def _no_preparation(**_) -> dict:
    return {}


def _prepare_tiles(
    *,
    lengths,
    num_queries,
    num_heads,
    k_pool,
    block_size,
    block_tables,
    context_lengths,
    host_tables=None,
    prefix_kv=None,
    window=None,
) -> dict:
    tiles = prepare_tiles(
        lengths,
        num_queries,
        num_heads,
        k_pool,
        block_size,
        block_tables=block_tables,
        context_lengths=context_lengths,
        host_tables=host_tables,
        prefix_kv=prefix_kv,
        window=window,
    )
    return {"tiles": tiles}


class AttentionBackend(NamedTuple):
    name: str
    # (queries, k_pool, v_pool, block_tables, context_lengths, *, scale, block_size,
    #  max_context, window, sinks, **prepared) -> (B, n_heads, Lq, head_dim); inputs already
    # validated; `window` int | None, `sinks` (n_heads,) | None (`worker.attention.window`).
    run: Callable[..., mx.array]
    unavailable_reason: Callable[[], str | None]  # None: it can run here
    # host-side work shared by every layer of a forward (it gets the plan's `window` too)
    # -> extra keyword arguments of `run`
    prepare: Callable[..., dict] = _no_preparation


def _metal_checked(
    queries,
    k_pool,
    v_pool,
    block_tables,
    context_lengths,
    *,
    window=None,
    sinks=None,
    metal_plan=None,
    **common,
) -> mx.array:
    """The Metal kernel, where the window and sink variants a call needs passed their
    start-up self-test on this machine (`metal_plan.VERDICTS`); else that call runs the
    MLX-ops reference, which serves every window and sink."""
    verdicts = metal_planning.VERDICTS
    unchecked = (window is not None and not verdicts.enabled("window")) or (
        sinks is not None and not verdicts.enabled("sinks")
    )
    if unchecked:
        return gather_attention(
            queries,
            k_pool,
            v_pool,
            block_tables,
            context_lengths,
            window=window,
            sinks=sinks,
            **common,
        )
    return metal_kernel.paged_attention_metal(
        queries,
        k_pool,
        v_pool,
        block_tables,
        context_lengths,
        window=window,
        sinks=sinks,
        metal_plan=metal_plan,
        **common,
    )


BACKENDS: dict[str, AttentionBackend] = {
    "metal": AttentionBackend(
        "metal",
        _metal_checked,
        metal_kernel.unavailable_reason,
        metal_planning.prepare,
    ),
    "mlx": AttentionBackend("mlx", tiled_attention, lambda: None, _prepare_tiles),
}
AUTO_ORDER = ("metal", "mlx")


def resolve_backend(name: str = "auto") -> AttentionBackend:
    """The backend `paged_attention(..., backend=name)` would run. Raises on unknown or
    unavailable names; "auto" always resolves (the "mlx" backend runs everywhere)."""
    if name == "auto":
        return next(BACKENDS[n] for n in AUTO_ORDER if BACKENDS[n].unavailable_reason() is None)
    if name not in BACKENDS:
        known = ", ".join(ATTENTION_BACKENDS)
        raise ValueError(f"unknown paged-attention backend {name!r}; known: {known}")
    reason = BACKENDS[name].unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(
            f"paged-attention backend {name!r} can't run here: {reason}; "
            "use backend='mlx' or backend='auto'"
        )
    return BACKENDS[name]


class AttentionPlan:
    """One forward's paged attention, built once from host ints and called by every layer.

    `lengths`: each row's context length (tokens in its KV including its Lq queries), as
    Python ints; `block_tables` int32 `(B, max_blocks)` built from host ints. The checks that
    need shapes run on the first layer's call; the backend's host-side preparation (the tile
    plan of the "mlx" backend) too, and is reused by the other layers.

    `window`: a sliding-window layer group's W (`worker.attention.window`): each query sees
    its own position and the W - 1 before it, and only those keys are read. A group of layers
    with another window (or none) builds a plan of its own. Per layer, `sinks` (`(n_heads,)`
    logits, gpt-oss) add `exp(sink)` to each head's softmax denominator.
    """

    def __init__(
        self,
        backend: AttentionBackend,
        block_tables: mx.array,
        lengths: list[int],
        *,
        block_size: int,
        host_tables: list[list[int]] | None = None,
        prefix_kv: PrefixKV | None = None,
        window: int | None = None,
    ):
        check_window(window)
        self.window = window
        self.backend, self.block_tables, self.block_size = backend, block_tables, block_size
        self.lengths = lengths
        self.host_tables = host_tables  # each row's block ids, for plans that need them
        # the pool's kept prefixes (`PrefixKV`): lets a plan keep gathered K/V across forwards
        self.prefix_kv = prefix_kv
        self.context_lengths = mx.array(lengths, dtype=mx.int32)
        self.max_context = max(lengths) if lengths else 0
        self._prepared: dict | None = None

    def __call__(
        self,
        queries: mx.array,
        k_pool: mx.array,
        v_pool: mx.array,
        *,
        scale: float,
        sinks: mx.array | None = None,
    ) -> mx.array:
        if sinks is not None and sinks.shape != (queries.shape[1],):
            raise ValueError(
                f"sinks {sinks.shape}: expected one per query head, ({queries.shape[1]},)"
            )
        if self._prepared is None:
            _check_inputs(queries, k_pool, v_pool, self.block_tables, self.lengths, self.block_size)
            self._prepared = self.backend.prepare(
                lengths=self.lengths,
                num_queries=queries.shape[2],
                num_heads=queries.shape[1],
                k_pool=k_pool,
                block_size=self.block_size,
                block_tables=self.block_tables,
                context_lengths=self.context_lengths,
                host_tables=self.host_tables,
                prefix_kv=self.prefix_kv,
                window=self.window,
            )
        return self.backend.run(
            queries,
            k_pool,
            v_pool,
            self.block_tables,
            self.context_lengths,
            scale=scale,
            block_size=self.block_size,
            max_context=self.max_context,
            window=self.window,
            sinks=sinks,
            **self._prepared,
        )


def paged_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
    backend: str = "auto",
    window: int | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Causal attention of each sequence's last Lq positions over its paged K/V.

    queries `(B, n_heads, Lq, head_dim)`, RoPE applied; n_heads a multiple of num_kv_heads.
    block_tables int32 `(B, max_blocks)`, rows padded with any valid block id.
    context_lengths int32 `(B,)`: tokens in each sequence's KV *including* the Lq queries,
    whose K/V are already in the pools; query i sits at position `context_lengths[b] - Lq + i`.
    Returns `(B, n_heads, Lq, head_dim)` in the queries' dtype. `window`, `sinks`: as
    `AttentionPlan` takes them.

    A one-off call: it reads `context_lengths` on the host. A forward over many layers builds
    one `AttentionPlan` from host ints instead, which reads nothing from the device.
    """
    plan = AttentionPlan(
        resolve_backend(backend),
        block_tables,
        context_lengths.tolist(),
        block_size=block_size,
        window=window,
    )
    return plan(queries, k_pool, v_pool, scale=scale, sinks=sinks)


def slot_ids(
    block_tables: mx.array, start_positions: mx.array, num_tokens: int, block_size: int
) -> mx.array:
    """int32 `(B, num_tokens)`: the slots of positions `start_positions[b] + i`, i < num_tokens.

    For new tokens, `start_positions` is each sequence's length before them; the blocks that
    will hold them must already be in its block table.
    """
    positions = start_positions[:, None] + mx.arange(num_tokens, dtype=mx.int32)
    blocks = mx.take_along_axis(block_tables, positions // block_size, axis=1)
    return (blocks * block_size + positions % block_size).astype(mx.int32)


def write_kv(
    k_pool: mx.array, v_pool: mx.array, slots: mx.array, keys: mx.array, values: mx.array
) -> None:
    """Scatter new K/V into the pools at `slots`; mutates `k_pool` and `v_pool` in place.

    keys/values `(*slots.shape, num_kv_heads, head_dim)`: token-major, so K as an mlx-lm
    attention layer holds it, `(B, Hkv, Lq, D)`, goes in as `keys.swapaxes(1, 2)` with
    `slots` of shape `(B, Lq)`. Slots must be distinct.

    Cost: MLX rebinds each pool to a scatter of the old one, and reuses the old buffer in place
    when nothing else references it at evaluation; then a write costs O(written slots). Anything
    that still holds the old pool makes the scatter copy all of it: a kept view or slice of the
    pool, or values read from the same pool in the same graph (`k[dst] = k[src]`: evaluate
    `k[src]` first). `scripts/bench_attention.py --only scatter`, 30 layers, 32 slots per layer
    per step, eval per step: 4.1 / 4.2 / 4.2 ms per step for pools of 10k / 30k / 100k slots
    (flat: no copy); with a kept view 55 / 161 ms (~10 s at 100k), reading from the same pool
    59 / 102 ms (~3 s at 100k). Queuing the next step with `mx.async_eval` keeps it flat too.
    A quantized pool (`--kv-bits`, `worker.kv.quant.QuantizedKV`) quantizes what it is given.
    """
    k_pool[slots] = keys.astype(k_pool.dtype)
    v_pool[slots] = values.astype(v_pool.dtype)


def _check_inputs(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    lengths: list[int],
    block_size: int,
) -> None:
    """Raise ValueError naming the first shape or length that breaks the contract."""
    if queries.ndim != 4 or k_pool.ndim != 3 or k_pool.shape != v_pool.shape:
        raise ValueError(
            "expected queries (B, n_heads, Lq, D) and equal pools (slots, num_kv_heads, D), "
            f"got queries {queries.shape}, k_pool {k_pool.shape}, v_pool {v_pool.shape}"
        )
    batch, num_heads, num_queries, head_dim = queries.shape
    num_slots, num_kv_heads, pool_head_dim = k_pool.shape
    if batch < 1 or num_queries < 1:
        raise ValueError(f"queries {queries.shape} hold no sequence or no query")
    if head_dim != pool_head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"queries {queries.shape} don't fit pools {k_pool.shape}: head_dim must match and "
            "n_heads must be a multiple of num_kv_heads"
        )
    if num_slots % block_size:
        raise ValueError(f"pool of {num_slots} slots is not whole blocks of {block_size}")
    if block_tables.ndim != 2 or block_tables.shape[0] != batch or len(lengths) != batch:
        raise ValueError(
            f"block_tables {block_tables.shape} and context_lengths ({len(lengths)},) must "
            f"have batch size {batch}"
        )
    capacity = block_tables.shape[1] * block_size
    for b, length in enumerate(lengths):
        if not num_queries <= length <= capacity:
            raise ValueError(
                f"context_lengths[{b}] = {length}: must be >= Lq ({num_queries}) and <= the "
                f"block table's capacity ({capacity})"
            )
