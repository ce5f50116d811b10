"""Tiled attention, the "mlx" backend's default strategy: the batch cut into tiles whose
gathered K/V and scores stay near `DEFAULT_TILE_BYTES`, each tile attended by `gather_attention`
or `blockwise_attention` (`mlx_ops`), or, for one-query rows that share leading blocks, the
whole batch by `shared_prefix_attention`. The measurements behind the budget are in `mlx_ops`'s
docstring. A windowed plan (`worker.attention.window`) tiles the keys each row's window holds,
and never takes the shared-prefix plan: a row reads at most `W + Lq - 1` keys there, and what
its window leaves of a prefix others share is soon nothing."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from worker.attention.mlx_ops import (
    GatherInputs,
    blockwise_attention,
    gather_attention,
    gather_inputs,
)
from worker.attention.prefix_kv import PrefixKV
from worker.attention.shared_prefix import (
    SharedPrefixPlan,
    plan_shared_prefixes,
    shared_prefix_attention,
)
from worker.attention.window import window_width

DEFAULT_TILE_BYTES = 8 << 20  # tuned in mlx_ops's docstring


class TilePlan(NamedTuple):
    """How `tiled_attention` cuts a batch: groups of batch rows (longest context first), each
    attended `key_steps[i]` keys at a time: its whole context, or whole blocks at a time."""

    groups: list[list[int]]
    key_steps: list[int]


def plan_tiles(lengths: list[int], *, key_bytes: int, block_size: int, budget: int) -> TilePlan:
    """Cut the batch into tiles whose working set stays near `budget` bytes.

    `key_bytes`: what one key of one sequence costs, its gathered K and V plus the float32
    scores of all its query rows. Rows are grouped longest first while the group, padded to
    its longest member, fits the budget, so a group also pads its members to similar lengths.
    A group whose context overflows the budget (one long sequence, or a long prefill chunk)
    walks its keys in budget-sized steps instead.
    """
    groups: list[list[int]] = []
    for row in sorted(range(len(lengths)), key=lambda b: -lengths[b]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] * key_bytes <= budget:
            groups[-1].append(row)
        else:
            groups.append([row])
    # Only a group of one can overflow the budget; it steps by whole blocks.
    overflow_step = max(1, budget // key_bytes // block_size) * block_size
    key_steps = [
        lengths[g[0]]
        if len(g) * lengths[g[0]] * key_bytes <= budget
        else min(lengths[g[0]], overflow_step)
        for g in groups
    ]
    return TilePlan(groups, key_steps)


class PreparedTiles(NamedTuple):
    """A `TilePlan` with its device index arrays, built once per forward from host ints."""

    plan: TilePlan
    lengths: list[int]  # keys each row reads: its context, or what its window holds
    picked: list[mx.array] | None  # per group, its batch rows; None: one group, the whole batch
    back: mx.array | None  # undoes the grouping order
    gathers: list[GatherInputs | None]  # per group that fits in one gather, its inputs
    # one-query rows that share leading blocks: attended prefix once per group (else None)
    shared: SharedPrefixPlan | None = None
    window: int | None = None  # the sliding window the plan was made for


def prepare_tiles(
    lengths: list[int],
    num_queries: int,
    num_heads: int,
    k_pool: mx.array,
    block_size: int,
    tile_bytes: int = DEFAULT_TILE_BYTES,
    block_tables: mx.array | None = None,
    context_lengths: mx.array | None = None,
    host_tables: list[list[int]] | None = None,
    prefix_kv: PrefixKV | None = None,
    window: int | None = None,
) -> PreparedTiles:
    """The tile plan of a batch whose context lengths are `lengths` (host ints); with the
    batch's `block_tables` and `context_lengths`, each gather group's rows and mask too; with
    its block ids on the host (`host_tables`) and one query per row, the shared-prefix plan
    when one pays (`plan_shared_prefixes`), its prefixes' K/V kept across ticks where the
    pool's `prefix_kv` comes too (which first forgets the blocks this forward writes). With a
    `window`, each row's keys are those its window holds (`window_width`), and the
    shared-prefix plan is not taken."""
    if host_tables is not None and prefix_kv is not None:
        prefix_kv.forget_written(host_tables, lengths, num_queries, block_size)
    if window is not None:
        lengths = [window_width(n, num_queries, window) for n in lengths]
    elif host_tables is not None and num_queries == 1:
        shared = plan_shared_prefixes(host_tables, lengths, block_size, k_pool.shape[1], prefix_kv)
        if shared is not None:
            return PreparedTiles(TilePlan([], []), lengths, None, None, [], shared)
    kv_bytes = 2 * k_pool.shape[1] * k_pool.shape[2] * k_pool.itemsize
    plan = plan_tiles(
        lengths,
        key_bytes=kv_bytes + num_heads * num_queries * 4 * 2,
        block_size=block_size,
        budget=tile_bytes,
    )
    picked = back = None
    if len(plan.groups) > 1:
        picked = [mx.array(rows, dtype=mx.int32) for rows in plan.groups]
        order = [row for rows in plan.groups for row in rows]
        back = mx.array(sorted(range(len(lengths)), key=order.__getitem__), dtype=mx.int32)
    gathers: list[GatherInputs | None] = [None] * len(plan.groups)
    if block_tables is not None and context_lengths is not None:
        for i, (rows, key_step) in enumerate(zip(plan.groups, plan.key_steps, strict=True)):
            if key_step >= lengths[rows[0]]:
                tables, lens = block_tables, context_lengths
                if picked is not None:
                    tables, lens = block_tables[picked[i]], context_lengths[picked[i]]
                gathers[i] = gather_inputs(
                    tables,
                    lens,
                    k_pool.shape[1],
                    num_queries,
                    max_context=lengths[rows[0]],
                    block_size=block_size,
                    window=window,
                )
    return PreparedTiles(plan, lengths, picked, back, gathers, window=window)


def tiled_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
    max_context: int,
    tile_bytes: int = DEFAULT_TILE_BYTES,
    tiles: PreparedTiles | None = None,
    window: int | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Attention tile by tile (see `plan_tiles`), so each tile's K/V and scores stay in cache:
    `gather_attention` for a group whose context fits, `blockwise_attention` for one that
    does not. (`max_context` is unused: each group's own longest context sizes its work.)

    `tiles`: the plan from `prepare_tiles`; without it, one is made here, which reads
    `context_lengths` on the host. `window` (what `tiles` was made for, when given) and
    `sinks`: see `worker.attention.window`."""
    if tiles is None:
        tiles = prepare_tiles(
            context_lengths.tolist(),
            queries.shape[2],
            queries.shape[1],
            k_pool,
            block_size,
            tile_bytes,
            window=window,
        )
    if tiles.window != window:
        raise ValueError(f"tiles planned for window {tiles.window}, called with {window}")
    if tiles.shared is not None:
        return shared_prefix_attention(
            queries, k_pool, v_pool, tiles.shared, scale=scale, sinks=sinks
        )
    plan = tiles.plan
    outputs = []
    for i, (rows, key_step) in enumerate(zip(plan.groups, plan.key_steps, strict=True)):
        if tiles.picked is None:
            q, tables, lens = queries, block_tables, context_lengths
        else:
            picked = tiles.picked[i]
            q, tables, lens = queries[picked], block_tables[picked], context_lengths[picked]
        longest = tiles.lengths[rows[0]]
        common = dict(
            scale=scale, block_size=block_size, max_context=longest, window=window, sinks=sinks
        )
        if key_step >= longest:
            outputs.append(
                gather_attention(q, k_pool, v_pool, tables, lens, inputs=tiles.gathers[i], **common)
            )
        else:
            steps = key_step // block_size
            outputs.append(
                blockwise_attention(
                    q, k_pool, v_pool, tables, lens, blocks_per_step=steps, **common
                )
            )
    if tiles.picked is None:
        return outputs[0]
    return mx.concatenate(outputs)[tiles.back]
