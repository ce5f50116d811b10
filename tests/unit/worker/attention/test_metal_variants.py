"""The Metal kernel's split-K and prefix-grouped variants (`worker.attention.metal.variants`),
run through the SIMT emulator, against the MLX-ops reference (`gather_attention`) in float32
on the very values the kernel reads; same tolerances as the plain kernel's tests (the
variants add one fp32 log-sum-exp merge, far below the output rounding). Covered: block sizes
8/16/32, head dims 64/128, GQA 1-8, the three dtypes, 8- and 4-bit quantized pools, contexts
of up to 96 blocks in up to 12 parts, prefixes shared by 2-5 rows (more than one chunk of R
rows), partial last blocks, rows without a prefix beside grouped ones."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.support.metal_emulator import EmulatedKernel, require_compiler
from tests.unit.worker.attention.test_metal_kernel import DTYPES, TOLERANCE, make_batch
from tests.unit.worker.attention.test_metal_kernel_quant import dequantized_f32, quantize
from worker.attention.metal import plan as metal_plan
from worker.attention.metal import variants as metal_variants
from worker.attention.metal.kernel import paged_attention_metal
from worker.attention.mlx_ops import gather_attention

require_compiler()
pytestmark = pytest.mark.timeout(300, method="thread")


def reference(queries, k, v, tables, lengths, **common):
    if hasattr(k, "packed"):
        k, v = dequantized_f32(k), dequantized_f32(v)
    f32 = [x.astype(mx.float32) for x in (queries, k, v)]
    return gather_attention(*f32, tables, lengths, **common)


def run(plan, queries, k, v, tables, lengths, *, block_size):
    common = dict(
        scale=queries.shape[-1] ** -0.5, block_size=block_size, max_context=max(lengths.tolist())
    )
    got = paged_attention_metal(
        queries, k, v, tables, lengths, kernel_factory=EmulatedKernel, metal_plan=plan, **common
    )
    assert got.shape == queries.shape and got.dtype == queries.dtype
    want = reference(queries, k, v, tables, lengths, **common)
    return mx.abs(got.astype(mx.float32) - want).max().item()


def split_plan(lengths, *, block_size, parts):
    max_blocks = -(-max(lengths) // block_size)
    part_blocks = -(-max_blocks // parts)
    return metal_plan.MetalPlan("split", -(-max_blocks // part_blocks), part_blocks)


SPLIT_CASES = [
    # (block size, head dim, kv heads, GQA, Lq, lengths, parts, dtype, bits)
    (16, 128, 2, 4, 1, [96 * 16 - 5, 40, 1], 12, "float32", None),
    (8, 64, 1, 8, 1, [64 * 8 - 3, 9], 5, "float16", None),
    (32, 128, 1, 1, 2, [40 * 32 - 31, 2], 4, "bfloat16", None),
    (16, 64, 2, 3, 1, [48 * 16], 6, "float16", 8),
    (32, 128, 1, 4, 1, [30 * 32 - 7, 33], 3, "float32", 4),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: f"bs{c[0]}-d{c[1]}-{c[7]}-q{c[8]}")
def test_split_k_matches_reference(case):
    block_size, head_dim, kv_heads, group, lq, lengths, parts, dtype, bits = case
    rng = np.random.default_rng(block_size + head_dim + group)
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
    plan = split_plan(lengths, block_size=block_size, parts=parts)
    assert plan.parts == parts
    assert run(plan, queries, k, v, tables, lens, block_size=block_size) <= TOLERANCE[DTYPES[dtype]]


def shared_batch(rng, *, tenants, block_size, kv_heads, group, head_dim, dtype):
    """Rows of `tenants` [(rows, shared blocks, [own tokens per row])] plus one lone row; each
    tenant's rows share its leading blocks, then each row has blocks of its own."""
    next_block, tables, lengths = 0, [], []
    for rows, shared, own in tenants:
        prefix = list(range(next_block, next_block + shared))
        next_block += shared
        for r in range(rows):
            mine = -(-own[r] // block_size)
            tables.append(prefix + list(range(next_block, next_block + mine)))
            next_block += mine
            lengths.append(shared * block_size + own[r])
    tables.append([next_block, next_block + 1])  # a lone row, no prefix
    lengths.append(block_size + 3)
    next_block += 2
    order = rng.permutation(next_block)  # shuffle physical block ids
    tables = [[int(order[b]) for b in t] for t in tables]
    width = max(map(len, tables))
    padded = [t + [t[0]] * (width - len(t)) for t in tables]
    shape = (next_block * block_size, kv_heads, head_dim)
    k, v = (mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype) for _ in "kv")
    q = rng.normal(size=(len(tables), kv_heads * group, 1, head_dim)).astype(np.float32)
    return (
        tables,
        lengths,
        (mx.array(q).astype(dtype), k, v, mx.array(padded), mx.array(lengths, dtype=mx.int32)),
    )


