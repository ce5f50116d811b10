"""The Metal kernel's quantized variant (`--kv-bits 8|4`), run through the SIMT emulator,
against the MLX-ops quantized path over the same `worker.kv.quant.QuantizedKV` pools.

Two references: the MLX-ops backend itself on the quantized pools (what a worker without the
kernel computes; float32, where MLX's `quantized_matmul` runs in fp32 as the kernel does), and
`gather_attention` over the pools dequantized in float32 (the values the kernel reads), which
bounds the kernel's own error exactly as the unquantized tests do (same tolerances: the
dequantized values are at most as large as the inputs' range, a few units).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.metal_emulator import EmulatedKernel, require_compiler
from tests.unit.worker.attention.test_metal_kernel import DTYPES, TOLERANCE, make_batch
from worker.attention.metal import quant as metal_quant
from worker.attention.metal.kernel import paged_attention_metal
from worker.attention.mlx_ops import gather_attention
from worker.attention.tiles import tiled_attention
from worker.kv.quant import QuantizedKV

require_compiler()
pytestmark = pytest.mark.timeout(300, method="thread")


def quantize(pool: mx.array, bits: int, group_size: int) -> QuantizedKV:
    """The pool written through the worker's own quantized write."""
    slots, heads, head_dim = pool.shape
    out = QuantizedKV.zeros(
        slots, heads, head_dim, bits=bits, group_size=group_size, dtype=pool.dtype
    )
    out[mx.arange(slots)] = pool
    return out


def dequantized_f32(pool: QuantizedKV) -> mx.array:
    f32 = [pool.scales.astype(mx.float32), pool.biases.astype(mx.float32)]
    return mx.dequantize(pool.packed, *f32, group_size=pool.group_size, bits=pool.bits)


def run_case(rng, *, bits, group_size, dtype, block_size, **shape):
    queries, k, v, tables, lengths = make_batch(rng, block_size=block_size, dtype=dtype, **shape)
    k_q, v_q = quantize(k, bits, group_size), quantize(v, bits, group_size)
    common = dict(
        scale=queries.shape[-1] ** -0.5, block_size=block_size, max_context=max(lengths.tolist())
    )
    got = paged_attention_metal(
        queries, k_q, v_q, tables, lengths, kernel_factory=EmulatedKernel, **common
    )
    assert got.shape == queries.shape and got.dtype == queries.dtype
    q32 = queries.astype(mx.float32)
    exact = gather_attention(
        q32, dequantized_f32(k_q), dequantized_f32(v_q), tables, lengths, **common
    )
    error = mx.abs(got.astype(mx.float32) - exact).max().item()
    assert error <= TOLERANCE[dtype], (bits, group_size, dtype, error)
    return got, (queries, k_q, v_q, tables, lengths, common)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_every_layout_matches_the_mlx_ops_quantized_path(bits, group_size):
    """float32, head dim 128 (every group size divides it), GQA 4, partial last blocks,
    prefill rows (Lq 2): the kernel against the worker's MLX-ops backend on the same pools."""
    rng = np.random.default_rng(bits * 1000 + group_size)
    got, (queries, k_q, v_q, tables, lengths, common) = run_case(
        rng,
        bits=bits,
        group_size=group_size,
        dtype=mx.float32,
        block_size=16,
        lengths=[16 * 9 - 5, 17, 2],
        num_kv_heads=2,
        group=4,
        head_dim=128,
        num_queries=2,
        extra_columns=1,
    )
    for reference in (gather_attention, tiled_attention):
        want = reference(queries, k_q, v_q, tables, lengths, **common)
        assert mx.abs(got - want).max().item() <= 1e-4, reference.__name__


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_every_block_size(bits, dtype):
    for block_size, head_dim in ((8, 64), (16, 128), (32, 64)):
        rng = np.random.default_rng(block_size + bits)
        run_case(
            rng,
            bits=bits,
            group_size=64,
            dtype=DTYPES[dtype],
            block_size=block_size,
            lengths=[block_size * 5 - 3, 1],
            num_kv_heads=1,
            group=8,
            head_dim=head_dim,
            num_queries=1,
            extra_columns=2,
        )


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bits=st.sampled_from([8, 4]),
    group_size=st.sampled_from([32, 64]),
    block_size=st.sampled_from([8, 16, 32]),
    group=st.sampled_from([1, 3, 8]),
    dtype=st.sampled_from(list(DTYPES)),
    blocks=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_batches(bits, group_size, block_size, group, dtype, blocks, seed):
    rng = np.random.default_rng(seed)
    lengths = [max(1, n * block_size - int(rng.integers(0, block_size))) for n in blocks]
    run_case(
        rng,
        bits=bits,
        group_size=group_size,
        dtype=DTYPES[dtype],
        block_size=block_size,
        lengths=lengths,
        num_kv_heads=2,
        group=group,
        head_dim=64,
        num_queries=1,
        extra_columns=1,
    )


