"""The SIMT emulator itself, on small kernels with known answers: if it were broken (barriers
that don't wait, collectives that mix lanes), the paged-attention tests could pass wrongly."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.support.metal_emulator import EmulatedKernel, require_compiler, signature

require_compiler()
pytestmark = pytest.mark.timeout(120, method="thread")  # a deadlocked emulator fails, not hangs

GROUP = 64
REDUCE_BODY = """
    threadgroup float partial[64];
    const uint tid = thread_index_in_threadgroup;
    const uint group = threadgroup_position_in_grid.x;
    partial[tid] = inp[group * 64 + tid];
    BARRIER
    if (tid == 0) {
        float total = 0.0f;
        for (int i = 0; i < 64; ++i) {
            total += partial[i];
        }
        out[group] = total;
    }
"""


def _reduce(with_barrier: bool, values: np.ndarray, stagger_us: int) -> np.ndarray:
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);" if with_barrier else ""
    kernel = EmulatedKernel(
        f"reduce_{int(with_barrier)}", ["inp"], ["out"], REDUCE_BODY.replace("BARRIER", barrier)
    )
    groups = values.size // GROUP
    (out,) = kernel(
        inputs=[mx.array(values)],
        grid=(values.size, 1, 1),
        threadgroup=(GROUP, 1, 1),
        output_shapes=[(groups,)],
        output_dtypes=[mx.float32],
        stagger_us=stagger_us,
    )
    return np.array(out)


def test_threadgroup_reduction_with_barrier_is_exact():
    values = np.arange(3 * GROUP, dtype=np.float32) + 1
    want = values.reshape(3, GROUP).sum(axis=1)
    np.testing.assert_array_equal(_reduce(True, values, stagger_us=5000), want)


def test_missing_barrier_is_caught():
    """The canary: thread 0 reads the other threads' slots with no barrier. The driver delays
    every other thread, so the read happens before the writes and the sums come out wrong."""
    values = np.arange(3 * GROUP, dtype=np.float32) + 1
    want = values.reshape(3, GROUP).sum(axis=1)
    got = _reduce(False, values, stagger_us=20000)
    assert not np.array_equal(got, want)
    assert got[0] < want[0]  # the first threadgroup saw mostly unwritten (zero) slots


SIMD_BODY = """
    const uint tid = thread_position_in_grid.x;
    const float x = inp[tid];
    sums[tid] = simd_sum(x);
    maxes[tid] = simd_max(x);
    mins[tid] = simd_min(x);
    down[tid] = simd_shuffle_down(x, 3u);
    first[tid] = simd_broadcast(x, 0u);
    lanes[tid] = float(thread_index_in_simdgroup) + 100.0f * float(simdgroup_index_in_threadgroup);
