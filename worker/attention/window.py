"""Sliding windows and attention sinks, as every MLX-ops strategy takes them.

Window W (mlx-lm's `create_causal_mask(window_size=W)`): the query at position p sees the
keys at positions k with p - W < k <= p, W keys including its own. A windowed strategy gathers
only the keys its rows can see: row b's from `max(0, first query position - W + 1)` on, at
most `W + Lq - 1` of them (`window_width`), so a decode tick over a context of 4W costs what
one over W does (`scripts/bench_attention.py --only window`).

Sinks (gpt-oss): one logit per query head, a virtual key of value 0 that only adds
`exp(sink)` to the softmax denominator. The strategies run their softmax in base 2, so a sink
is `sink * log2(e)` there (`sink_logits`), and a split or blocked reduction adds it once, in
its final combine, shifting by `max(row max, sink)` so nothing overflows (`with_sinks`).
"""

from __future__ import annotations

import math

import mlx.core as mx

LOG2_E = 1.0 / math.log(2.0)
# A running max that no key has set yet: finite, so 2**(it - it) is 1 and 2**(-inf - it) is 0
# (a step whose keys are all behind a row's window leaves the row's sums untouched).
NO_SCORE = -1.0e30


def window_width(max_context: int, num_queries: int, window: int | None) -> int:
    """Keys per row a strategy gathers: the longest context, or at most `W + Lq - 1`."""
    if window is None:
        return max_context
    return min(max_context, window + num_queries - 1)


def check_window(window: int | None) -> None:
    if window is not None and (isinstance(window, bool) or window < 1):
        raise ValueError(f"window {window!r}: a sliding window is a positive number of keys")


def window_slot_table(
    block_tables: mx.array,
    context_lengths: mx.array,
    num_queries: int,
    num_tokens: int,
    block_size: int,
    window: int,
) -> tuple[mx.array, mx.array]:
    """`(B, num_tokens)` slot ids and positions of each row's keys from its window's start
    (its first query's position - W + 1, or 0) on. Positions past a row's length (the padding
    of shorter rows) read its last slot; `visible_keys` masks them."""
    starts = mx.maximum(context_lengths - num_queries - window + 1, 0)
    key_pos = starts[:, None] + mx.arange(num_tokens, dtype=mx.int32)
    at = mx.minimum(key_pos, context_lengths[:, None] - 1)
    blocks = mx.take_along_axis(block_tables, at // block_size, axis=1)
    return (blocks * block_size + at % block_size).astype(mx.int32), key_pos


def visible_keys(
    context_lengths: mx.array, num_queries: int, key_pos: mx.array, window: int | None
) -> mx.array:
    """`(B, Lq, keys)` bool: query i of row b (at position `context_lengths[b] - Lq + i`) sees
    the key at `key_pos` (`(keys,)`, or `(B, keys)` per row) when causality and the window
    allow it."""
    query_pos = context_lengths[:, None] - num_queries + mx.arange(num_queries, dtype=mx.int32)
    query_pos = query_pos[:, :, None]
    key_pos = key_pos[:, None, :] if key_pos.ndim == 2 else key_pos
    visible = key_pos <= query_pos
    if window is not None:
        visible = visible & (key_pos > query_pos - window)
    return visible


def sink_logits(sinks: mx.array, num_kv_heads: int, ndim: int) -> mx.array:
    """Sinks `(n_heads,)` as base-2 logits shaped like a KV-head-major row statistic:
    `(Hkv, 1, heads_per_kv, 1, ...)` of `ndim` axes."""
    per_kv = sinks.shape[0] // num_kv_heads
    shape = (num_kv_heads, 1, per_kv) + (1,) * (ndim - 3)
    return (sinks.astype(mx.float32) * LOG2_E).reshape(shape)


def sink_rows(sinks: mx.array, num_kv_heads: int, num_queries: int) -> mx.array:
    """Sinks `(n_heads,)` as base-2 logits, one per KV-head-major query row:
    `(Hkv, 1, heads_per_kv * Lq, 1)` (`mlx_ops.queries_by_kv_head`'s rows)."""
    per_kv = sinks.shape[0] // num_kv_heads
    logits = sink_logits(sinks, num_kv_heads, 3).reshape(num_kv_heads, per_kv, 1)
    rows = mx.broadcast_to(logits, (num_kv_heads, per_kv, num_queries))
    return rows.reshape(num_kv_heads, 1, per_kv * num_queries, 1)


def with_sinks(out: mx.array, total: mx.array, top: mx.array, sink: mx.array) -> mx.array:
    """`out / total` with the sink's `2**(sink - top)` added to the denominator, where `out`
    and `total` are a softmax's numerator and denominator shifted by `top` (broadcastable):
    shifted by `max(top, sink)` first, so a sink far above the scores overflows nothing."""
    new_top = mx.maximum(top, sink)
    rescale = mx.power(2.0, top - new_top)
    return out * rescale / (total * rescale + mx.power(2.0, sink - new_top))