def test_a_wrong_unpacking_is_caught():
    """The comparison can fail: reading 4-bit values with the 8-bit mask differs."""
    broken = metal_quant.KERNEL_BODY.replace("(1u << BITS) - 1u", "0xFFu")
    assert broken != metal_quant.KERNEL_BODY

    def broken_factory(name, inputs, outputs, body, **kwargs):
        return EmulatedKernel(name + "_broken", inputs, outputs, broken, **kwargs)

    rng = np.random.default_rng(5)
    queries, k, v, tables, lengths = make_batch(
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
    k_q, v_q = quantize(k, 4, 32), quantize(v, 4, 32)
    common = dict(scale=0.125, block_size=8, max_context=40)
    got = paged_attention_metal(
        queries, k_q, v_q, tables, lengths, kernel_factory=broken_factory, **common
    )
    want = gather_attention(queries, k_q, v_q, tables, lengths, **common)
    assert mx.abs(got - want).max().item() > 1e-2


def test_the_variant_is_the_kernel_with_two_loads_swapped():
    """Anything else in the body (softmax, merge, causality) is the verified unquantized code."""
    from worker.attention.metal import source as metal_source

    body = metal_quant.KERNEL_BODY
    assert "k_pool" not in body and "v_pool" not in body
    tail = metal_source.KERNEL_BODY.split("// Merge the simdgroups")[1]
    assert body.endswith(tail)


def test_unsupported_layouts_say_why():
    queries = mx.zeros((1, 2, 1, 64))
    pool = QuantizedKV.zeros(16, 1, 64, bits=8, group_size=64, dtype=mx.float32)
    odd = pool._replace(group_size=16)
    tables, lengths = mx.zeros((1, 2), dtype=mx.int32), mx.array([3], dtype=mx.int32)
    with pytest.raises(NotImplementedError, match="--kv-group-size 16"):
        paged_attention_metal(
            queries,
            odd,
            odd,
            tables,
            lengths,
            scale=1.0,
            block_size=8,
            max_context=3,
            kernel_factory=EmulatedKernel,
        )


def test_emulator_compiles_what_mlx_generates_for_the_variant():
    """uint32 inputs and the BITS / QUANT_GROUP template: the signature MLX writes is ours."""
    from tests.unit.worker.attention.test_metal_emulator import needs_mlx_source

    if needs_mlx_source.args[0]:
        pytest.skip(needs_mlx_source.kwargs["reason"])
    kernels = []

    def recording_factory(*args, **kwargs):
        kernels.append(EmulatedKernel(*args, **kwargs))
        return kernels[-1]

    pool = quantize(mx.ones((32, 2, 64)), 4, 32)
    tables, lengths = mx.zeros((3, 4), dtype=mx.int32), mx.array([3, 8, 1], dtype=mx.int32)
    paged_attention_metal(
        mx.ones((3, 6, 1, 64)),
        pool,
        pool,
        tables,
        lengths,
        scale=0.125,
        block_size=8,
        max_context=8,
        kernel_factory=recording_factory,
    )
    (kernel,) = kernels
    assert kernel.checked_against_mlx
    assert "const device uint32_t* k_packed [[buffer(2)]]" in kernel.last_source
    assert metal_quant.KERNEL_BODY in kernel.last_source