GROUPED_CASES = [
    # (block size, head dim, kv heads, GQA, tenants, dtype, bits)
    (16, 128, 2, 4, [(5, 6, [3, 17, 16, 40, 1]), (2, 3, [20, 5])], "float32", None),
    (8, 64, 1, 8, [(3, 10, [1, 8, 30])], "float16", None),
    (32, 128, 1, 1, [(4, 2, [31, 1, 64, 33]), (2, 1, [2, 3])], "bfloat16", None),
    (16, 64, 2, 2, [(3, 4, [5, 16, 9])], "float16", 8),
    (32, 128, 1, 4, [(2, 3, [7, 40])], "float32", 4),
]


@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: f"bs{c[0]}-d{c[1]}-{c[5]}-q{c[6]}")
def test_prefix_grouped_matches_reference(case):
    block_size, head_dim, kv_heads, group, tenants, dtype, bits = case
    rng = np.random.default_rng(block_size * head_dim + group)
    tables, lengths, (queries, k, v, tab, lens) = shared_batch(
        rng,
        tenants=tenants,
        block_size=block_size,
        kv_heads=kv_heads,
        group=group,
        head_dim=head_dim,
        dtype=DTYPES[dtype],
    )
    if bits is not None:
        k, v = quantize(k, bits, 64), quantize(v, bits, 64)
    plan = metal_plan.plan_forward(
        lengths=lengths,
        num_queries=1,
        num_heads=kv_heads * group,
        k_pool=k,
        block_size=block_size,
        host_tables=tables,
        only="grouped",
    )
    assert plan.variant == "grouped"
    grouped = plan.grouped
    assert bool(grouped.has_prefix[-1].item()) is False  # the lone row
    assert run(plan, queries, k, v, tab, lens, block_size=block_size) <= TOLERANCE[DTYPES[dtype]]


def test_grouped_threadgroup_reads_each_shared_block_once_per_chunk():
    """The grid: one threadgroup per (KV head, chunk of R rows) over the shared blocks, so a
    prefix shared by 5 rows at GQA 4 (R 4 at head dim 128, block 16) is read twice, not 5x."""
    assert metal_plan.rows_per_chunk(group=4, head_dim=128, block_size=16) == 4
    assert metal_plan.rows_per_chunk(group=8, head_dim=128, block_size=16) == 2
    assert metal_plan.rows_per_chunk(group=1, head_dim=64, block_size=8) == 16
    tables = [[7, 8, 9, r + 10] for r in range(5)]
    plan = metal_plan.plan_grouped(
        tables, [16 * 3 + 5] * 5, block_size=16, num_kv_heads=2, group=4, head_dim=128
    )
    assert plan.grouped.chunk_rows.shape == (2, 4)
    assert plan.grouped.prefix_lengths.tolist() == [48, 48]
    assert plan.grouped.suffix_lengths.tolist() == [5] * 5


def test_planning_falls_back_where_a_variant_does_not_pay():
    # no sharing: grouping refused; a big batch: no split
    assert (
        metal_plan.plan_grouped(
            [[1, 2], [3, 4]], [20, 20], block_size=16, num_kv_heads=1, group=4, head_dim=64
        )
        is None
    )
    assert metal_plan.choose_split(256, 512, 16) == (1, 512)
    assert metal_plan.choose_split(8, 512, 16) == (16, 32)  # 8 KV heads x batch 1, 8k tokens
    assert metal_plan.choose_split(8, 15, 16) == (1, 15)  # short rows are never split
    # variants are off until their self-test passed here
    assert (
        metal_plan.plan_forward(
            lengths=[8192],
            num_queries=1,
            num_heads=32,
            k_pool=mx.zeros((16, 8, 128)),
            block_size=16,
        ).variant
        == "plain"
    )


