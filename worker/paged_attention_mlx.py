"""The "mlx" paged-attention backend: MLX ops only, so it runs on any device.

Strategies (all exact; they differ in speed only):

- `tiled_gather_attention` (the default): `gather_attention` over tiles of the batch, rows
  grouped longest-first and query positions chunked so that each tile's gathered K/V and
  scores stay near `DEFAULT_TILE_BYTES` (8 MB, cache-sized). Grouping by length also bounds
  padding: a group pads only to its own longest member.
- `gather_attention`: one gather of every sequence's context by slot id (exactly `max_context`
  tokens, however wide the block table), then one masked attention over the padded batch.
- `blockwise_attention`: walks the context `blocks_per_step` blocks at a time with a running
  max and sum (online softmax); ~12 small ops per step.

Measured with `scripts/bench_attention.py` (one run; float32, 9 heads, 3 KV heads, head dim 64,
block size 32, shuffled block ids; 2-core x86-64 CPU shared with other jobs, OpenBLAS
preloaded, OPENBLAS_NUM_THREADS=1; under the neighbours' load a row can move up to 2x from run
to run, so compare within a row; the contenders take turns), ms per call:

    case                          dense SDPA  tiled  gather  blockwise  blockwise x8
    decode B=1, ctx 1000                0.55   0.67    0.63        8.9           2.6
    decode B=8, ctx 142..891            3.6    3.7     3.9        11.9          10.8
    decode B=32, ctx 130..998          19.8   32.3    78.3        46.3          39.4
    decode B=32, ctx 1024              28.7   46.5    50.8        49.7          43.5
    prefill Lq=256, ctx 1280           78.5   50.2    45.6        61.0          49.5

Tiled and gather are equal within noise at B=1-8 and on the prefill chunk; tiled is 1.1-2.4x
faster at B=32, where untiled K/V (50 MB) falls out of the 32 MB L3. Blockwise pays
its per-step op overhead: 3-13x slower than tiled at B=1-8; at B=32 and prefill, stepping over
keys keeps it cache-sized too and it lands at 0.9-1.4x of tiled. Against dense SDPA over K/V
that is already contiguous (no gather at all), tiled costs 1.0-1.6x at decode and 0.6x at
prefill (below). In `--tile-sweep` runs, 4 and 8 MB budgets were within noise of each other;
2 MB lost on the prefill chunk and 16 MB on the mixed B=32 batch. The budget is tuned for CPU
caches; it is not measured on a GPU.

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
MIN_QUERY_CHUNK = 16


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
) -> mx.array:
    """Gather each sequence's first `max_context` K/V slots, then attend once, masked.

    `max_context` is the longest context in the batch: the gather never reads the padding of a
    block table wider than that, and never rounds it up to a whole block either.
    """
    slots = context_slot_table(block_tables, max_context, block_size)
    keys, values = gather_by_kv_head(k_pool, slots), gather_by_kv_head(v_pool, slots)
    q = _queries_by_kv_head(queries, k_pool.shape[1], scale)
    scores = _masked_scores(q, keys, context_lengths, queries.shape[2], key_start=0)
    row_max = scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores - row_max)
    out = _weighted_values(weights, values) / weights.sum(axis=-1).reshape(*q.shape[:3], 1)
    return _queries_layout(out, queries)


class TilePlan(NamedTuple):
    """How `tiled_gather_attention` cuts a batch: groups of batch rows (longest context first)
    times chunks of `query_chunk` query positions."""

    groups: list[list[int]]
    query_chunk: int


def plan_tiles(
    lengths: list[int], num_queries: int, *, key_bytes: int, score_bytes: int, budget: int
) -> TilePlan:
    """Cut the batch into tiles whose working set stays near `budget` bytes.

    A tile of n sequences padded to L keys and q query positions holds about
    `n * L * (key_bytes + q * score_bytes)`: gathered K and V, plus float32 scores. Query chunks
    keep one sequence's scores under budget, but no shorter than MIN_QUERY_CHUNK (tiny tiles
    cost more in op overhead than they save). Rows are grouped longest first, so a group pads
    its members to similar lengths; a sequence over budget alone gets a tile of its own.
    """
    longest = max(lengths)
    query_chunk = min(num_queries, max(MIN_QUERY_CHUNK, budget // (longest * score_bytes)))
    per_key = key_bytes + query_chunk * score_bytes
    groups: list[list[int]] = []
    for row in sorted(range(len(lengths)), key=lambda b: -lengths[b]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] * per_key <= budget:
            groups[-1].append(row)
        else:
            groups.append([row])
    return TilePlan(groups, query_chunk)


def tiled_gather_attention(
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
) -> mx.array:
    """`gather_attention` tile by tile (see `plan_tiles`), so each tile's K/V stays in cache.

    Query chunk [start, end) of a sequence is a smaller prefill chunk: its context ends
    `Lq - end` tokens earlier, so early chunks also skip keys they could not see.
    """
    batch, num_heads, num_queries, _ = queries.shape
    lengths = context_lengths.tolist()
    plan = plan_tiles(
        lengths,
        num_queries,
        key_bytes=2 * k_pool.shape[1] * k_pool.shape[2] * k_pool.itemsize,
        score_bytes=num_heads * 4 * 2,
        budget=tile_bytes,
    )
    if len(plan.groups) == 1 and plan.query_chunk == num_queries:
        return gather_attention(
            queries,
            k_pool,
            v_pool,
            block_tables,
            context_lengths,
            scale=scale,
            block_size=block_size,
            max_context=max_context,
        )
    outputs = []
    for rows in plan.groups:
        picked = mx.array(rows, dtype=mx.int32)
        group_queries, group_tables = queries[picked], block_tables[picked]
        group_lengths = context_lengths[picked]
        chunks = []
        for start in range(0, num_queries, plan.query_chunk):
            end = min(start + plan.query_chunk, num_queries)
            hidden = num_queries - end  # later queries of the chunk this one is cut from
            chunks.append(
                gather_attention(
                    group_queries[:, :, start:end],
                    k_pool,
                    v_pool,
                    group_tables,
                    group_lengths - hidden,
                    scale=scale,
                    block_size=block_size,
                    max_context=lengths[rows[0]] - hidden,
                )
            )
        outputs.append(mx.concatenate(chunks, axis=2) if len(chunks) > 1 else chunks[0])
    order = [row for rows in plan.groups for row in rows]
    back = mx.array(sorted(range(batch), key=order.__getitem__), dtype=mx.int32)
    return mx.concatenate(outputs)[back]


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
