"""The "mlx" paged-attention backend: MLX ops only, so it runs on any device.

Strategies (all exact; they differ in speed only):

- `tiled_attention` (the default, in `tiles.py`): the batch cut into tiles whose gathered K/V and scores stay
  near `DEFAULT_TILE_BYTES` (8 MB, cache-sized): rows grouped longest-first (so a group pads
  only to its own longest member), each group by `gather_attention`, or by
  `blockwise_attention` in budget-sized key steps when one sequence's context overflows.
- `gather_attention`: one gather of every sequence's context by slot id (exactly `max_context`
  tokens, however wide the block table), then one masked attention over the padded batch.
- `blockwise_attention`: walks the context `blocks_per_step` blocks at a time with a running
  max and sum (online softmax); ~12 small ops per step.
- `shared_prefix_attention` (in `shared_prefix.py`; taken by the tiled plan for one-query rows when it cuts the
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
of the cost of a prefill chunk; that is why all strategies beat dense SDPA there. One-query
rows' weights come from `exp2_shifted`, a compiled polynomial: MLX's CPU `power` costs ~6 ns per
element here (numpy's `exp2` 0.2 ns), the polynomial 2-4x less on the scores alone (0.35 vs
0.65 ms over 136k). A decode layer over kept shared prefixes: 5-17% faster (`scripts/
bench_attention.py --only shared`); the mixed B=32 decode batch 9.5 vs 16.4 ms, other decode
cases within 5%. Prefill chunks keep `power`: there the polynomial, though faster alone on the
same shapes, made a blockwise chunk slower (38 vs 27 ms at Lq=256 over 1280 keys), which the
three kernels' extra passes over scores that no longer fit in cache may explain.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mlx.core as mx

from worker.attention.exp2 import exp2_shifted
from worker.attention.window import (
    NO_SCORE,
    sink_logits,
    sink_rows,
    visible_keys,
    window_slot_table,
    window_width,
    with_sinks,
)

LOG2_E = 1.0 / math.log(2.0)


def _power_shifted(x: mx.array, top: mx.array) -> mx.array:
    return mx.power(2.0, x - top)


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
    window: int | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Gather each sequence's first `max_context` K/V slots, then attend once, masked.

    `max_context` is the longest context in the batch: the gather never reads the padding of a
    block table wider than that, and never rounds it up to a whole block either.
    `inputs`: the gather rows and mask from `gather_inputs`, made once per forward and shared
    by its layers (else made here). `window`, `sinks`: see `worker.attention.window` (with a
    window, only the keys in it are gathered).
    """
    if inputs is None:
        inputs = gather_inputs(
            block_tables,
            context_lengths,
            k_pool.shape[1],
            queries.shape[2],
            max_context=max_context,
            block_size=block_size,
            window=window,
        )
    return attend_gathered(queries, k_pool, v_pool, inputs, scale, sinks=sinks)


