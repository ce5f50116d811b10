"""Paged attention against dense SDPA over each sequence's contiguous K/V, and the pool helpers."""

from __future__ import annotations

import math
from functools import partial

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.attention.mlx_ops import blockwise_attention, gather_attention
from worker.attention.paged import (
    BackendUnavailableError,
    paged_attention,
    resolve_backend,
    slot_ids,
    write_kv,
)
from worker.attention.tiles import plan_tiles, tiled_attention

STRATEGIES = {
    "gather": gather_attention,
    # Budgets this small cut the test batches into several groups, and walk long contexts
    # in key steps.
    "tiled": partial(tiled_attention, tile_bytes=20_000),
    "tiled_tiny": partial(tiled_attention, tile_bytes=1),
    "blockwise": blockwise_attention,
    "blockwise3": partial(blockwise_attention, blocks_per_step=3),
}


def make_paged(
    rng, lengths, num_queries, *, block_size=8, num_heads=9, num_kv_heads=3, head_dim=64, pad=0
):
    """Pools with spare blocks, tables of shuffled (non-contiguous) block ids, `pad` extra
    columns of padding, queries; and, per sequence, its K/V as a contiguous numpy array."""
    blocks_each = [math.ceil(n / block_size) for n in lengths]
    num_blocks = sum(blocks_each) + 5
    ids = rng.permutation(num_blocks)
    width = max(blocks_each) + pad
    tables = np.zeros((len(lengths), width), np.int32)  # padded with block 0
    k_pool = rng.standard_normal((num_blocks * block_size, num_kv_heads, head_dim), np.float32)
    v_pool = rng.standard_normal(k_pool.shape, np.float32)
    contiguous = []
    used = 0
    for b, (n, nb) in enumerate(zip(lengths, blocks_each, strict=True)):
        tables[b, :nb] = ids[used : used + nb]
        used += nb
        slots = [tables[b, j // block_size] * block_size + j % block_size for j in range(n)]
        contiguous.append((k_pool[slots], v_pool[slots]))
    queries = rng.standard_normal((len(lengths), num_heads, num_queries, head_dim), np.float32)
    arrays = [mx.array(a) for a in (queries, k_pool, v_pool, tables, np.array(lengths, np.int32))]
    return arrays, contiguous


def dense_reference(queries, contiguous, scale):
    """Per sequence: SDPA over its contiguous K/V; "causal" is lower-right aligned, which puts
    the Lq queries at the last Lq positions."""
    outs = []
    for b, (k, v) in enumerate(contiguous):
        q = queries[b : b + 1]
        k, v = (mx.array(a).swapaxes(0, 1)[None] for a in (k, v))
        mask = "causal" if q.shape[2] > 1 else None
        outs.append(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask))
    return np.array(mx.concatenate(outs))


def check_all_strategies(lengths, num_queries, *, seed=0, **shape):
    rng = np.random.default_rng(seed)
    block_size = shape.get("block_size", 8)
    arrays, contiguous = make_paged(rng, lengths, num_queries, **shape)
    scale = arrays[0].shape[-1] ** -0.5
    expected = dense_reference(arrays[0], contiguous, scale)
    got = paged_attention(*arrays, scale=scale, block_size=block_size, backend="mlx")
    assert got.shape == arrays[0].shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), expected, rtol=1e-5, atol=1e-5)
    for strategy in STRATEGIES.values():
        out = strategy(*arrays, scale=scale, block_size=block_size, max_context=max(lengths))
        np.testing.assert_allclose(np.array(out), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [1, 5, 8, 16, 21], ids=lambda n: f"ctx{n}")
def test_decode_single_sequence_mid_block_and_on_boundary(length):
    check_all_strategies([length], 1)


def test_decode_batch_of_very_different_lengths():
    check_all_strategies([1, 7, 8, 9, 64, 101, 16, 3], 1)


def test_prefill_chunk_attends_to_cached_prefix():
    check_all_strategies([45], 13)  # 32 cached tokens, a chunk ending mid-block
    check_all_strategies([40], 16)  # prefix and chunk both block-aligned
    check_all_strategies([70], 40)


def test_prefill_without_prefix():
    check_all_strategies([19], 19)


def test_prefill_chunks_batched_over_different_prefixes():
    check_all_strategies([12, 37, 24], 6)
    check_all_strategies([50, 33, 21], 20)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (6, 1)])
def test_gqa_ratios(num_heads, num_kv_heads):
    shape = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16)
    check_all_strategies([30, 9], 1, **shape)
    check_all_strategies([30, 17], 4, **shape)


def test_padded_block_table_columns_are_ignored():
    lengths = [10, 27]
    rng = np.random.default_rng(3)
    arrays, contiguous = make_paged(rng, lengths, 2, pad=4)
    queries, k_pool, v_pool, tables, context = arrays
    expected = dense_reference(queries, contiguous, 0.125)
    # Padding may hold any valid block id: fill every unused column with the pool's last block.
    padded = np.array(tables)
    for b, n in enumerate(lengths):
        padded[b, math.ceil(n / 8) :] = k_pool.shape[0] // 8 - 1
    for table in (tables, mx.array(padded)):
        got = paged_attention(queries, k_pool, v_pool, table, context, scale=0.125, block_size=8)
        np.testing.assert_allclose(np.array(got), expected, rtol=1e-5, atol=1e-5)


