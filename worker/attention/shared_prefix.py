"""Shared-prefix attention for one-query rows: rows that share leading blocks (decode rows of
one tenant, a MIXED step's one-token rows of one prompt) gather that prefix once per group and
attend it in one matmul; each row's own keys after it are attended apart, and the two parts
are merged exactly. 10 decode rows over 4 tenants' 512-token prefixes: 2.0 vs 3.3 ms per layer
(`scripts/bench_attention.py --only shared`)."""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

from worker.attention.mlx_ops import (
    context_slot_table,
    key_scores,
    queries_by_kv_head,
    queries_layout,
    weighted_rows,
)


class SharedPrefixPlan(NamedTuple):
    """One-query rows grouped by the leading blocks they share (`plan_shared_prefixes`)."""

    prefixes: list[tuple[mx.array, mx.array]]  # per group: its rows (m,), prefix rows (Hkv, P)
    back: mx.array  # undoes the grouping order of the rows
    suffix_rows: mx.array  # (Hkv, B, S) pool rows of each row's keys after its prefix
    suffix_visible: mx.array  # (B, S) bool: which of them are real


SHARED_PREFIX_MIN_SAVING = 1.5  # gathered keys, plain / shared-prefix, for the plan to pay


def group_rows(
    tables: list[list[int]], lengths: list[int], block_size: int
) -> tuple[list[tuple[list[int], int]], list[int], int, int]:
    """How `plan_shared_prefixes` groups one-query rows, from host ints only: (groups, starts,
    plain, cascade). Groups are (rows, shared whole blocks); `starts[r]` where row r's own
    keys begin; `plain` the keys a per-row gather reads, `cascade` the keys the shared-prefix
    plan reads (each group's prefix once, then every row's suffix padded to the widest)."""
    by_first: dict[int, list[int]] = {}
    for row, blocks in enumerate(tables):
        by_first.setdefault(blocks[0] if lengths[row] > block_size else -1 - row, []).append(row)
    groups, starts = [], [0] * len(tables)
    for rows in by_first.values():
        shared = 0
        if len(rows) > 1:
            first = tables[rows[0]]
            limit = min(lengths[r] - 1 for r in rows) // block_size  # keep each row's own key
            distinct = {id(tables[r]): tables[r] for r in rows}.values()  # a sequence's rows
            while shared < limit and all(t[shared] == first[shared] for t in distinct):
                shared += 1
        groups.append((rows, shared))
        for r in rows:
            starts[r] = shared * block_size
    widest = max((n - s for n, s in zip(lengths, starts, strict=True)), default=0)
    cascade = sum(shared * block_size for _, shared in groups) + len(lengths) * widest
    return groups, starts, sum(lengths), cascade


def gathered_keys(tables: list[list[int]], lengths: list[int], block_size: int) -> int:
    """Keys (per layer) that one-query rows over these block tables and context lengths
    gather: the shared-prefix plan's when it pays (`plan_shared_prefixes`), else every row's
    whole context. Host ints only: the scheduler prices folding prefill rows with it."""
    if not lengths:
        return 0
    _, _, plain, cascade = group_rows(tables, lengths, block_size)
    return plain if cascade * SHARED_PREFIX_MIN_SAVING > plain else cascade