def attend_gathered(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    inputs: GatherInputs,
    scale: float,
    *,
    sinks: mx.array | None = None,
) -> mx.array:
    """`gather_attention` over gather rows and mask already made (`gather_inputs`)."""
    q = queries_by_kv_head(queries, k_pool.shape[1], scale)
    scores = apply_mask(key_scores(q, k_pool, inputs.rows), inputs.visible, queries.shape[2])
    row_max = scores.max(axis=-1, keepdims=True)
    if sinks is not None:  # one pass: the shift is max(row max, sink), the sink's term added
        sink = sink_logits(sinks, k_pool.shape[1], scores.ndim)
        row_max = mx.maximum(row_max, sink)
    # one-query rows: the polynomial; a prefill chunk's many rows: `power` (measured faster)
    exp2 = exp2_shifted if queries.shape[2] == 1 else _power_shifted
    weights = exp2(scores, row_max)
    out = attend_values(weights, v_pool, inputs.rows)
    total = weights.sum(axis=-1)
    if sinks is not None:
        total = total + mx.power(2.0, sink - row_max)[..., 0]
    out = out / total.reshape(*q.shape[:3], 1)
    return queries_layout(out, queries)


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
    window: int | None = None,
) -> GatherInputs:
    """Rows and mask of each sequence's keys: its first `max_context`, or with a `window`
    only the `window_width` keys from its window's start on."""
    if window is None:
        slots = context_slot_table(block_tables, max_context, block_size)
        key_pos = mx.arange(max_context, dtype=mx.int32)
    else:
        width = window_width(max_context, num_queries, window)
        slots, key_pos = window_slot_table(
            block_tables, context_lengths, num_queries, width, block_size, window
        )
    visible = visible_keys(context_lengths, num_queries, key_pos, window)  # (B, Lq, keys)
    return GatherInputs(kv_head_rows(slots, num_kv_heads), visible[:, None])


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
    window: int | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """Online softmax over the context, `blocks_per_step` blocks at a time (with a `window`,
    over the keys in it only; `sinks` join in the final combine, once)."""
    q = queries_by_kv_head(queries, k_pool.shape[1], scale)
    num_queries = queries.shape[2]
    width = window_width(max_context, num_queries, window)
    if window is None:
        slots = context_slot_table(block_tables, max_context, block_size)
        key_pos = mx.arange(max_context, dtype=mx.int32)
    else:
        slots, key_pos = window_slot_table(
            block_tables, context_lengths, num_queries, width, block_size, window
        )
    step = blocks_per_step * block_size
    running_max = running_sum = acc = None
    for start in range(0, width, step):
        rows = kv_head_rows(slots[:, start : start + step], k_pool.shape[1])
        visible = visible_keys(
            context_lengths, num_queries, key_pos[..., start : start + step], window
        )
        scores = apply_mask(key_scores(q, k_pool, rows), visible[:, None], num_queries)
        step_max = scores.max(axis=-1, keepdims=True)
        if window is not None:  # a later query may see none of a step's keys
            step_max = mx.maximum(step_max, NO_SCORE)
        # Without a window the first step holds key 0, which every query sees: finite maxima.
        new_max = step_max if running_max is None else mx.maximum(running_max, step_max)
        weights = mx.power(2.0, scores - new_max)
        step_sum = weights.sum(axis=-1, keepdims=True)
        step_out = attend_values(weights, v_pool, rows)
        if running_max is None:
            running_sum, acc = step_sum, step_out
        else:
            decay = mx.power(2.0, running_max - new_max)
            running_sum = running_sum * decay + step_sum
            acc = acc * decay.reshape(*q.shape[:3], 1) + step_out
        running_max = new_max
    total = running_sum.reshape(*q.shape[:3], 1)
    if sinks is None:
        return queries_layout(acc / total, queries)
    top, sink = running_max.reshape(total.shape), sink_rows(sinks, k_pool.shape[1], num_queries)
    return queries_layout(with_sinks(acc, total, top, sink), queries)


