"""The Metal paged-attention kernel: its body string and how one launch is laid out.

`mx.fast.metal_kernel` gets `KERNEL_BODY` and writes the signature itself (inputs, outputs,
template parameters, the `[[attribute]]` parameters the body names). Tests compile the very
same string on Linux through `tests/support/metal_emulator`, so nothing here may be Mac-only Python.

Layout: one threadgroup per (KV head, sequence, query row), NUM_SIMDGROUPS x 32 threads.
- Per KV head, not per query head: the GROUP query heads sharing a KV head (GQA) are served
  together, so each K/V block is read from device memory once instead of GROUP times. Decode
  attention is memory bound (one query row against the whole context), so that read is the
  cost that matters; the GROUP x BLOCK_SIZE scores per block are cheap ALU work.
- Inside a threadgroup, simdgroup s walks blocks s, s + NUM_SIMDGROUPS, ... with its own
  online softmax (max, sum, accumulators in fp32 registers); the simdgroups merge once at the
  end through threadgroup memory. Within a block, lane t scores token t (one `simd_max` and one
  `simd_sum` per query head per block, not per token), then every lane accumulates P x V for
  the head-dim elements `lane, lane + 32, ...`, so adjacent lanes read adjacent V addresses.
- Occupancy (Apple GPU: 32-wide simdgroups, up to 1024 threads and 32 KiB threadgroup memory
  per threadgroup): 4 simdgroups (128 threads) keep 4 blocks in flight per threadgroup while
  leaving room for several threadgroups per GPU core; registers per thread stay small
  (GROUP x HEAD_DIM / 32 accumulators: 32 floats at GQA 8, head dim 128). Threadgroup memory
  is `threadgroup_bytes(...)`: 24.6 KiB at GQA 8, head dim 128, block 32, 4 simdgroups; the
  launch drops to fewer simdgroups where a shape would not fit in 32 KiB.
- The grid is B x num_kv_heads x Lq threadgroups: at decode (Lq 1) with batch 8 and 8 KV heads
  that is 64 threadgroups, enough for the 10-40 cores of an M-series GPU. Small batches with
  long contexts would leave cores idle: the split-K variant (`metal_variants`: partitions
  per sequence, then a log-sum-exp merge, as vLLM's v2 kernel does) fixes that.
- Lq > 1 (folded prefill rows) costs nothing extra: query row i of a sequence of length L
  sees keys 0 .. L - Lq + i, and is its own threadgroup.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

KERNEL_NAME = "paged_attention_decode"
INPUT_NAMES = ["queries", "k_pool", "v_pool", "block_tables", "context_lengths", "scale"]
OUTPUT_NAMES = ["out"]
SIMD_WIDTH = 32
THREADGROUP_MEMORY_LIMIT = 32 * 1024
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (mx.float32, mx.float16, mx.bfloat16)

KERNEL_BODY = """
    // One threadgroup: one KV head x one sequence x one query row (see the module docstring).
    const uint kv_head = threadgroup_position_in_grid.x;
    const uint seq = threadgroup_position_in_grid.y;
    const uint q_row = threadgroup_position_in_grid.z;
    const uint simd_group = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const uint tid = thread_index_in_threadgroup;
    constexpr int THREADS = NUM_SIMDGROUPS * 32;
    constexpr int PER_LANE = HEAD_DIM / 32;  // head-dim elements a lane accumulates
    // "No score yet": finite, so the softmax stays exact even where a pipeline is compiled
    // with fast math (no infinities assumed); exp2(NO_SCORE - any real score) is 0.
    constexpr float NO_SCORE = -1.0e30f;
    const int num_heads = queries_shape[1];
    const int num_queries = queries_shape[2];
    const int num_kv_heads = k_pool_shape[1];
    const int max_blocks = block_tables_shape[1];
    // Keys this query row sees: positions 0 .. visible - 1 (causal within the Lq rows).
    const int visible = context_lengths[seq] - num_queries + int(q_row) + 1;
    const int num_blocks = (visible + BLOCK_SIZE - 1) / BLOCK_SIZE;

    threadgroup float q_tile[GROUP * HEAD_DIM];
    threadgroup float probs[NUM_SIMDGROUPS * GROUP * BLOCK_SIZE];
    threadgroup float part_acc[NUM_SIMDGROUPS * GROUP * HEAD_DIM];
    threadgroup float part_max[NUM_SIMDGROUPS * GROUP];
    threadgroup float part_sum[NUM_SIMDGROUPS * GROUP];

    // Queries pre-scaled by scale * log2(e): the softmax runs on exp2.
    const float q_scale = scale * 1.4426950408889634f;
    for (int i = int(tid); i < GROUP * HEAD_DIM; i += THREADS) {
        const int head = int(kv_head) * GROUP + i / HEAD_DIM;
        const int64_t row = (int64_t(seq) * num_heads + head) * num_queries + q_row;
        q_tile[i] = float(queries[row * HEAD_DIM + i % HEAD_DIM]) * q_scale;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    float run_max[GROUP];
    float run_sum[GROUP];
    float acc[GROUP][PER_LANE];
    for (int g = 0; g < GROUP; ++g) {
        run_max[g] = NO_SCORE;
        run_sum[g] = 0.0f;
        for (int j = 0; j < PER_LANE; ++j) {
            acc[g][j] = 0.0f;
        }
    }

    for (int blk = int(simd_group); blk < num_blocks; blk += NUM_SIMDGROUPS) {
        const int64_t first_slot = int64_t(block_tables[int64_t(seq) * max_blocks + blk]) * BLOCK_SIZE;
        const int valid = metal::min(BLOCK_SIZE, visible - blk * BLOCK_SIZE);
        const bool live = int(lane) < valid;  // lane t scores token t of the block
        float score[GROUP];
        for (int g = 0; g < GROUP; ++g) {
            score[g] = NO_SCORE;
        }
        if (live) {
            const int64_t key_at = ((first_slot + lane) * num_kv_heads + kv_head) * HEAD_DIM;
            for (int g = 0; g < GROUP; ++g) {
                float qk = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) {
                    qk += q_tile[g * HEAD_DIM + d] * float(k_pool[key_at + d]);
                }
                score[g] = qk;
            }
        }
        const int probs_at = int(simd_group) * GROUP * BLOCK_SIZE;
        for (int g = 0; g < GROUP; ++g) {
            // valid >= 1, so the block max is a real score; idle lanes get probability 0.
            const float new_max = metal::max(run_max[g], simd_max(score[g]));
            const float p = live ? metal::exp2(score[g] - new_max) : 0.0f;
            const float rescale = metal::exp2(run_max[g] - new_max);
            run_sum[g] = run_sum[g] * rescale + simd_sum(p);
            run_max[g] = new_max;
            for (int j = 0; j < PER_LANE; ++j) {
                acc[g][j] *= rescale;
            }
            if (int(lane) < BLOCK_SIZE) {
                probs[probs_at + g * BLOCK_SIZE + lane] = p;
            }
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (int t = 0; t < valid; ++t) {
            const int64_t value_at = ((first_slot + t) * num_kv_heads + kv_head) * HEAD_DIM;
            for (int j = 0; j < PER_LANE; ++j) {
                const float v = float(v_pool[value_at + j * 32 + lane]);
                for (int g = 0; g < GROUP; ++g) {
                    acc[g][j] += probs[probs_at + g * BLOCK_SIZE + t] * v;
                }
            }
        }
        // The next block overwrites this simdgroup's probabilities.
        simdgroup_barrier(mem_flags::mem_threadgroup);
    }

    // Merge the simdgroups' partial softmaxes (a simdgroup with no block has max NO_SCORE).
    for (int g = 0; g < GROUP; ++g) {
        const int part = int(simd_group) * GROUP + g;
        if (lane == 0) {
            part_max[part] = run_max[g];
            part_sum[part] = run_sum[g];
        }
        for (int j = 0; j < PER_LANE; ++j) {
            part_acc[part * HEAD_DIM + j * 32 + lane] = acc[g][j];
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = int(tid); i < GROUP * HEAD_DIM; i += THREADS) {
        const int g = i / HEAD_DIM;
        float best = NO_SCORE;
        for (int s = 0; s < NUM_SIMDGROUPS; ++s) {
            best = metal::max(best, part_max[s * GROUP + g]);
        }
        float numer = 0.0f;
        float denom = 0.0f;
        for (int s = 0; s < NUM_SIMDGROUPS; ++s) {
            const float w = metal::exp2(part_max[s * GROUP + g] - best);
            numer += w * part_acc[(s * GROUP + g) * HEAD_DIM + i % HEAD_DIM];
            denom += w * part_sum[s * GROUP + g];
        }
        const int head = int(kv_head) * GROUP + g;
        const int64_t row = (int64_t(seq) * num_heads + head) * num_queries + q_row;
        out[row * HEAD_DIM + i % HEAD_DIM] = static_cast<QueryT>(numer / denom);
    }
"""


def threadgroup_bytes(*, group: int, head_dim: int, block_size: int, num_simdgroups: int) -> int:
    """Threadgroup memory the body declares, in bytes (all fp32)."""
    floats = group * head_dim + num_simdgroups * group * (block_size + head_dim + 2)
    return 4 * floats


def pick_num_simdgroups(*, group: int, head_dim: int, block_size: int) -> int | None:
    """The most simdgroups (4, 2, 1) whose threadgroup memory fits; None if none does."""
    for count in (4, 2, 1):
        need = threadgroup_bytes(
            group=group, head_dim=head_dim, block_size=block_size, num_simdgroups=count
        )
        if need <= THREADGROUP_MEMORY_LIMIT:
            return count
    return None


class Launch(NamedTuple):
    """Everything one call of the kernel takes, as keyword arguments of the callable that
    `mx.fast.metal_kernel` returns (the emulator takes the same)."""

    inputs: list
    template: list
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: list
    output_dtypes: list


def with_options(launch: Launch, *, window: int | None, sinks: mx.array | None) -> Launch:
    """A launch of the variant `metal.window.kernel_spec` names for `window` and `sinks`:
    the window as the template constant WINDOW, the sinks (float32) as the last input."""
    if window is not None:
        launch = launch._replace(template=[*launch.template, ("WINDOW", window)])
    if sinks is not None:
        launch = launch._replace(inputs=[*launch.inputs, sinks.astype(mx.float32)])
    return launch


def unsupported_reason(*, pool_dtype, head_dim: int, block_size: int, group: int) -> str | None:
    """Why the kernel can't serve this shape, or None."""
    if pool_dtype not in SUPPORTED_DTYPES:
        return f"pool dtype {pool_dtype} (kernel: float32, float16, bfloat16)"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {head_dim} (kernel: {SUPPORTED_HEAD_DIMS})"
    if block_size not in SUPPORTED_BLOCK_SIZES:
        return f"block_size {block_size} (kernel: {SUPPORTED_BLOCK_SIZES})"
    if pick_num_simdgroups(group=group, head_dim=head_dim, block_size=block_size) is None:
        return f"GQA group {group} at head_dim {head_dim}: threadgroup memory over 32 KiB"
    return None


def make_launch(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
) -> Launch:
    """The launch of one paged-attention call; raises NotImplementedError on a shape the
    kernel does not serve (inputs already validated by `worker.attention.paged`)."""
    batch, num_heads, num_queries, head_dim = queries.shape
    group = num_heads // k_pool.shape[1]
    reason = unsupported_reason(
        pool_dtype=k_pool.dtype, head_dim=head_dim, block_size=block_size, group=group
    )
    if reason is not None:
        raise NotImplementedError(f"the Metal paged-attention kernel does not serve {reason}")
    simdgroups = pick_num_simdgroups(group=group, head_dim=head_dim, block_size=block_size)
    threads = simdgroups * SIMD_WIDTH
    return Launch(
        inputs=[
            queries,
            k_pool,
            v_pool,
            block_tables.astype(mx.int32),
            context_lengths.astype(mx.int32),
            mx.array(scale, dtype=mx.float32),
        ],
        template=[
            ("QueryT", queries.dtype),
            ("BLOCK_SIZE", block_size),
            ("HEAD_DIM", head_dim),
            ("GROUP", group),
            ("NUM_SIMDGROUPS", simdgroups),
        ],
        grid=(threads * k_pool.shape[1], batch, num_queries),
        threadgroup=(threads, 1, 1),
        output_shapes=[queries.shape],
        output_dtypes=[queries.dtype],
    )
