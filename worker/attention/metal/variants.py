"""Two variants of the Metal paged-attention kernel, built on one "partial" body: split-K over
long contexts and prefix-grouped decode. Both are exact; `worker.attention.metal.plan`
decides per forward which (if any) a batch takes.

The partial body is `metal_source.KERNEL_BODY` with three edits (each must apply exactly once,
checked at import, as `metal_quant` does): the grid's z is `query row x NUM_PARTS`, each
threadgroup walks only its part's blocks (`split` = [parts, blocks per part], an input, so a
new split needs no new pipeline), and instead of the normalized output it writes its part's
softmax state: the fp32 numerator (sum of exp2(s - max) x V), the max (log2 domain) and the
denominator. `combine` merges parts with the log-sum-exp rule: weight exp2(max_p - max),
out = sum(w x numer) / sum(w x denom); a part with no block has max NO_SCORE, weight 0.
The quantized body (`--kv-bits`) takes the same edits on `metal_quant`'s K/V loads, so both
variants serve quantized pools too.

- Split-K: one launch over the real batch with NUM_PARTS parts per row; a small batch with a
  long context gets `parts` times more threadgroups (decode is bandwidth bound: idle GPU cores
  are lost bandwidth).
- Prefix-grouped (one-query rows only): rows sharing leading blocks are packed, up to R rows
  at a time, into one virtual sequence whose "query heads" are the R rows' heads, so one
  threadgroup per (KV head, R rows) reads each shared block ONCE for all R x GQA queries
  (instead of once per row); R is the largest with R x GQA <= 16 queries (each a lane's
  HEAD_DIM / 32 fp32 accumulators in registers) and room for >= 2 simdgroups in 32 KiB of
  threadgroup memory: GQA 8 -> 2 rows, GQA 4 -> 4, GQA 1 -> 16 (head dim 128, block 16).
  Each row's own blocks after the prefix are a second partial launch (itself split-K where
  that pays); the two partials are combined per row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mlx.core as mx

from worker.attention.metal import quant as metal_quant
from worker.attention.metal import source as metal_source

KERNEL_NAME = "paged_attention_partial"
INPUT_NAMES = [*metal_source.INPUT_NAMES, "split"]
QUANTIZED_INPUT_NAMES = [*metal_quant.INPUT_NAMES, "split"]
NO_SCORE = -1.0e30
MAX_GROUPED_QUERIES = 16  # R x GQA query vectors per threadgroup (fp32 accumulators)

_EDITS = [
    (
        "    const uint q_row = threadgroup_position_in_grid.z;\n",
        "    const int num_parts = split[0];\n"
        "    const uint q_row = threadgroup_position_in_grid.z / uint(num_parts);\n"
        "    const int part = int(threadgroup_position_in_grid.z % uint(num_parts));\n",
    ),
    (
        "    const int num_blocks = (visible + BLOCK_SIZE - 1) / BLOCK_SIZE;\n",
        "    // This part's blocks: [first_block, num_blocks) of the row's visible ones.\n"
        "    const int first_block = part * split[1];\n"
        "    const int num_blocks = metal::min((visible + BLOCK_SIZE - 1) / BLOCK_SIZE,\n"
        "                                      first_block + split[1]);\n",
    ),
    (
        "for (int blk = int(simd_group); blk < num_blocks;",
        "for (int blk = first_block + int(simd_group); blk < num_blocks;",
    ),
    (
        "        out[row * HEAD_DIM + i % HEAD_DIM] = static_cast<QueryT>(numer / denom);\n",
        "        // The part's softmax state, merged by `combine` (log-sum-exp rule).\n"
        "        const int64_t at = row * num_parts + part;\n"
        "        numer_out[at * HEAD_DIM + i % HEAD_DIM] = numer;\n"
        "        if (i % HEAD_DIM == 0) {\n"
        "            part_max_out[at] = best;\n"
        "            part_sum_out[at] = denom;\n"
        "        }\n",
    ),
]


def partial_body(body: str) -> str:
    """`body` (plain or quantized) made to write one part's softmax state."""
    for old, new in _EDITS:
        if body.count(old) != 1:
            raise AssertionError(f"the kernel body no longer has exactly one {old.strip()!r}")
        body = body.replace(old, new)
    return body


KERNEL_BODY = partial_body(metal_source.KERNEL_BODY)
QUANTIZED_KERNEL_BODY = partial_body(metal_quant.KERNEL_BODY)
KERNEL_OUTPUT_NAMES = ["numer_out", "part_max_out", "part_sum_out"]


def kernel_spec(quantized: bool) -> tuple[str, list[str], list[str], str]:
    """(name, input names, output names, body) for `mx.fast.metal_kernel`."""
    if quantized:
        return (
            KERNEL_NAME + "_quantized",
            QUANTIZED_INPUT_NAMES,
            KERNEL_OUTPUT_NAMES,
            QUANTIZED_KERNEL_BODY,
        )
    return KERNEL_NAME, INPUT_NAMES, KERNEL_OUTPUT_NAMES, KERNEL_BODY


def make_launch(
    queries,
    k_pool,
    v_pool,
    block_tables,
    context_lengths,
    *,
    scale,
    block_size,
    parts: int,
    part_blocks: int,
    window=None,
) -> metal_source.Launch:
    """The plain (or quantized) launch, with `parts` threadgroups per query row and the three
    fp32 partial outputs `(B, H, Lq, parts[, D])`; `window`: of the windowed body
    (`worker.attention.metal.window`), whose parts count blocks from the window's first."""
    maker = (
        metal_quant.make_launch if metal_quant.is_quantized(k_pool) else metal_source.make_launch
    )
    launch = maker(
        queries, k_pool, v_pool, block_tables, context_lengths, scale=scale, block_size=block_size
    )
    launch = metal_source.with_options(launch, window=window, sinks=None)
    x, y, z = launch.grid
    shape = (*queries.shape[:3], parts)
    return launch._replace(
        inputs=[*launch.inputs, mx.array([parts, part_blocks], dtype=mx.int32)],
        grid=(x, y, z * parts),
        output_shapes=[(*shape, queries.shape[3]), shape, shape],
        output_dtypes=[mx.float32] * 3,
    )