def context_slot_table(block_tables: mx.array, num_tokens: int, block_size: int) -> mx.array:
    """`(B, num_tokens)` slot ids of positions 0..num_tokens-1 of every sequence."""
    positions = mx.arange(num_tokens, dtype=mx.int32)
    return block_tables[:, positions // block_size] * block_size + positions % block_size


def gather_rows(pool: mx.array, rows: mx.array) -> mx.array:
    """Rows of `pool` viewed as `(slots * Hkv, D)`; a quantized pool (`worker.kv.quant`,
    known by its `rows`) dequantizes what it gathers."""
    if hasattr(pool, "rows"):
        return pool.rows(rows)
    return pool.reshape(-1, pool.shape[-1])[rows]


# A quantized pool (`--kv-bits`) is attended, at decode (few query rows per KV head), with
# `mx.quantized_matmul` on its gathered packed rows, and at prefill by dequantizing them first.
# `scripts/bench_kv_quant.py` (float32, 9 heads, 3 KV heads, head dim 64, 2-core CPU shared),
# ms, unquantized / dequantize-then-matmul / quantized_matmul, 8 bits: decode B=1 ctx 1000
# 0.25 / 1.3 / 0.93; B=8 ctx 512 1.9 / 7.1 / 4.0; B=32 ctx 1024 20 / 156 / 37 (4 bits alike);
# prefill Lq=256 ctx 1280 71 / 70 / 303.
QUANTIZED_MATMUL_MAX_ROWS = 16


def key_scores(q: mx.array, k_pool, rows: mx.array) -> mx.array:
    """`q @ keys.T` over the pool's keys at `rows` (`(Hkv, B, n)` of the `(slots * Hkv, D)`
    view): `(Hkv, B, rows_per_kv, n)`."""
    if hasattr(k_pool, "gather") and q.shape[-2] <= QUANTIZED_MATMUL_MAX_ROWS:
        return mx.quantized_matmul(
            q,
            *k_pool.gather(rows),
            transpose=True,
            group_size=k_pool.group_size,
            bits=k_pool.bits,
        )
    return q @ gather_rows(k_pool, rows).swapaxes(-1, -2)


def attend_values(weights: mx.array, v_pool, rows: mx.array) -> mx.array:
    """`weights @ values` over the pool's values at `rows`: `(Hkv, B, g, Lq, n)` weights ->
    `(Hkv, B, g * Lq, D)` (as `weighted_values`)."""
    hkv, batch, groups, num_queries, num_keys = weights.shape
    flat = weights.reshape(hkv, batch, groups * num_queries, num_keys)
    return weighted_rows(flat, v_pool, rows)


def weighted_rows(weights: mx.array, v_pool, rows: mx.array) -> mx.array:
    """`weights @ values` of `(..., m, n)` weights over the pool's values at `rows`."""
    weights = weights.astype(v_pool.dtype)
    if hasattr(v_pool, "gather") and weights.shape[-2] <= QUANTIZED_MATMUL_MAX_ROWS:
        return mx.quantized_matmul(
            weights,
            *v_pool.gather(rows),
            transpose=False,
            group_size=v_pool.group_size,
            bits=v_pool.bits,
        )
    return weights @ gather_rows(v_pool, rows)


def apply_mask(scores: mx.array, visible: mx.array, num_queries: int) -> mx.array:
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
    return gather_rows(pool, kv_head_rows(slots, pool.shape[1]))


def kv_head_rows(slots: mx.array, num_kv_heads: int) -> mx.array:
    """`(Hkv, B, n)` rows of the `(slots * Hkv, D)` view holding `slots` `(B, n)`."""
    heads = mx.arange(num_kv_heads, dtype=mx.int32)[:, None, None]
    return slots[None] * num_kv_heads + heads


def queries_by_kv_head(queries: mx.array, num_kv_heads: int, scale: float) -> mx.array:
    """`(B, H, Lq, D)` -> `(Hkv, B, H // Hkv * Lq, D)`, scaled into base-2 logits."""
    batch, num_heads, num_queries, head_dim = queries.shape
    rows = num_heads // num_kv_heads * num_queries
    q = (queries * (scale * LOG2_E)).reshape(batch, num_kv_heads, rows, head_dim)
    return q.swapaxes(0, 1)


def weighted_values(weights: mx.array, values: mx.array) -> mx.array:
    """`(Hkv, B, g, Lq, keys) @ (Hkv, B, keys, D)` -> `(Hkv, B, g * Lq, D)`."""
    hkv, batch, groups, num_queries, num_keys = weights.shape
    flat = weights.reshape(hkv, batch, groups * num_queries, num_keys).astype(values.dtype)
    return flat @ values


def queries_layout(out: mx.array, queries: mx.array) -> mx.array:
    """`(Hkv, B, g * Lq, D)` -> `(B, H, Lq, D)` in the queries' dtype."""
    return out.swapaxes(0, 1).reshape(queries.shape).astype(queries.dtype)
