"""The Metal kernel's sliding-window and sink variants (`worker.attention.metal.window`), run
through the SIMT emulator, against the MLX-ops reference (`gather_attention` with the same
`window` and `sinks`, itself checked against dense SDPA in `test_window_sinks`) in float32 on
the very values the kernel reads; the plain kernel's tolerances. Covered: the plain and
quantized bodies, split-K over a window's blocks (sinks merged once in `combine`), prefix-
grouped with sinks, windows that start mid-block, contexts past 4W, Lq > 1 rows that straddle
the window's edge, GQA 1-8, the three dtypes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.support.metal_emulator import EmulatedKernel, require_compiler
from tests.unit.worker.attention.test_metal_kernel import DTYPES, TOLERANCE, make_batch
from tests.unit.worker.attention.test_metal_kernel_quant import dequantized_f32, quantize
from tests.unit.worker.attention.test_metal_variants import shared_batch, split_plan
from worker.attention.metal import plan as metal_plan
from worker.attention.metal import window as metal_window
from worker.attention.metal.kernel import paged_attention_metal
from worker.attention.mlx_ops import gather_attention

require_compiler()
pytestmark = pytest.mark.timeout(300, method="thread")


def sinks_for(num_heads: int) -> mx.array:
    return mx.array(
        [[0.5, -1.0, 3.0, 12.0, -30.0, 0.0, 1.5, -2.0][h % 8] for h in range(num_heads)]
    )


def error(plan, queries, k, v, tables, lengths, *, block_size, window, sinks) -> float:
    common = dict(
        scale=queries.shape[-1] ** -0.5,
        block_size=block_size,
        max_context=max(lengths.tolist()),
        window=window,
        sinks=sinks,
    )
    got = paged_attention_metal(
        queries, k, v, tables, lengths, kernel_factory=EmulatedKernel, metal_plan=plan, **common
    )
    assert got.shape == queries.shape and got.dtype == queries.dtype
    if hasattr(k, "packed"):
        k, v = dequantized_f32(k), dequantized_f32(v)
    f32 = [x.astype(mx.float32) for x in (queries, k, v)]
    want = gather_attention(*f32, tables, lengths, **common)
    return mx.abs(got.astype(mx.float32) - want).max().item()


CASES = [
    # (block size, head dim, kv heads, GQA, Lq, lengths, window, sinks, dtype, bits, parts)
    (16, 64, 2, 4, 1, [4 * 40 + 5, 30, 1, 40], 40, True, "float32", None, None),
    (8, 128, 1, 8, 1, [70, 9], None, True, "float16", None, None),
    (32, 64, 1, 1, 3, [200, 5, 3], 50, False, "bfloat16", None, None),
    (16, 128, 1, 4, 2, [5 * 24 + 3, 24], 24, True, "float32", 8, None),
    (8, 64, 2, 2, 1, [90, 17], 20, False, "float16", 4, None),
    (16, 64, 1, 4, 1, [6 * 80 + 7, 33], 80, True, "float32", None, 3),  # split-K, window and sinks
    (8, 64, 1, 2, 2, [60 * 8 - 3], None, True, "float16", 8, 4),  # split-K, sinks only
]


def case_id(case) -> str:
    bs, _, _, group, lq, _, window, sinks, dtype, bits, parts = case
    return f"bs{bs}-g{group}-lq{lq}-w{window}-s{int(sinks)}-{dtype}-q{bits}-p{parts}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_window_and_sink_variants_match_the_reference(case):
    block_size, head_dim, kv_heads, group, lq, lengths, window, use_sinks, dtype, bits, parts = case
    rng = np.random.default_rng(block_size + head_dim + group + lq)
    queries, k, v, tables, lens = make_batch(
        rng,
        lengths=lengths,
        block_size=block_size,
        num_kv_heads=kv_heads,
        group=group,
        head_dim=head_dim,
        num_queries=lq,
        dtype=DTYPES[dtype],
        extra_columns=1,
    )
    if bits is not None:
        k, v = quantize(k, bits, 64), quantize(v, bits, 64)
    plan = None
    if parts is not None:
        span = metal_window.window_blocks(-(-max(lengths) // block_size), window, block_size)
        plan = split_plan([span * block_size], block_size=block_size, parts=parts)
        assert plan.parts == parts
    sinks = sinks_for(kv_heads * group) if use_sinks else None
    got = error(
        plan, queries, k, v, tables, lens, block_size=block_size, window=window, sinks=sinks
    )
    assert got <= TOLERANCE[DTYPES[dtype]]


def test_prefix_grouped_with_sinks_matches_the_reference():
    rng = np.random.default_rng(11)
    tables, lengths, (queries, k, v, tab, lens) = shared_batch(
        rng,
        tenants=[(3, 4, [5, 16, 9]), (2, 2, [20, 1])],
        block_size=16,
        kv_heads=2,
        group=2,
        head_dim=64,
        dtype=mx.float32,
    )
    plan = metal_plan.plan_forward(
        lengths=lengths,
        num_queries=1,
        num_heads=4,
        k_pool=k,
        block_size=16,
        host_tables=tables,
        only="grouped",
    )
    assert plan.variant == "grouped"
    got = error(plan, queries, k, v, tab, lens, block_size=16, window=None, sinks=sinks_for(4))
    assert got <= TOLERANCE[mx.float32]


def test_a_windowed_forward_plans_split_k_over_its_window_and_never_groups():
    tables = [[7, 8, 9, 10 + r] for r in range(4)]
    grouped = metal_plan.plan_forward(
        lengths=[16 * 3 + 5] * 4,
        num_queries=1,
        num_heads=4,
        k_pool=mx.zeros((16, 1, 64)),
        block_size=16,
        host_tables=tables,
        only="grouped",
        window=32,
    )
    assert grouped.variant == "plain"
    split = metal_plan.plan_forward(
        lengths=[8192],
        num_queries=1,
        num_heads=8,
        only="split",
        k_pool=mx.zeros((16, 1, 64)),
        block_size=16,
        window=1024,
    )
    full = metal_plan.plan_forward(
        lengths=[8192],
        num_queries=1,
        num_heads=8,
        only="split",
        k_pool=mx.zeros((16, 1, 64)),
        block_size=16,
    )
    assert split.parts * split.part_blocks >= 1024 // 16 + 1  # the window's blocks, covered
    assert split.parts * split.part_blocks < full.parts * full.part_blocks


def test_the_edits_leave_the_plain_body_alone_and_compose():
    """The plain kernel's source is unchanged by the variants; each variant is its own
    pipeline name, and the sink is added once, in the final merge."""
    from worker.attention.metal import source, variants

    name, inputs, _, body = metal_window.kernel_spec(
        quantized=False, partial=False, windowed=False, sinks=False
    )
    assert (name, body) == (source.KERNEL_NAME, source.KERNEL_BODY)
    name, inputs, _, body = metal_window.kernel_spec(
        quantized=True, partial=False, windowed=True, sinks=True
    )
    assert name.endswith("_windowed_sinks") and inputs[-1] == "sinks"
    assert body.count("sink") == 5 and "first_key" in body
    name, inputs, _, body = metal_window.kernel_spec(
        quantized=False, partial=True, windowed=True, sinks=False
    )
    assert "sinks" not in inputs and "first_key / BLOCK_SIZE + part * split[1]" in body
    assert body != variants.KERNEL_BODY
    with pytest.raises(ValueError, match="partial"):
        metal_window.kernel_spec(quantized=False, partial=True, windowed=False, sinks=True)