class Partial(NamedTuple):
    numer: mx.array  # (..., parts, D) fp32
    max: mx.array  # (..., parts) fp32, log2 domain
    sum: mx.array  # (..., parts) fp32


def combine(parts: Partial, dtype, sinks: mx.array | None = None) -> mx.array:
    """Merge partial softmax states along the parts axis (log-sum-exp rule). `sinks`
    (`(n_heads,)`, natural-log logits) join once, here: each a part of max `sink * log2 e`,
    sum 1 and numerator 0, so the merge's max already takes them in."""
    best = parts.max.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = (sinks.astype(mx.float32) / math.log(2.0)).reshape(1, -1, 1, 1)
        best = mx.maximum(best, sink)
    weight = mx.exp((parts.max - best) * math.log(2.0))
    numer = (weight[..., None] * parts.numer).sum(axis=-2)
    denom = (weight * parts.sum).sum(axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + mx.exp((sink - best) * math.log(2.0))
    return (numer / denom).astype(dtype)


def run_partial(
    kernel,
    queries,
    k_pool,
    v_pool,
    block_tables,
    context_lengths,
    *,
    scale,
    block_size,
    parts,
    part_blocks,
    window=None,
) -> Partial:
    launch = make_launch(
        queries,
        k_pool,
        v_pool,
        block_tables,
        context_lengths,
        scale=scale,
        block_size=block_size,
        parts=parts,
        part_blocks=part_blocks,
        window=window,
    )
    return Partial(*kernel(**launch._asdict()))


def split_k(
    kernel,
    queries,
    k_pool,
    v_pool,
    block_tables,
    context_lengths,
    *,
    scale,
    block_size,
    parts,
    part_blocks,
    window=None,
    sinks=None,
) -> mx.array:
    """Paged attention with each row's context (or window) split over `parts` threadgroups;
    `kernel`: the partial body, windowed where `window` is given."""
    partial = run_partial(
        kernel,
        queries,
        k_pool,
        v_pool,
        block_tables,
        context_lengths,
        scale=scale,
        block_size=block_size,
        parts=parts,
        part_blocks=part_blocks,
        window=window,
    )
    return combine(partial, queries.dtype, sinks)


class GroupedPlan(NamedTuple):
    """Host-built index arrays of one prefix-grouped forward (`metal_plan.plan_grouped`)."""

    rows_per_chunk: int  # R
    chunk_rows: mx.array  # (C, R) int32: the rows of each chunk (padded with its first row)
    prefix_tables: mx.array  # (C, P) int32: each chunk's shared blocks (padded)
    prefix_lengths: mx.array  # (C,) int32: shared tokens
    slot_of_row: mx.array  # (B,) int32: c * R + r of each row, 0 where it has no prefix
    has_prefix: mx.array  # (B,) bool
    suffix_tables: mx.array  # (B, S) int32: each row's blocks after its prefix
    suffix_lengths: mx.array  # (B,) int32
    suffix_parts: int
    suffix_part_blocks: int


def prefix_grouped(
    kernel, queries, k_pool, v_pool, *, scale, block_size, plan: GroupedPlan, sinks=None
) -> mx.array:
    """Decode attention (Lq 1) with each chunk's shared prefix read once per threadgroup;
    `sinks` join the merge of prefix and suffix, once. (Never windowed: `metal_plan`.)"""
    batch, num_heads, _, head_dim = queries.shape
    kv_heads = k_pool.shape[1]
    group, rows = num_heads // kv_heads, plan.rows_per_chunk
    chunks = plan.chunk_rows.shape[0]
    by_kv = queries.reshape(batch, kv_heads, group, head_dim)[plan.chunk_rows]  # (C,R,Hkv,G,D)
    virtual = by_kv.transpose(0, 2, 1, 3, 4).reshape(chunks, kv_heads * rows * group, 1, head_dim)
    prefix = run_partial(
        kernel,
        virtual,
        k_pool,
        v_pool,
        plan.prefix_tables,
        plan.prefix_lengths,
        scale=scale,
        block_size=block_size,
        parts=1,
        part_blocks=plan.prefix_tables.shape[1],
    )

    def per_row(x: mx.array) -> mx.array:  # (C, Hkv*R*G, 1, 1, ...) -> (B, H, 1, 1, ...)
        tail = x.shape[3:]
        x = x.reshape(chunks, kv_heads, rows, group, *tail).swapaxes(1, 2)
        return x.reshape(chunks * rows, num_heads, 1, *tail)[plan.slot_of_row]

    live = plan.has_prefix.reshape(batch, 1, 1, 1)
    prefix = Partial(
        mx.where(live[..., None], per_row(prefix.numer), 0.0),
        mx.where(live, per_row(prefix.max), NO_SCORE),
        mx.where(live, per_row(prefix.sum), 0.0),
    )
    suffix = run_partial(
        kernel,
        queries,
        k_pool,
        v_pool,
        plan.suffix_tables,
        plan.suffix_lengths,
        scale=scale,
        block_size=block_size,
        parts=plan.suffix_parts,
        part_blocks=plan.suffix_part_blocks,
    )
    merged = Partial(*(mx.concatenate([a, b], axis=3) for a, b in zip(prefix, suffix, strict=True)))
    return combine(merged, queries.dtype, sinks)