"""


def _run_simd(threads: int, threadgroup: int) -> dict[str, np.ndarray]:
    names = ["sums", "maxes", "mins", "down", "first", "lanes"]
    kernel = EmulatedKernel("simd_ops", ["inp"], names, SIMD_BODY)
    values = np.random.default_rng(0).permutation(threads).astype(np.float32)
    outs = kernel(
        inputs=[mx.array(values)],
        grid=(threads, 1, 1),
        threadgroup=(threadgroup, 1, 1),
        output_shapes=[(threads,)] * len(names),
        output_dtypes=[mx.float32] * len(names),
    )
    return {"inp": values, **{n: np.array(o) for n, o in zip(names, outs, strict=True)}}


@pytest.mark.parametrize("threads,threadgroup", [(64, 64), (40, 40), (96, 48)])
def test_simd_collectives_stay_within_each_simdgroup(threads, threadgroup):
    got = _run_simd(threads, threadgroup)
    x = got["inp"]
    for start in range(0, threads, threadgroup):
        for s0 in range(start, min(start + threadgroup, threads), 32):
            lanes = slice(s0, min(s0 + 32, start + threadgroup, threads))
            group = x[lanes]
            np.testing.assert_allclose(got["sums"][lanes], group.sum(), rtol=1e-6)
            np.testing.assert_array_equal(got["maxes"][lanes], group.max())
            np.testing.assert_array_equal(got["mins"][lanes], group.min())
            np.testing.assert_array_equal(got["first"][lanes], group[0])
            width = group.size
            want_down = [group[i + 3] if i + 3 < width else group[i] for i in range(width)]
            np.testing.assert_array_equal(got["down"][lanes], want_down)
            simd = (s0 - start) // 32
            np.testing.assert_array_equal(got["lanes"][lanes], np.arange(width) + 100 * simd)


def test_shuffle_down_tree_reduction():
    """The classic log-step reduction through simd_shuffle_down: lane 0 ends with the sum."""
    body = """
        float x = inp[thread_position_in_grid.x];
        for (uint offset = 16; offset > 0; offset /= 2) {
            x += simd_shuffle_down(x, offset);
        }
        if (thread_index_in_simdgroup == 0) {
            out[thread_position_in_grid.x / 32] = x;
        }
    """
    values = np.arange(128, dtype=np.float32)
    (out,) = EmulatedKernel("tree", ["inp"], ["out"], body)(
        inputs=[mx.array(values)],
        grid=(128, 1, 1),
        threadgroup=(64, 1, 1),
        output_shapes=[(4,)],
        output_dtypes=[mx.float32],
    )
    np.testing.assert_array_equal(np.array(out), values.reshape(4, 32).sum(axis=1))


def test_half_and_bfloat16_round_trip_through_the_shim():
    body = """
        const uint i = thread_position_in_grid.x;
        out[i] = static_cast<T>(float(inp[i]) * 2.0f);
    """
    x = mx.random.normal((64,))
    for dtype in (mx.float16, mx.bfloat16):
        (out,) = EmulatedKernel("scale2", ["inp"], ["out"], body)(
            inputs=[x.astype(dtype)],
            template=[("T", dtype)],
            grid=(64, 1, 1),
            threadgroup=(32, 1, 1),
            output_shapes=[(64,)],
            output_dtypes=[dtype],
        )
        assert out.dtype == dtype
        want = (x.astype(dtype).astype(mx.float32) * 2).astype(dtype)
        assert mx.array_equal(out, want).item()


def test_signature_matches_mlx_rules():
    inputs = [mx.zeros((16, 4)), mx.zeros((3,), dtype=mx.int32), mx.array(1.0)]
    body = "out[0] = a[a_shape[1]] + b[0] + s; uint x = thread_position_in_grid.x;"
    source, slots, attrs = signature.kernel_source(
        "k", ["a", "b", "s"], ["out"], body, "", inputs, [mx.float16], [("T", mx.float32)]
    )
    assert "template <typename T>" in source
    assert "const device float* a [[buffer(0)]]" in source
    assert "const constant int* a_shape [[buffer(1)]]" in source
    assert "const constant int32_t* b [[buffer(2)]]" in source  # < 8 elements: constant
    assert "const constant float& s [[buffer(3)]]" in source  # 0-d: by reference
    assert "device float16_t* out [[buffer(4)]]" in source
    assert "uint3 thread_position_in_grid [[thread_position_in_grid]]" in source
    assert [s.kind for s in slots] == ["array", "shape", "array", "scalar"]
    assert attrs == [("thread_position_in_grid", "uint3")]


def _mlx_generates_sources() -> bool:
    from tests.support.metal_emulator.mlx_source import source_from_mlx

    call = dict(
        inputs=[mx.zeros((4,))],
        grid=(4, 1, 1),
        threadgroup=(4, 1, 1),
        output_shapes=[(4,)],
        output_dtypes=[mx.float32],
    )
    return source_from_mlx("probe", ["a"], ["b"], "b[0] = a[0];", "", call) is not None


needs_mlx_source = pytest.mark.skipif(
    not _mlx_generates_sources(), reason="this MLX does not generate sources while exporting"
)


@needs_mlx_source
def test_emulator_compiles_exactly_what_mlx_generates():
    import worker.attention.metal.source as ks
    from worker.attention.metal.kernel import paged_attention_metal

    kernels = []

    def recording_factory(*args, **kwargs):
        kernels.append(EmulatedKernel(*args, **kwargs))
        return kernels[-1]

    queries, pool = mx.ones((3, 6, 1, 64)), mx.ones((32, 2, 64))
    tables, lengths = mx.zeros((3, 4), dtype=mx.int32), mx.array([3, 8, 1], dtype=mx.int32)
    paged_attention_metal(
        queries,
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
    assert ks.KERNEL_BODY in kernel.last_source
    assert "const constant float& scale [[buffer(8)]]" in kernel.last_source


@needs_mlx_source
def test_a_signature_that_drifts_from_mlx_is_refused(monkeypatch):
    from tests.support.metal_emulator import SignatureMismatch

    monkeypatch.setattr(signature, "MAX_CONSTANT_ARRAY_SIZE", 2)  # MLX says 8
    kernel = EmulatedKernel("drift", ["a"], ["b"], "b[0] = a[0];")
    with pytest.raises(SignatureMismatch, match="const constant float"):
        kernel(
            inputs=[mx.zeros((4,))],
            grid=(1, 1, 1),
            threadgroup=(1, 1, 1),
            output_shapes=[(1,)],
            output_dtypes=[mx.float32],
        )
