"""The "mlx" paged-attention backend: MLX ops only, so it runs on any device.

Two strategies, compared by `scripts/bench_attention.py`:

- `gather_attention` (the default): one gather of every sequence's context by slot id, then one
  batched attention over the padded batch.
- `blockwise_attention`: walks the block table a few blocks at a time with a running max and sum
  (online softmax), so it never holds more than one step of K/V; it pays ~12 small ops per step.

Both work in KV-head-major layout, `(num_kv_heads, B, tokens, head_dim)`: gathering with
`take(pool.swapaxes(0, 1), slots, axis=1)` writes that layout directly, so every matmul operand is
contiguous. (Gathering `(B, L, H, D)` and transposing hands SDPA a strided K/V: on the CPU backend
that copy-on-use made attention 5-9x slower at batch 8-32.) GQA rides along for free: the
`n_heads // num_kv_heads` query heads of one KV head become extra query rows of one matmul.

Softmax runs in base 2 (scores pre-multiplied by log2(e), `2**x` instead of `exp(x)`): MLX's CPU
`exp` managed ~70M elements/s here against ~180M for `power(2, x)`, and exponentials are most of
the cost of a prefill chunk.
"""

from __future__ import annotations

import math

import mlx.core as mx

LOG2_E = 1.0 / math.log(2.0)


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
    keys = mx.take(k_pool.swapaxes(0, 1), slots, axis=1)
    values = mx.take(v_pool.swapaxes(0, 1), slots, axis=1)
    q = _queries_by_kv_head(queries, k_pool.shape[1], scale)
    scores = _masked_scores(q, keys, context_lengths, queries.shape[2], key_start=0)
    row_max = scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores - row_max)
    out = _weighted_values(weights, values) / weights.sum(axis=-1).reshape(*q.shape[:3], 1)
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
    """Online softmax over the block table, `blocks_per_step` blocks at a time."""
    num_kv_heads, head_dim = k_pool.shape[1:]
    # (num_kv_heads, num_blocks, block_size, head_dim) views of the pools: a take along axis 1
    # by block ids gives whole blocks in KV-head-major layout.
    k_blocks = k_pool.reshape(-1, block_size, num_kv_heads, head_dim).transpose(2, 0, 1, 3)
    v_blocks = v_pool.reshape(-1, block_size, num_kv_heads, head_dim).transpose(2, 0, 1, 3)
    q = _queries_by_kv_head(queries, num_kv_heads, scale)
    num_queries = queries.shape[2]
    num_blocks = -(-max_context // block_size)
    steps = [
        block_tables[:, first : min(first + blocks_per_step, num_blocks)]
        for first in range(0, num_blocks, blocks_per_step)
    ]
    scores, values = _block_step(q, k_blocks, v_blocks, steps[0], context_lengths, 0, num_queries)
    # The first step holds key 0, which every query sees: its row maxima are finite.
    running_max = scores.max(axis=-1, keepdims=True)
    weights = mx.power(2.0, scores - running_max)
    running_sum = weights.sum(axis=-1, keepdims=True)
    acc = _weighted_values(weights, values)
    for i, table_cols in enumerate(steps[1:], start=1):
        key_start = i * blocks_per_step * block_size
        scores, values = _block_step(
            q, k_blocks, v_blocks, table_cols, context_lengths, key_start, num_queries
        )
        new_max = mx.maximum(running_max, scores.max(axis=-1, keepdims=True))
        weights = mx.power(2.0, scores - new_max)
        decay = mx.power(2.0, running_max - new_max)
        running_sum = running_sum * decay + weights.sum(axis=-1, keepdims=True)
        acc = acc * decay.reshape(*q.shape[:3], 1) + _weighted_values(weights, values)
        running_max = new_max
    return _queries_layout(acc / running_sum.reshape(*q.shape[:3], 1), queries)


def _block_step(
    q: mx.array,
    k_blocks: mx.array,
    v_blocks: mx.array,
    table_cols: mx.array,
    context_lengths: mx.array,
    key_start: int,
    num_queries: int,
) -> tuple[mx.array, mx.array]:
    """Masked scores and values of the blocks in `table_cols` (B, n), first key at `key_start`."""
    num_kv_heads, _, block_size, head_dim = k_blocks.shape
    shape = (num_kv_heads, table_cols.shape[0], table_cols.shape[1] * block_size, head_dim)
    keys = mx.take(k_blocks, table_cols, axis=1).reshape(shape)
    values = mx.take(v_blocks, table_cols, axis=1).reshape(shape)
    scores = _masked_scores(q, keys, context_lengths, num_queries, key_start=key_start)
    return scores, values


def context_slot_table(block_tables: mx.array, num_tokens: int, block_size: int) -> mx.array:
    """`(B, num_tokens)` slot ids of positions 0..num_tokens-1 of every sequence."""
    positions = mx.arange(num_tokens, dtype=mx.int32)
    return block_tables[:, positions // block_size] * block_size + positions % block_size


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
