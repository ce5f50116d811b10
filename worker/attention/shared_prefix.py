"""Shared-prefix attention for one-query rows: rows that share leading blocks (decode rows of
one tenant, a MIXED step's one-token rows of one prompt) read that prefix once per group; each
row's own keys after it are attended apart, and the two parts are merged exactly.

Groups come from a trie over the rows' block ids (`prefix_kv.group_rows`: the deepest shared
run, or a shallower one where that reads fewer blocks), and every group is attended in ONE
batched op per layer: the groups' members padded to a common count and their prefixes to a
common length (masked), so a layer costs the same ~50 MLX ops with 1 group as with 16. With
the pool's block versions the gathered prefixes are kept across ticks (in the pool's
`prefix_kv.PrefixKV`), so a steady decode batch gathers only the rows' suffixes, and a group
that changes re-gathers only its own prefix. Rows that share nothing are attended apart by
the plain gather (then merged back in batch order), so one lone row no longer turns the plan
off for the batch."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from worker.attention.exp2 import exp2_shifted
from worker.attention.mlx_ops import (
    QUANTIZED_MATMUL_MAX_ROWS,
    GatherInputs,
    attend_gathered,
    context_slot_table,
    gather_inputs,
    key_scores,
    queries_by_kv_head,
    queries_layout,
    weighted_rows,
)
from worker.attention.prefix_kv import KeptPrefixes, PrefixKV, group_rows
from worker.attention.window import sink_rows


class SharedPrefixPlan(NamedTuple):
    """One-query rows grouped by the leading blocks they share (`plan_shared_prefixes`). The
    group fields index the grouped rows (`rows` of the batch, in order); the batch's other
    rows are attended by the plain gather (`loose`)."""

    members: mx.array  # (G * M,) grouped row in each group's member slot (padding: a member)
    group_size: int  # M, members per group after padding
    prefix_rows: mx.array  # (Hkv, G, P) pool rows of each group's prefix, padded
    prefix_visible: mx.array | None  # (G, 1, P) bool; None: every prefix is P keys long
    back: mx.array  # (R,) each grouped row's member slot
    suffix_rows: mx.array  # (Hkv, R, S) pool rows of each grouped row's keys after its prefix
    suffix_visible: mx.array  # (R, S) bool: which of them are real
    depths: list[int]  # each group's prefix, in blocks
    kept: KeptPrefixes | None = None  # the prefixes' K/V kept across ticks, in `store`
    store: PrefixKV | None = None  # the pool's kept prefixes (its runner's)
    rows: mx.array | None = None  # (R,) the grouped batch rows; None: every row, in order
    loose: tuple[mx.array, GatherInputs] | None = None  # the other rows, their gather
    order: mx.array | None = None  # (B,) each batch row's place in grouped + loose outputs


SHARED_PREFIX_MIN_SAVING = 1.5  # gathered keys, plain / shared-prefix, for the plan to pay


def _cascade(
    groups: list[tuple[list[int], int]], lengths: list[int], block_size: int
) -> tuple[dict[int, int], int, int]:
    """Where each grouped row's own keys begin, the keys the shared-prefix plan reads for the
    grouped rows (each group's prefix once, then every grouped row's suffix padded to the
    widest), and the keys they would read on their own."""
    starts = {r: depth * block_size for rows, depth in groups for r in rows}
    widest = max((lengths[r] - s for r, s in starts.items()), default=0)
    shared = sum(depth * block_size for _, depth in groups) + len(starts) * widest
    return starts, shared, sum(lengths[r] for r in starts)


def _groups(
    tables: list[list[int]], lengths: list[int], block_size: int
) -> list[tuple[list[int], int]]:
    """`group_rows`' groups, and a group of one for each row in none whose own leading blocks,
    cut at the deepest group's depth, leave it a suffix at most a block wider than the grouped
    rows' widest: its prefix is then kept across ticks like a group's (and pads nothing),
    where the plain gather would read its whole context every tick."""
    groups = group_rows(tables, lengths, block_size)
    if not groups:
        return groups
    deepest = max(depth for _, depth in groups)
    widest = max(lengths[r] - depth * block_size for rows, depth in groups for r in rows)
    grouped = {r for rows, _ in groups for r in rows}
    for r, n in enumerate(lengths):
        depth = min((n - 1) // block_size, deepest)
        if r not in grouped and depth and n - depth * block_size <= widest + block_size:
            groups.append(([r], depth))
    return groups


def _pays(groups, lengths: list[int], block_size: int) -> tuple[dict[int, int], int] | None:
    """The grouped rows' starts and the keys the whole batch then gathers (the rows in no
    group their whole context), or None where sharing would not cut the grouped rows' keys by
    `SHARED_PREFIX_MIN_SAVING`."""
    starts, shared, plain = _cascade(groups, lengths, block_size)
    if not groups or shared * SHARED_PREFIX_MIN_SAVING > plain:
        return None
    return starts, shared + sum(lengths) - plain


def gathered_keys(tables: list[list[int]], lengths: list[int], block_size: int) -> int:
    """Keys (per layer) that one-query rows over these block tables and context lengths
    gather: the shared-prefix plan's when it pays (`plan_shared_prefixes`), else every row's
    whole context. Host ints only: the scheduler prices folding prefill rows with it (kept
    prefixes, read from the last tick's gather, are priced as gathered: conservative)."""
    if not lengths:
        return 0
    pays = _pays(_groups(tables, lengths, block_size), lengths, block_size)
    return sum(lengths) if pays is None else pays[1]


def plan_shared_prefixes(
    tables: list[list[int]],
    lengths: list[int],
    block_size: int,
    num_kv_heads: int,
    store: PrefixKV | None = None,
) -> SharedPrefixPlan | None:
    """Group one-query rows (decode rows, a MIXED step's one-token rows) by the whole blocks
    they share (`_groups`); each group's prefix is then read once for its rows, and the
    rows in no group are gathered on their own. None when that would not cut the grouped
    rows' gathered keys by `SHARED_PREFIX_MIN_SAVING` (the tiled plan does better).
    `store` (the pool's `PrefixKV`): keep the prefixes' K/V across ticks there."""
    groups = _groups(tables, lengths, block_size)
    pays = _pays(groups, lengths, block_size)
    if pays is None:
        return None
    starts = pays[0]
    grouped = sorted(starts)
    local = {r: i for i, r in enumerate(grouped)}
    suffix = [lengths[r] - starts[r] for r in grouped]
    groups.sort(key=lambda g: tables[g[0][0]][: g[1]])  # the same order tick after tick
    heads = mx.arange(num_kv_heads, dtype=mx.int32)
    width = max(suffix)
    # Each row's blocks from its prefix's end (a block boundary) on, padded with block 0 (its
    # slots past the row's suffix are masked): the host handles block ids, not token slots.
    tails = [tables[r][starts[r] // block_size :] for r in grouped]
    tail_blocks = -(-width // block_size)
    tails = [t[:tail_blocks] + [0] * (tail_blocks - len(t)) for t in tails]
    suffix_slots = context_slot_table(mx.array(tails, dtype=mx.int32), width, block_size)
    size, depths = max(len(rows) for rows, _ in groups), [d for _, d in groups]
    members, back = [], [0] * len(grouped)
    for g, (rows, _) in enumerate(groups):
        for j, r in enumerate(rows):
            back[local[r]] = g * size + j
        members += [local[r] for r in rows] + [local[rows[0]]] * (size - len(rows))
    deepest = max(depths)
    prefixes = [tables[rows[0]][:d] for rows, d in groups]
    padded = [p + [p[0]] * (deepest - len(p)) for p in prefixes]
    slots = context_slot_table(mx.array(padded, dtype=mx.int32), deepest * block_size, block_size)
    visible = None
    if min(depths) < deepest:
        keys = mx.arange(deepest * block_size, dtype=mx.int32)
        visible = (keys[None] < mx.array(depths, dtype=mx.int32)[:, None] * block_size)[:, None]
    kept = None
    if store is not None:
        kept = store.kept(prefixes, block_size, num_kv_heads)
    loose = [r for r in range(len(lengths)) if r not in local]
    rows = loose_plan = order = None
    if loose:
        rows = mx.array(grouped, dtype=mx.int32)
        loose_plan = (
            mx.array(loose, dtype=mx.int32),
            _loose_inputs(
                [tables[r] for r in loose], [lengths[r] for r in loose], block_size, num_kv_heads
            ),
        )
        place = {r: i for i, r in enumerate(grouped + loose)}
        order = mx.array([place[r] for r in range(len(lengths))], dtype=mx.int32)
    return SharedPrefixPlan(
        mx.array(members, dtype=mx.int32),
        size,
        slots[None] * num_kv_heads + heads[:, None, None],
        visible,
        mx.array(back, dtype=mx.int32),
        suffix_slots[None] * num_kv_heads + heads[:, None, None],
        mx.arange(width)[None] < mx.array(suffix, dtype=mx.int32)[:, None],
        depths,
        kept,
        store,
        rows,
        loose_plan,
        order,
    )


def _loose_inputs(
    tables: list[list[int]], lengths: list[int], block_size: int, num_kv_heads: int
) -> GatherInputs:
    """The plain gather's rows and mask for rows that share no prefix (one query each)."""
    longest = max(lengths)
    blocks = -(-longest // block_size)
    padded = [t[:blocks] + [0] * (blocks - len(t[:blocks])) for t in tables]
    return gather_inputs(
        mx.array(padded, dtype=mx.int32),
        mx.array(lengths, dtype=mx.int32),
        num_kv_heads,
        1,
        max_context=longest,
        block_size=block_size,
    )


def shared_prefix_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    plan: SharedPrefixPlan,
    *,
    scale: float,
    sinks: mx.array | None = None,
) -> mx.array:
    """One-query rows over their context in two parts merged exactly (online softmax): every
    group's shared prefix, attended by all its members' queries in one batched matmul over all
    groups, and each row's own keys after it. Rows in no group: the plain gather. `sinks`
    (`worker.attention.window`) join the merge of the two parts, once. No sliding window: a
    windowed plan never takes this one (`worker.attention.tiles`)."""
    if plan.rows is None:
        return _grouped_attention(queries, k_pool, v_pool, plan, scale, sinks)
    picked, inputs = plan.loose
    grouped = _grouped_attention(queries[plan.rows], k_pool, v_pool, plan, scale, sinks)
    loose = attend_gathered(queries[picked], k_pool, v_pool, inputs, scale, sinks=sinks)
    return mx.concatenate([grouped, loose])[plan.order]


def _grouped_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    plan: SharedPrefixPlan,
    scale: float,
    sinks: mx.array | None,
) -> mx.array:
    num_kv_heads, head_dim = k_pool.shape[1:]
    q = queries_by_kv_head(queries, num_kv_heads, scale)  # (Hkv, R, g, D)
    per_kv = q.shape[2]
    scores = key_scores(q, k_pool, plan.suffix_rows).astype(mx.float32)
    scores = mx.where(plan.suffix_visible[None, :, None, :], scores, -mx.inf)
    suffix_max = scores.max(axis=-1, keepdims=True)
    weights = exp2_shifted(scores, suffix_max)
    suffix_sum = weights.sum(axis=-1, keepdims=True)
    suffix_out = weighted_rows(weights, v_pool, plan.suffix_rows)
    # every group's prefix at once: (Hkv, G, M * g, D) queries over (Hkv, G, P, D) keys
    groups, size = plan.prefix_rows.shape[1], plan.group_size
    group_q = q[:, plan.members].reshape(num_kv_heads, groups, size * per_kv, head_dim)
    s = _prefix_scores(group_q, k_pool, _prefix_kv(k_pool, plan)).astype(mx.float32)
    if plan.prefix_visible is not None:
        s = mx.where(plan.prefix_visible, s, -mx.inf)
    s_max = s.max(axis=-1, keepdims=True)  # finite: a prefix holds at least one block
    w = exp2_shifted(s, s_max)
    out = _prefix_values(w, v_pool, _prefix_kv(v_pool, plan))

    def by_row(x: mx.array) -> mx.array:  # member slots -> grouped rows
        return x.reshape(num_kv_heads, groups * size, per_kv, x.shape[-1])[:, plan.back]

    prefix_max, prefix_sum = by_row(s_max), by_row(w.sum(axis=-1, keepdims=True))
    prefix_out = by_row(out)
    top = mx.maximum(prefix_max, suffix_max)  # finite: every row has its own key
    if sinks is not None:  # the sink's term, once, in this final merge
        top = mx.maximum(top, sink_rows(sinks, num_kv_heads, 1))
    a, b = mx.power(2.0, prefix_max - top), mx.power(2.0, suffix_max - top)
    total = prefix_sum * a + suffix_sum * b
    if sinks is not None:
        total = total + mx.power(2.0, sink_rows(sinks, num_kv_heads, 1) - top)
    out = (prefix_out * a + suffix_out * b) / total
    return queries_layout(out, queries)


def _prefix_kv(pool, plan: SharedPrefixPlan):
    """The groups' prefix rows of `pool` (packed, for a quantized pool), kept across ticks
    in `plan.store` when it has one."""
    if plan.kept is not None:
        return plan.store.get(plan.kept, pool, plan.prefix_rows.shape[-1])
    if hasattr(pool, "gather"):
        return tuple(pool.gather(plan.prefix_rows))
    return pool.reshape(-1, pool.shape[-1])[plan.prefix_rows]


def _dequantized(pool, packed: tuple) -> mx.array:
    return mx.dequantize(*packed, group_size=pool.group_size, bits=pool.bits).astype(pool.dtype)


def _prefix_scores(q: mx.array, k_pool, keys) -> mx.array:
    """As `mlx_ops.key_scores`, over prefix keys already gathered."""
    if isinstance(keys, tuple):
        if q.shape[-2] <= QUANTIZED_MATMUL_MAX_ROWS:
            return mx.quantized_matmul(
                q, *keys, transpose=True, group_size=k_pool.group_size, bits=k_pool.bits
            )
        keys = _dequantized(k_pool, keys)
    return q @ keys.swapaxes(-1, -2)


def _prefix_values(weights: mx.array, v_pool, values) -> mx.array:
    """As `mlx_ops.weighted_rows`, over prefix values already gathered."""
    weights = weights.astype(v_pool.dtype)
    if isinstance(values, tuple):
        if weights.shape[-2] <= QUANTIZED_MATMUL_MAX_ROWS:
            return mx.quantized_matmul(
                weights,
                *values,
                transpose=False,
                group_size=v_pool.group_size,
                bits=v_pool.bits,
            )
        values = _dequantized(v_pool, values)
    return weights @ values