def test_a_wrong_merge_is_caught(monkeypatch):
    """The comparison can fail: dropping the max rescale in the merge gives wrong outputs."""
    rng = np.random.default_rng(5)
    batch = make_batch(
        rng,
        lengths=[20 * 16],
        block_size=16,
        num_kv_heads=1,
        group=1,
        head_dim=64,
        num_queries=1,
        dtype=mx.float32,
        extra_columns=0,
    )
    plan = split_plan([20 * 16], block_size=16, parts=4)
    right = metal_variants.combine
    monkeypatch.setattr(
        metal_variants,
        "combine",
        lambda p, dtype, sinks=None: right(p._replace(max=p.max * 0), dtype),
    )
    assert run(plan, *batch, block_size=16) > 1e-3


def test_start_up_self_test_of_the_variants_records_verdicts(monkeypatch):
    """`verify_metal_variants` on the emulator (small shapes): both variants match the
    reference; the timing verdict (emulator speed means nothing) is either way, and a
    forward uses a variant exactly when its verdict is recorded as passed."""
    from functools import partial

    from worker.attention import selftest
    from worker.attention.metal import kernel as metal_kernel

    monkeypatch.setattr(metal_kernel, "metal_reason", lambda: None)
    emulated = partial(metal_kernel.paged_attention_metal, kernel_factory=EmulatedKernel)
    monkeypatch.setattr(metal_kernel, "paged_attention_metal", emulated)
    monkeypatch.setitem(
        selftest.VARIANT_BATCHES,
        "split",
        lambda **kw: selftest.random_decode_batch(batch=1, context=600, **kw),
    )
    monkeypatch.setitem(
        selftest.VARIANT_BATCHES,
        "grouped",
        lambda **kw: selftest.shared_prefix_batch(rows=4, tenants=2, prefix=64, own=20, **kw),
    )
    monkeypatch.setattr(metal_plan, "VERDICTS", metal_plan._VariantVerdicts())
    results = selftest.verify_metal_variants(
        block_size=8, dtype=mx.float16, num_heads=4, num_kv_heads=1, head_dim=64, repeats=1
    )
    assert set(results) == {"split", "grouped", "window", "sinks"}
    for feature in ("window", "sinks"):  # right is all they must be
        assert results.pop(feature).reason.startswith("matches")
        assert metal_plan.VERDICTS.enabled(feature)
    for variant, result in results.items():
        assert result.max_error is not None and result.max_error <= selftest.TOLERANCE[mx.float16]
        assert result.reason.startswith("matches" if result.ok else "slower"), result.reason
        assert "the plain kernel" in result.reason
        assert metal_plan.VERDICTS.enabled(variant) is result.ok


def test_a_window_or_sinks_variant_that_fails_its_self_test_is_not_used(monkeypatch):
    """A kernel whose window variant is wrong: the start-up self-test says so, and the metal
    backend's windowed calls then run the MLX-ops reference (plain calls stay on the kernel)."""
    from functools import partial

    from worker.attention import selftest
    from worker.attention.metal import kernel as metal_kernel
    from worker.attention.paged import BACKENDS

    def broken(*args, window=None, **kw):  # treats every window as twice as wide
        return partial(paged_attention_metal, kernel_factory=EmulatedKernel)(
            *args, window=None if window is None else 2 * window, **kw
        )

    calls = []
    monkeypatch.setattr(metal_kernel, "metal_reason", lambda: None)
    monkeypatch.setattr(
        metal_kernel,
        "paged_attention_metal",
        lambda *a, **kw: calls.append(kw.get("window")) or broken(*a, **kw),
    )
    monkeypatch.setattr(metal_plan, "VERDICTS", metal_plan._VariantVerdicts())
    monkeypatch.setattr(selftest, "VARIANT_BATCHES", {})
    results = selftest.verify_metal_variants(
        block_size=8, dtype=mx.float32, num_heads=4, num_kv_heads=2, head_dim=64, repeats=1
    )
    assert not results["window"].ok and "max error" in results["window"].reason
    assert results["sinks"].ok and metal_plan.VERDICTS.enabled("sinks")
    assert not metal_plan.VERDICTS.enabled("window")
    batch = selftest.random_decode_batch(
        batch=2,
        context=100,
        block_size=8,
        dtype=mx.float32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
    )
    calls.clear()
    got = selftest.plan_call(BACKENDS["metal"], batch, 8, window=21)()
    want = selftest.plan_call(BACKENDS["mlx"], batch, 8, window=21)()
    assert calls == [] and mx.allclose(got, want, atol=1e-5)  # the reference served it
    selftest.plan_call(BACKENDS["metal"], batch, 8)()
    assert calls == [None]  # a call without a window is still the kernel's
