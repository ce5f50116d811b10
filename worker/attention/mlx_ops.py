"""The "mlx" paged-attention backend: MLX ops only, so it runs on any device.

Strategies (all exact; they differ in speed only):

- `tiled_attention` (the default): the batch cut into tiles whose gathered K/V and scores stay
  near `DEFAULT_TILE_BYTES` (8 MB, cache-sized): rows grouped longest-first (so a group pads
  only to its own longest member), each group by `gather_attention`, or by
  `blockwise_attention` in budget-sized key steps when one sequence's context overflows.
- `gather_attention`: one gather of every sequence's context by slot id (exactly `max_context`
  tokens, however wide the block table), then one masked attention over the padded batch.
- `blockwise_attention`: walks the context `blocks_per_step` blocks at a time with a running
  max and sum (online softmax); ~12 small ops per step.
- `shared_prefix_attention` (taken by the tiled plan for one-query rows when it cuts the
  gathered keys 1.5x): rows that share leading blocks (decode rows of one tenant, a MIXED
  step's one-token rows of one prompt) gather that prefix once per group and attend it in one
  matmul; each row's own keys after it are attended apart, and the two parts are merged
  exactly. 10 decode rows over 4 tenants' 512-token prefixes: 2.0 vs 3.3 ms per layer.

Measured with `scripts/bench_attention.py` (one run; float32, 9 heads, 3 KV heads, head dim 64,
block size 32, shuffled block ids; 2-core x86-64 CPU shared with other jobs, OpenBLAS
preloaded, OPENBLAS_NUM_THREADS=1; the contenders take turns, but under the neighbours' load
a row can move up to 2x from run to run, so compare within a row), ms per call:

    case                          dense SDPA  tiled  gather  blockwise  blockwise x8
    decode B=1, ctx 1000                0.55   0.74    0.65        5.9           1.4
    decode B=8, ctx 142..891            3.7    4.0     4.4        10.0           5.1
    decode B=32, ctx 130..998          17.2   20.4    53.5        27.6          26.5
    decode B=32, ctx 1024              18.5   31.7    34.4        32.9          31.0
    decode B=4, ctx 8192               18.5   32.6    35.0       156.8          47.4
    prefill Lq=256, ctx 1280           55.1   36.5    35.3        49.2          36.2
    prefill Lq=256, ctx 4352          215.4  123.7   150.3       167.0         125.6

Tiled wins or ties everywhere: 2.6x over untiled gather on the mixed B=32 batch (1.3x in a
quiet CPU-time measurement; more under load, when neighbours share the 32 MB L3 and 50 MB of
gathered K/V does not fit), 1.2x on the long prefill chunk, within noise elsewhere. Blockwise
pays ~12 ops per step: up to 11x slower at one block per step; at 8 blocks per step it ties
where steps are large (B=32, prefill) and loses at B=1-8. Against dense SDPA over K/V that is
already contiguous (no gather at all), tiled costs 1.1-1.8x at decode and 0.6x at prefill
(below). In `--tile-sweep` runs 4 and 8 MB budgets were within noise of each other; 2 MB lost
on the prefill chunk, 16 MB on the mixed B=32 batch. The budget is tuned for CPU caches; it is
not measured on a GPU.

Layout: everything runs KV-head-major, `(num_kv_heads, B, tokens, head_dim)`, gathered as rows
of the pool viewed as `(slots * num_kv_heads, head_dim)` (`gather_by_kv_head`), so every matmul
operand is contiguous. Slot-major K/V transposed into SDPA was several times slower here (30 vs
5 ms at B=8) because each use copied it. GQA rides along: the `n_heads // num_kv_heads` query
heads of one KV head are extra query rows of one matmul.

Softmax runs in base 2 (scores pre-multiplied by log2(e), `2**x` instead of `exp(x)`): MLX's CPU
`exp` managed ~70M elements/s here against ~180M for `power(2, x)`, and exponentials are most
of the cost of a prefill chunk; that is why all strategies beat dense SDPA there.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mlx.core as mx

LOG2_E = 1.0 / math.log(2.0)
DEFAULT_TILE_BYTES = 8 << 20  # tuned in the module docstring


def gather_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
    max_context: int,
    inputs: GatherInputs | None = None,
) -> mx.array:
    """Gather each sequence's first `max_context` K/V slots, then attend once, masked.

    `max_context` is the longest context in the batch: the gather never reads the padding of a
    block table wider than that, and never rounds it up to a whole block either.
    `inputs`: the gather rows and mask from `gather_inputs`, made once per forward and shared
    by its layers (else made here).
    """
    if inputs is None:
        inputs = gather_inputs(
            block_tables, context_lengths, k_pool.shape[1], queries.shape[2],
            max_context=max_context, block_size=block_size,
        )  # fmt: skip
    keys, values = _gather_rows(k_pool, inputs.rows), _gather_rows(v_pool, inputs.rows)
    q = _queries_by_kv_head(queries, k_pool.shape[1], scale)
    scores = _apply_mask(q @ keys.swapaxes(-1, -2), inputs.visible, queries.shape[2])
    row_max = scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores - row_max)
    out = _weighted_values(weights, values) / weights.sum(axis=-1).reshape(*q.shape[:3], 1)
    return _queries_layout(out, queries)


class GatherInputs(NamedTuple):
    """What `gather_attention` needs besides the pools and queries; the same for every layer."""

    rows: mx.array  # (Hkv, B, n) rows of a pool viewed as (slots * Hkv, D)
    visible: mx.array  # (B, 1, Lq, n) bool: causality and lengths


def gather_inputs(
    block_tables: mx.array,
    context_lengths: mx.array,
    num_kv_heads: int,
    num_queries: int,
    *,
    max_context: int,
    block_size: int,
) -> GatherInputs:
    slots = context_slot_table(block_tables, max_context, block_size)
    heads = mx.arange(num_kv_heads, dtype=mx.int32)[:, None, None]
    query_pos = context_lengths[:, None] - num_queries + mx.arange(num_queries, dtype=mx.int32)
    key_pos = mx.arange(max_context, dtype=mx.int32)
    visible = key_pos <= query_pos[:, :, None]  # (B, Lq, keys)
    return GatherInputs(slots[None] * num_kv_heads + heads, visible[:, None])


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
    lengths: list[int]
    picked: list[mx.array] | None  # per group, its batch rows; None: one group, the whole batch
    back: mx.array | None  # undoes the grouping order
    gathers: list[GatherInputs | None]  # per group that fits in one gather, its inputs
    # one-query rows that share leading blocks: attended prefix once per group (else None)
    shared: SharedPrefixPlan | None = None


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
) -> PreparedTiles:
    """The tile plan of a batch whose context lengths are `lengths` (host ints); with the
    batch's `block_tables` and `context_lengths`, each gather group's rows and mask too; with
    its block ids on the host (`host_tables`) and one query per row, the shared-prefix plan
    when one pays (`plan_shared_prefixes`)."""
    if host_tables is not None and num_queries == 1:
        shared = plan_shared_prefixes(host_tables, lengths, block_size, k_pool.shape[1])
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
                    tables, lens, k_pool.shape[1], num_queries,
                    max_context=lengths[rows[0]], block_size=block_size,
                )  # fmt: skip
    return PreparedTiles(plan, lengths, picked, back, gathers)


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
) -> mx.array:
    """Attention tile by tile (see `plan_tiles`), so each tile's K/V and scores stay in cache:
    `gather_attention` for a group whose context fits, `blockwise_attention` for one that
    does not. (`max_context` is unused: each group's own longest context sizes its work.)

    `tiles`: the plan from `prepare_tiles`; without it, one is made here, which reads
    `context_lengths` on the host."""
    if tiles is None:
        tiles = prepare_tiles(
            context_lengths.tolist(),
            queries.shape[2],
            queries.shape[1],
            k_pool,
            block_size,
            tile_bytes,
        )
    if tiles.shared is not None:
        return shared_prefix_attention(queries, k_pool, v_pool, tiles.shared, scale=scale)
    plan = tiles.plan
    outputs = []
    for i, (rows, key_step) in enumerate(zip(plan.groups, plan.key_steps, strict=True)):
        if tiles.picked is None:
            q, tables, lens = queries, block_tables, context_lengths
        else:
            picked = tiles.picked[i]
            q, tables, lens = queries[picked], block_tables[picked], context_lengths[picked]
        longest = tiles.lengths[rows[0]]
        common = dict(scale=scale, block_size=block_size, max_context=longest)
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


class SharedPrefixPlan(NamedTuple):
    """One-query rows grouped by the leading blocks they share (`plan_shared_prefixes`)."""

    prefixes: list[tuple[mx.array, mx.array]]  # per group: its rows (m,), prefix rows (Hkv, P)
    back: mx.array  # undoes the grouping order of the rows
    suffix_rows: mx.array  # (Hkv, B, S) pool rows of each row's keys after its prefix
    suffix_visible: mx.array  # (B, S) bool: which of them are real


SHARED_PREFIX_MIN_SAVING = 1.5  # gathered keys, plain / shared-prefix, for the plan to pay


def plan_shared_prefixes(
    tables: list[list[int]], lengths: list[int], block_size: int, num_kv_heads: int
) -> SharedPrefixPlan | None:
    """Group one-query rows (decode rows, a MIXED step's one-token rows) by their first block;
    a group's prefix is the whole blocks all its rows share and all their queries see (every
    row keeps at least its own key after it). Each prefix is then gathered once for its group
    instead of once per row. None when that would not cut the gathered keys by
    `SHARED_PREFIX_MIN_SAVING` (no sharing: the tiled plan does better)."""
    by_first: dict[int, list[int]] = {}
    for row, blocks in enumerate(tables):
        by_first.setdefault(blocks[0] if lengths[row] > block_size else -1 - row, []).append(row)
    groups, starts = [], [0] * len(tables)
    for rows in by_first.values():
        shared = 0
        if len(rows) > 1:
            first = tables[rows[0]]
            limit = min(lengths[r] - 1 for r in rows) // block_size  # keep each row's own key
            while shared < limit and all(tables[r][shared] == first[shared] for r in rows):
                shared += 1
        groups.append((rows, shared))
        for r in rows:
            starts[r] = shared * block_size
    suffix = [n - s for n, s in zip(lengths, starts, strict=True)]
    plain = sum(lengths)
    cascade = sum(shared * block_size for _, shared in groups) + len(lengths) * max(suffix)
    if cascade * SHARED_PREFIX_MIN_SAVING > plain:
        return None
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
    q = _queries_by_kv_head(queries, num_kv_heads, scale)  # (Hkv, B, g, D)
    per_kv = q.shape[2]
    keys_flat, values_flat = k_pool.reshape(-1, head_dim), v_pool.reshape(-1, head_dim)
    scores = (q @ keys_flat[plan.suffix_rows].swapaxes(-1, -2)).astype(mx.float32)
    scores = mx.where(plan.suffix_visible[None, :, None, :], scores, -mx.inf)
    suffix_max = scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores - suffix_max)
    suffix_sum = weights.sum(axis=-1, keepdims=True)
    suffix_out = weights.astype(values_flat.dtype) @ values_flat[plan.suffix_rows]
    maxes, sums, outs = [], [], []
    for rows, prefix_rows in plan.prefixes:
        m = rows.shape[0]
        if prefix_rows.shape[1] == 0:  # nothing shared: the suffix is the whole context
            maxes.append(mx.full((num_kv_heads, m, per_kv, 1), -mx.inf, dtype=mx.float32))
            sums.append(mx.zeros((num_kv_heads, m, per_kv, 1), dtype=mx.float32))
            outs.append(mx.zeros((num_kv_heads, m, per_kv, head_dim), dtype=suffix_out.dtype))
            continue
        group_q = q[:, rows].reshape(num_kv_heads, m * per_kv, head_dim)
        s = (group_q @ keys_flat[prefix_rows].swapaxes(-1, -2)).astype(mx.float32)
        s_max = s.max(axis=-1, keepdims=True)
        w = mx.power(2.0, s - s_max)
        maxes.append(s_max.reshape(num_kv_heads, m, per_kv, 1))
        sums.append(w.sum(axis=-1, keepdims=True).reshape(num_kv_heads, m, per_kv, 1))
        out = w.astype(values_flat.dtype) @ values_flat[prefix_rows]
        outs.append(out.reshape(num_kv_heads, m, per_kv, head_dim))
    prefix_max = mx.concatenate(maxes, axis=1)[:, plan.back]
    prefix_sum = mx.concatenate(sums, axis=1)[:, plan.back]
    prefix_out = mx.concatenate(outs, axis=1)[:, plan.back]
    top = mx.maximum(prefix_max, suffix_max)  # finite: every row has its own key
    a, b = mx.power(2.0, prefix_max - top), mx.power(2.0, suffix_max - top)
    out = (prefix_out * a + suffix_out * b) / (prefix_sum * a + suffix_sum * b)
    return _queries_layout(out, queries)


def blockwise_attention(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
    max_context: int,
    blocks_per_step: int = 1,
) -> mx.array:
    """Online softmax over the context, `blocks_per_step` blocks at a time."""
    q = _queries_by_kv_head(queries, k_pool.shape[1], scale)
    num_queries = queries.shape[2]
    slots = context_slot_table(block_tables, max_context, block_size)
    step = blocks_per_step * block_size
    running_max = running_sum = acc = None
    for start in range(0, max_context, step):
        step_slots = slots[:, start : start + step]
        keys = gather_by_kv_head(k_pool, step_slots)
        values = gather_by_kv_head(v_pool, step_slots)
        scores = _masked_scores(q, keys, context_lengths, num_queries, key_start=start)
        step_max = scores.max(axis=-1, keepdims=True)
        # The first step holds key 0, which every query sees: its row maxima are finite.
        new_max = step_max if running_max is None else mx.maximum(running_max, step_max)
        weights = mx.power(2.0, scores - new_max)
        step_sum = weights.sum(axis=-1, keepdims=True)
        step_out = _weighted_values(weights, values)
        if running_max is None:
            running_sum, acc = step_sum, step_out
        else:
            decay = mx.power(2.0, running_max - new_max)
            running_sum = running_sum * decay + step_sum
            acc = acc * decay.reshape(*q.shape[:3], 1) + step_out
        running_max = new_max
    return _queries_layout(acc / running_sum.reshape(*q.shape[:3], 1), queries)


def context_slot_table(block_tables: mx.array, num_tokens: int, block_size: int) -> mx.array:
    """`(B, num_tokens)` slot ids of positions 0..num_tokens-1 of every sequence."""
    positions = mx.arange(num_tokens, dtype=mx.int32)
    return block_tables[:, positions // block_size] * block_size + positions % block_size


def _gather_rows(pool: mx.array, rows: mx.array) -> mx.array:
    return pool.reshape(-1, pool.shape[-1])[rows]


def _apply_mask(scores: mx.array, visible: mx.array, num_queries: int) -> mx.array:
    """float32 `(Hkv, B, heads_per_kv, Lq, keys)` scores, -inf where `visible` is False."""
    scores = scores.astype(mx.float32)
    hkv, batch, rows, num_keys = scores.shape
    scores = scores.reshape(hkv, batch, rows // num_queries, num_queries, num_keys)
    return mx.where(visible, scores, -mx.inf)


def gather_by_kv_head(pool: mx.array, slots: mx.array) -> mx.array:
    """Rows of `pool` `(slots, Hkv, D)` at `slots` `(B, n)`, as a contiguous `(Hkv, B, n, D)`.

    Indexes the pool as `(slots * Hkv, D)` rows, so the gather writes KV-head-major layout
    itself. (`take(pool.swapaxes(0, 1), slots, axis=1)` returns a transposed view of a
    slot-major gather, and every matmul over it starts with a hidden copy.)
    """
    num_kv_heads, head_dim = pool.shape[1:]
    heads = mx.arange(num_kv_heads, dtype=mx.int32)[:, None, None]
    return pool.reshape(-1, head_dim)[slots[None] * num_kv_heads + heads]


def _queries_by_kv_head(queries: mx.array, num_kv_heads: int, scale: float) -> mx.array:
    """`(B, H, Lq, D)` -> `(Hkv, B, H // Hkv * Lq, D)`, scaled into base-2 logits."""
    batch, num_heads, num_queries, head_dim = queries.shape
    rows = num_heads // num_kv_heads * num_queries
    q = (queries * (scale * LOG2_E)).reshape(batch, num_kv_heads, rows, head_dim)
    return q.swapaxes(0, 1)


def _masked_scores(
    q: mx.array, keys: mx.array, context_lengths: mx.array, num_queries: int, *, key_start: int
) -> mx.array:
    """float32 scores `(Hkv, B, heads_per_kv, Lq, keys)`, -inf where causality or length forbids.

    Query i of sequence b sits at position `context_lengths[b] - Lq + i` and sees keys at
    positions <= its own; that also hides every key at or past the sequence's length.
    """
    scores = (q @ keys.swapaxes(-1, -2)).astype(mx.float32)
    hkv, batch, rows, num_keys = scores.shape
    scores = scores.reshape(hkv, batch, rows // num_queries, num_queries, num_keys)
    query_pos = context_lengths[:, None] - num_queries + mx.arange(num_queries, dtype=mx.int32)
    key_pos = mx.arange(key_start, key_start + num_keys, dtype=mx.int32)
    visible = key_pos <= query_pos[:, :, None]  # (B, Lq, keys)
    return mx.where(visible[:, None], scores, -mx.inf)


def _weighted_values(weights: mx.array, values: mx.array) -> mx.array:
    """`(Hkv, B, g, Lq, keys) @ (Hkv, B, keys, D)` -> `(Hkv, B, g * Lq, D)`."""
    hkv, batch, groups, num_queries, num_keys = weights.shape
    flat = weights.reshape(hkv, batch, groups * num_queries, num_keys).astype(values.dtype)
    return flat @ values


def _queries_layout(out: mx.array, queries: mx.array) -> mx.array:
    """`(Hkv, B, g * Lq, D)` -> `(B, H, Lq, D)` in the queries' dtype."""
    return out.swapaxes(0, 1).reshape(queries.shape).astype(queries.dtype)