def test_output_keeps_the_queries_dtype():
    arrays, contiguous = make_paged(np.random.default_rng(4), [20, 5], 1, head_dim=16)
    queries = arrays[0].astype(mx.float16)
    got = paged_attention(queries, *arrays[1:], scale=0.25, block_size=8)
    assert got.dtype == mx.float16
    expected = dense_reference(arrays[0], contiguous, 0.25)
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), expected, atol=1e-2)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    num_queries=st.integers(1, 5),
    extra=st.lists(st.integers(0, 40), min_size=3, max_size=3),
    block_size=st.sampled_from([1, 4, 8, 16]),
    num_kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    head_dim=st.sampled_from([8, 16]),
    pad=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_matches_dense_on_random_shapes(
    batch, num_queries, extra, block_size, num_kv_heads, group, head_dim, pad, seed
):
    lengths = [num_queries + e for e in extra[:batch]]
    shape = dict(
        block_size=block_size,
        num_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        pad=pad,
    )
    check_all_strategies(lengths, num_queries, seed=seed, **shape)


def test_tiles_group_similar_lengths_under_the_budget():
    plan = plan_tiles([100, 10, 90, 20], key_bytes=11, block_size=4, budget=2000)
    assert plan.groups == [[0], [2, 3], [1]]
    assert plan.key_steps == [100, 90, 10]  # each group's context fits: one step


def test_context_over_budget_is_walked_in_key_steps():
    plan = plan_tiles([300, 280], key_bytes=100, block_size=8, budget=10_000)
    assert plan.groups == [[0], [1]] and plan.key_steps == [96, 96]
    assert plan_tiles([300], key_bytes=100, block_size=8, budget=10).key_steps == [8]
    assert plan_tiles([5], key_bytes=100, block_size=8, budget=10).key_steps == [5]


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(1, 500), min_size=1, max_size=20), budget=st.integers(1, 5000))
def test_tiles_cover_every_row_once(lengths, budget):
    plan = plan_tiles(lengths, key_bytes=3, block_size=4, budget=budget)
    assert sorted(row for group in plan.groups for row in group) == list(range(len(lengths)))
    for group, step in zip(plan.groups, plan.key_steps, strict=True):
        padded = len(group) * max(lengths[row] for row in group) * 3
        assert len(group) == 1 or padded <= budget
        longest = lengths[group[0]]
        # One step over the whole context, or (over budget only) whole blocks at a time.
        assert step == longest or (padded > budget and step % 4 == 0 and step < longest)


def test_auto_runs_mlx_where_metal_is_missing():
    if mx.metal.is_available():
        pytest.skip("Metal is present: auto may choose it")
    assert resolve_backend("auto").name == "mlx"


def test_metal_without_metal_raises_a_clear_error():
    if mx.metal.is_available():
        pytest.skip("Metal is present")
    arrays, _ = make_paged(np.random.default_rng(5), [4], 1)
    with pytest.raises(BackendUnavailableError, match=r"'metal'.*Metal is not available"):
        paged_attention(*arrays, scale=0.125, block_size=8, backend="metal")


def test_unknown_backend_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"'cuda'.*known: auto, metal, mlx"):
        resolve_backend("cuda")


@pytest.mark.parametrize("length", [2, 33], ids=["shorter than Lq", "past the table"])
def test_context_length_outside_the_contract_is_rejected(length):
    arrays, _ = make_paged(np.random.default_rng(6), [8], 3)
    arrays[4] = mx.array([length], dtype=mx.int32)
    with pytest.raises(ValueError, match=r"context_lengths\[0\]"):
        paged_attention(*arrays, scale=0.125, block_size=8)


def test_slot_ids_follow_the_block_table():
    tables = mx.array([[5, 2, 7], [1, 0, 0]], dtype=mx.int32)
    got = slot_ids(tables, mx.array([3, 0], dtype=mx.int32), num_tokens=3, block_size=4)
    assert got.dtype == mx.int32
    assert got.tolist() == [[23, 8, 9], [4, 5, 6]]


def test_write_kv_then_attend_matches_dense():
    """The model runner's path: write each step's K/V by slot ids, then attend over the pool."""
    rng = np.random.default_rng(7)
    block_size, prompt, steps = 4, 6, 3
    tables = mx.array([[3, 0, 6], [5, 1, 2]], dtype=mx.int32)
    k_pool, v_pool = mx.zeros((8 * block_size, 2, 8)), mx.zeros((8 * block_size, 2, 8))
    keys = rng.standard_normal((2, 2, prompt + steps, 8), np.float32)  # (B, Hkv, L, D)
    values = rng.standard_normal(keys.shape, np.float32)
    queries = mx.array(rng.standard_normal((2, 4, 1, 8), np.float32))
    chunks = [(0, prompt)] + [(prompt + i, 1) for i in range(steps)]
    for start, count in chunks:
        slots = slot_ids(tables, mx.array([start, start], dtype=mx.int32), count, block_size)
        new_k = mx.array(keys[:, :, start : start + count]).swapaxes(1, 2)
        new_v = mx.array(values[:, :, start : start + count]).swapaxes(1, 2)
        write_kv(k_pool, v_pool, slots, new_k, new_v)
        mx.eval(k_pool, v_pool)
    lengths = mx.array([prompt + steps] * 2, dtype=mx.int32)
    got = paged_attention(queries, k_pool, v_pool, tables, lengths, scale=0.3, block_size=4)
    expected = mx.fast.scaled_dot_product_attention(
        queries, mx.array(keys), mx.array(values), scale=0.3
    )
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5, atol=1e-5)
    untouched = np.ones(8 * block_size, bool)
    untouched[[s for b in (3, 0, 5, 1) for s in range(b * 4, b * 4 + 4)]] = False
    untouched[[6 * 4, 2 * 4]] = False  # the 9th token of each sequence
    assert not np.array(k_pool)[untouched].any() and not np.array(v_pool)[untouched].any()
