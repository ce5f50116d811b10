"""The Metal paged-attention kernel, run through the SIMT emulator, against the MLX-ops
reference (`gather_attention`) over random batches.

The reference runs in float32 on the very values the kernel reads (pools and queries rounded
to the pool dtype first), so the tolerances bound the kernel's own error: fp32 accumulation in
a different order, plus rounding the output to the dtype. Outputs are weighted means of unit
normals (|out| < 4), so the output rounding is at most half an ulp at 4: float16 2^-10 x 2 =
2e-3, bfloat16 2^-7 x 2 = 1.6e-2; float32 1e-5. Observed over 8 random cases per dtype
(64 blocks at most, GQA 1-8): float32 4.8e-7, float16 2.4e-4, bfloat16 1.9e-3.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.metal_emulator import EmulatedKernel, require_compiler
from worker.attention.metal.kernel import paged_attention_metal
from worker.attention.mlx_ops import gather_attention

require_compiler()
# A body that calls a simd collective in divergent control flow deadlocks the emulator: fail.
pytestmark = pytest.mark.timeout(300, method="thread")

TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1.6e-2}
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def make_batch(
    rng, *, lengths, block_size, num_kv_heads, group, head_dim, num_queries, dtype, extra_columns
):
    """Random pools, queries and shuffled block tables (padded with random valid ids)."""
    blocks_needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_needed) + 3  # spare blocks nobody owns: never read
    owner = rng.permutation(num_blocks)
    width = max(blocks_needed) + extra_columns
    tables = rng.integers(0, num_blocks, size=(len(lengths), width)).astype(np.int32)
    start = 0
    for row, need in enumerate(blocks_needed):
        tables[row, :need] = owner[start : start + need]
        start += need
    slots = num_blocks * block_size
    shape = (slots, num_kv_heads, head_dim)
    k_pool = mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype)
    v_pool = mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype)
    q_shape = (len(lengths), num_kv_heads * group, num_queries, head_dim)
    queries = mx.array(rng.normal(size=q_shape).astype(np.float32)).astype(dtype)
    return queries, k_pool, v_pool, mx.array(tables), mx.array(lengths, dtype=mx.int32)


def kernel_error(batch, *, block_size) -> float:
    queries, k_pool, v_pool, tables, lengths = batch
    scale = queries.shape[-1] ** -0.5
    common = dict(scale=scale, block_size=block_size, max_context=max(lengths.tolist()))
    got = paged_attention_metal(
        queries, k_pool, v_pool, tables, lengths, kernel_factory=EmulatedKernel, **common
    )
    assert got.shape == queries.shape and got.dtype == queries.dtype
    f32 = [x.astype(mx.float32) for x in (queries, k_pool, v_pool)]
    want = gather_attention(*f32, tables, lengths, **common)
    return mx.abs(got.astype(mx.float32) - want).max().item()


@st.composite
def batches(draw):
    block_size = draw(st.sampled_from([8, 16, 32]))
    num_queries = draw(st.sampled_from([1, 1, 1, 2, 3]))
    blocks = st.integers(1, 64)
    lengths = [
        max(num_queries, draw(blocks) * block_size - draw(st.integers(0, block_size - 1)))
        for _ in range(draw(st.integers(1, 3)))
    ]
    if draw(st.booleans()):
        lengths.append(num_queries)  # a minimal row, as a padded batch row would be
    return dict(
        lengths=lengths,
        block_size=block_size,
        num_kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 3, 4, 8])),
        head_dim=draw(st.sampled_from([64, 128])),
        num_queries=num_queries,
        dtype=draw(st.sampled_from(list(DTYPES))),
        extra_columns=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_kernel_matches_reference(case):
    dtype = DTYPES[case.pop("dtype")]
    rng = np.random.default_rng(case.pop("seed"))
    batch = make_batch(rng, dtype=dtype, **case)
    assert kernel_error(batch, block_size=case["block_size"]) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_long_partial_context_every_dtype(dtype):
    """The deterministic corner: 64 blocks, a partial last block, GQA 4, shuffled tables."""
    dtype = DTYPES[dtype]
    rng = np.random.default_rng(7)
    batch = make_batch(
        rng,
        lengths=[64 * 16 - 5, 17, 1],
        block_size=16,
        num_kv_heads=2,
        group=4,
        head_dim=128,
        num_queries=1,
        dtype=dtype,
        extra_columns=2,
    )
    assert kernel_error(batch, block_size=16) <= TOLERANCE[dtype]


def test_a_wrong_kernel_is_caught():
    """The comparison can fail: the same launch with an off-by-one visible length differs."""
    import worker.attention.metal.source as source

    broken = source.KERNEL_BODY.replace("+ int(q_row) + 1;", "+ int(q_row);")
    assert broken != source.KERNEL_BODY

    def broken_factory(name, inputs, outputs, body, **kwargs):
        return EmulatedKernel(name + "_broken", inputs, outputs, broken, **kwargs)

    rng = np.random.default_rng(3)
    queries, k_pool, v_pool, tables, lengths = make_batch(
        rng,
        lengths=[40],
        block_size=8,
        num_kv_heads=1,
        group=1,
        head_dim=64,
        num_queries=1,
        dtype=mx.float32,
        extra_columns=0,
    )
    common = dict(scale=0.125, block_size=8, max_context=40)
    got = paged_attention_metal(
        queries, k_pool, v_pool, tables, lengths, kernel_factory=broken_factory, **common
    )
    want = gather_attention(queries, k_pool, v_pool, tables, lengths, **common)
    assert mx.abs(got - want).max().item() > 1e-3


def test_unsupported_shapes_say_why():
    queries = mx.zeros((1, 2, 1, 96))
    pool = mx.zeros((16, 1, 96))
    tables, lengths = mx.zeros((1, 2), dtype=mx.int32), mx.array([3], dtype=mx.int32)
    with pytest.raises(NotImplementedError, match="head_dim 96"):
        paged_attention_metal(
            queries,
            pool,
            pool,
            tables,
            lengths,
            scale=1.0,
            block_size=8,
            max_context=3,
            kernel_factory=EmulatedKernel,
        )


def test_every_supported_shape_fits_apple_limits():
    """Threadgroup memory <= 32 KiB and threads <= 1024 for every served (GQA, head dim,
    block size); the emulator cannot feel either limit, so it is checked here."""
    from worker.attention.metal.source import pick_num_simdgroups, threadgroup_bytes

    for group in range(1, 17):
        for head_dim in (64, 128):
            for block_size in (8, 16, 32):
                count = pick_num_simdgroups(group=group, head_dim=head_dim, block_size=block_size)
                assert count is not None, (group, head_dim, block_size)
                assert count * 32 <= 1024
                need = threadgroup_bytes(
                    group=group, head_dim=head_dim, block_size=block_size, num_simdgroups=count
                )
                assert need <= 32 * 1024
                if group <= 8:
                    assert count == 4  # the common GQA ratios keep the full layout