def plan_shared_prefixes(
    tables: list[list[int]], lengths: list[int], block_size: int, num_kv_heads: int
) -> SharedPrefixPlan | None:
    """Group one-query rows (decode rows, a MIXED step's one-token rows) by their first block;
    a group's prefix is the whole blocks all its rows share and all their queries see (every
    row keeps at least its own key after it). Each prefix is then gathered once for its group
    instead of once per row. None when that would not cut the gathered keys by
    `SHARED_PREFIX_MIN_SAVING` (no sharing: the tiled plan does better)."""
    groups, starts, plain, cascade = group_rows(tables, lengths, block_size)
    if cascade * SHARED_PREFIX_MIN_SAVING > plain:
        return None
    suffix = [n - s for n, s in zip(lengths, starts, strict=True)]
    heads = mx.arange(num_kv_heads, dtype=mx.int32)
    width = max(suffix)
    # Each row's blocks from its prefix's end (a block boundary) on, padded with block 0 (its
    # slots past the row's suffix are masked): the host handles block ids, not token slots.
    tails = [tables[r][s // block_size :] for r, s in enumerate(starts)]
    tail_blocks = -(-width // block_size)
    tails = [t[:tail_blocks] + [0] * (tail_blocks - len(t)) for t in tails]
    suffix_slots = context_slot_table(mx.array(tails, dtype=mx.int32), width, block_size)
    prefixes = []
    for rows, shared in groups:
        prefix = mx.array([tables[rows[0]][:shared]], dtype=mx.int32).reshape(1, shared)
        slots = context_slot_table(prefix, shared * block_size, block_size)  # (1, P)
        prefixes.append((mx.array(rows, dtype=mx.int32), slots * num_kv_heads + heads[:, None]))
    order = [r for rows, _ in groups for r in rows]
    return SharedPrefixPlan(
        prefixes,
        mx.array(sorted(range(len(order)), key=order.__getitem__), dtype=mx.int32),
        suffix_slots[None] * num_kv_heads + heads[:, None, None],
        mx.arange(width)[None] < mx.array(suffix, dtype=mx.int32)[:, None],
    )


def shared_prefix_attention(
    queries: mx.array, k_pool: mx.array, v_pool: mx.array, plan: SharedPrefixPlan, *, scale: float
) -> mx.array:
    """One-query rows over their context in two parts merged exactly (online softmax): each
    group's shared prefix, gathered once and attended by all the group's queries in one
    matmul, and each row's own keys after it. A group without a prefix (one row, or nothing
    shared) has an empty prefix part."""
    num_kv_heads, head_dim = k_pool.shape[1:]
    q = queries_by_kv_head(queries, num_kv_heads, scale)  # (Hkv, B, g, D)
    per_kv = q.shape[2]
    scores = key_scores(q, k_pool, plan.suffix_rows).astype(mx.float32)
    scores = mx.where(plan.suffix_visible[None, :, None, :], scores, -mx.inf)
    suffix_max = scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores - suffix_max)
    suffix_sum = weights.sum(axis=-1, keepdims=True)
    suffix_out = weighted_rows(weights, v_pool, plan.suffix_rows)
    maxes, sums, outs = [], [], []
    for rows, prefix_rows in plan.prefixes:
        m = rows.shape[0]
        if prefix_rows.shape[1] == 0:  # nothing shared: the suffix is the whole context
            maxes.append(mx.full((num_kv_heads, m, per_kv, 1), -mx.inf, dtype=mx.float32))
            sums.append(mx.zeros((num_kv_heads, m, per_kv, 1), dtype=mx.float32))
            outs.append(mx.zeros((num_kv_heads, m, per_kv, head_dim), dtype=suffix_out.dtype))
            continue
        group_q = q[:, rows].reshape(num_kv_heads, m * per_kv, head_dim)
        s = key_scores(group_q, k_pool, prefix_rows).astype(mx.float32)
        s_max = s.max(axis=-1, keepdims=True)
        w = mx.power(2.0, s - s_max)
        maxes.append(s_max.reshape(num_kv_heads, m, per_kv, 1))
        sums.append(w.sum(axis=-1, keepdims=True).reshape(num_kv_heads, m, per_kv, 1))
        out = weighted_rows(w, v_pool, prefix_rows)
        outs.append(out.reshape(num_kv_heads, m, per_kv, head_dim))
    prefix_max = mx.concatenate(maxes, axis=1)[:, plan.back]
    prefix_sum = mx.concatenate(sums, axis=1)[:, plan.back]
    prefix_out = mx.concatenate(outs, axis=1)[:, plan.back]
    top = mx.maximum(prefix_max, suffix_max)  # finite: every row has its own key
    a, b = mx.power(2.0, prefix_max - top), mx.power(2.0, suffix_max - top)
    out = (prefix_out * a + suffix_out * b) / (prefix_sum * a + suffix_sum * b)
    return queries_layout(out, queries)
