"""Sliding windows and attention sinks on every MLX-ops path, against dense SDPA (`sinks=`, a
boolean window mask) over each row's contiguous K/V: decode rows at contexts past 4W, prefill
chunks that straddle the window's edge, GQA, rows that share prefixes, quantized pools."""

from __future__ import annotations

import math
import random
from functools import partial

import mlx.core as mx
import numpy as np
import pytest

from worker.attention import shared_prefix
from worker.attention.mlx_ops import blockwise_attention, gather_attention
from worker.attention.paged import BACKENDS, AttentionPlan, paged_attention
from worker.attention.shared_prefix import plan_shared_prefixes, shared_prefix_attention
from worker.attention.tiles import prepare_tiles, tiled_attention
from worker.kv.quant import QuantizedKV

STRATEGIES = {
    "gather": gather_attention,
    "tiled": tiled_attention,
    "tiled_small": partial(tiled_attention, tile_bytes=6_000),  # several groups
    "tiled_tiny": partial(tiled_attention, tile_bytes=1),  # blockwise, a block per step
    "blockwise": blockwise_attention,
    "blockwise3": partial(blockwise_attention, blocks_per_step=3),
}
OPTIONS = {"sinks": (False, True), "window": (True, False), "both": (True, True)}
SINKS = [0.5, -1.0, 3.0, 25.0, -40.0, 0.0, 1.5, -2.0, 8.0]  # 25 drowns a head, -40 is nothing


def make_batch(
    rng, lengths, num_queries, *, block_size=4, num_heads=9, num_kv_heads=3, head_dim=16
):
    """Pools, shuffled block tables padded with block 0, queries, and each row's block ids."""
    blocks_each = [-(-n // block_size) for n in lengths]
    ids = [int(i) for i in rng.permutation(sum(blocks_each) + 3)]
    tables, used = [], 0
    for n in blocks_each:
        tables.append(ids[used : used + n])
        used += n
    shape = (len(ids) * block_size, num_kv_heads, head_dim)
    k_pool, v_pool = (mx.array(rng.standard_normal(shape, np.float32)) for _ in "kv")
    q_shape = (len(lengths), num_heads, num_queries, head_dim)
    queries = mx.array(rng.standard_normal(q_shape, np.float32))
    width = max(blocks_each)
    padded = mx.array([t + [0] * (width - len(t)) for t in tables], dtype=mx.int32)
    return queries, k_pool, v_pool, padded, mx.array(lengths, dtype=mx.int32), tables


def dense(queries, k_pool, v_pool, tables, lengths, *, block_size, window, sinks, scale):
    """Per row: SDPA over its contiguous K/V with the window rule as a boolean mask."""
    outs = []
    for b, n in enumerate(lengths):
        slots = [tables[b][j // block_size] * block_size + j % block_size for j in range(n)]
        k, v = (pool[mx.array(slots)].swapaxes(0, 1)[None] for pool in (k_pool, v_pool))
        num_queries = queries.shape[2]
        query_pos = np.arange(n - num_queries, n)[:, None]
        key_pos = np.arange(n)[None]
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos > query_pos - window
        outs.append(
            mx.fast.scaled_dot_product_attention(
                queries[b : b + 1],
                k,
                v,
                scale=scale,
                mask=mx.array(mask),
                sinks=sinks,
            )
        )
    return mx.concatenate(outs)


def options(name, num_heads, window):
    use_window, use_sinks = OPTIONS[name]
    sinks = mx.array(SINKS[:num_heads] + [0.25] * (num_heads - len(SINKS)))
    return (window if use_window else None), (sinks if use_sinks else None)


def check(lengths, num_queries, option, *, window, seed=0, quantize_bits=None, **shape):
    rng = np.random.default_rng(seed)
    block_size = shape.get("block_size", 4)
    queries, k_pool, v_pool, padded, context, tables = make_batch(
        rng, lengths, num_queries, **shape
    )
    window, sinks = options(option, queries.shape[1], window)
    scale = queries.shape[-1] ** -0.5
    if quantize_bits is not None:
        k_pool, v_pool = (quantized(p, quantize_bits) for p in (k_pool, v_pool))
        k_ref, v_ref = (
            k_pool.take(mx.arange(k_pool.shape[0])),
            v_pool.take(mx.arange(v_pool.shape[0])),
        )
    else:
        k_ref, v_ref = k_pool, v_pool
    want = dense(
        queries,
        k_ref,
        v_ref,
        tables,
        lengths,
        block_size=block_size,
        window=window,
        sinks=sinks,
        scale=scale,
    )
    common = dict(
        scale=scale, block_size=block_size, max_context=max(lengths), window=window, sinks=sinks
    )
    tolerance = 1e-5 if quantize_bits is None else 1e-4
    for name, strategy in STRATEGIES.items():
        got = strategy(queries, k_pool, v_pool, padded, context, **common)
        assert mx.abs(got - want).max().item() < tolerance, name
    plan = AttentionPlan(
        BACKENDS["mlx"], padded, lengths, block_size=block_size, host_tables=tables, window=window
    )
    got = plan(queries, k_pool, v_pool, scale=scale, sinks=sinks)
    assert mx.abs(got - want).max().item() < tolerance, "plan"
    return plan


def quantized(pool: mx.array, bits: int) -> QuantizedKV:
    slots, heads, head_dim = pool.shape
    out = QuantizedKV.zeros(slots, heads, head_dim, bits=bits, group_size=32, dtype=pool.dtype)
    out[mx.arange(slots)] = pool
    return out


W = 10  # not a multiple of the block size: windows start mid-block


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize(
    "lengths",
    [[1], [5], [W], [W + 1], [4 * W + 3], [1, 9, W, W + 1, 2 * W + 5, 4 * W + 1, 6 * W - 1]],
    ids=lambda n: "ctx" + "-".join(map(str, n)),
)
def test_decode_rows(lengths, option):
    check(lengths, 1, option, window=W)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize(
    "lengths,num_queries",
    [([30], 7), ([45, 13], 13), ([4 * W + 6, 22, 7], 7), ([50], 25), ([12], 12)],
    ids=["straddles", "no-cache-row", "batched", "chunk-over-2W", "chunk-from-0"],
)
def test_prefill_chunks_straddling_the_window_edge(lengths, num_queries, option):
    check(lengths, num_queries, option, window=W)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (6, 1)])
def test_gqa(num_heads, num_kv_heads, option):
    shape = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, block_size=8)
    check([5 * W, 3, 17], 1, option, window=W, **shape)
    check([5 * W, 17], 4, option, window=W, **shape)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_pools(bits, option):
    shape = dict(head_dim=32, num_heads=6, num_kv_heads=2)
    check([4 * W + 3, 7, W], 1, option, window=W, quantize_bits=bits, **shape)
    check([4 * W + 3, 20], 20, option, window=W, quantize_bits=bits, **shape)  # dequantizes


@pytest.mark.parametrize("window", [1, 3, 64])
def test_window_edges(window):
    """W 1 (each query sees itself only), W wider than every context (the full result)."""
    check([3, 30, 6], 3, "both", window=window, block_size=8)
    if window == 64:
        rng = np.random.default_rng(1)
        queries, k, v, padded, context, _ = make_batch(rng, [30, 6], 3)
        common = dict(scale=0.25, block_size=4)
        full = paged_attention(queries, k, v, padded, context, **common)
        wide = paged_attention(queries, k, v, padded, context, window=window, **common)
        assert mx.abs(full - wide).max().item() == 0.0


def test_a_windowed_plan_gathers_only_the_window():
    """A decode tick over 4W reads W keys per row, and (Lq + W - 1) for a prefill chunk."""
    plan = check([4 * W + 3, 40 * W], 1, "window", window=W)
    assert plan._prepared["tiles"].lengths == [W, W]
    assert plan._prepared["tiles"].gathers[0].rows.shape[-1] == W
    tiles = prepare_tiles([4 * W, 3], 5, 9, mx.zeros((8, 3, 16)), 4, window=W)
    assert tiles.lengths == [W + 4, 3]


def tenant_rows(rng: random.Random, block_size: int):
    """Decode rows of three tenants that share 6-block prefixes, and a long row alone."""
    blocks = iter(rng.sample(range(1, 300), 299))
    tenants = [[next(blocks) for _ in range(6)] for _ in range(3)]
    rows = [
        (tenants[t] + [next(blocks) for _ in range(2)], 6 * block_size + rng.randrange(1, 8))
        for t in range(3)
        for _ in range(3)
    ]
    rows.append(([next(blocks) for _ in range(20)], 20 * block_size - 1))
    return rows


@pytest.mark.parametrize("option", list(OPTIONS))
def test_decode_rows_sharing_prefixes(option, monkeypatch):
    """Sinks merge once into the shared-prefix plan's two parts; a windowed plan never takes
    the shared-prefix plan, and is exact over the same rows."""
    monkeypatch.setattr(shared_prefix, "SHARED_PREFIX_MIN_SAVING", 0.0)
    block_size, rng = 4, random.Random(5)
    rows = tenant_rows(rng, block_size)
    tables, lengths = [b for b, _ in rows], [n for _, n in rows]
    nprng = np.random.default_rng(2)
    shape = (300 * block_size, 3, 16)
    k_pool, v_pool = (mx.array(nprng.standard_normal(shape, np.float32)) for _ in "kv")
    queries = mx.array(nprng.standard_normal((len(rows), 9, 1, 16), np.float32))
    window, sinks = options(option, 9, W)
    want = dense(
        queries,
        k_pool,
        v_pool,
        tables,
        lengths,
        block_size=block_size,
        window=window,
        sinks=sinks,
        scale=0.25,
    )
    width = max(map(len, tables))
    padded = mx.array([t + [0] * (width - len(t)) for t in tables], dtype=mx.int32)
    plan = AttentionPlan(
        BACKENDS["mlx"], padded, lengths, block_size=block_size, host_tables=tables, window=window
    )
    got = plan(queries, k_pool, v_pool, scale=0.25, sinks=sinks)
    assert mx.abs(got - want).max().item() < 1e-5
    assert (plan._prepared["tiles"].shared is None) == (window is not None)
    if window is None:
        shared = plan_shared_prefixes(tables, lengths, block_size, 3)
        assert shared is not None and shared.loose is not None  # grouped and lone rows
        got = shared_prefix_attention(queries, k_pool, v_pool, shared, scale=0.25, sinks=sinks)
        assert mx.abs(got - want).max().item() < 1e-5


def test_a_sink_far_above_every_score_stays_finite():
    """exp(1e4) overflows float32: the combine shifts by max(row max, sink) first."""
    rng = np.random.default_rng(9)
    queries, k, v, padded, context, _ = make_batch(rng, [4 * W, 9], 2, num_heads=3, num_kv_heads=3)
    sinks = mx.array([1e4, -1e4, 0.0])
    common = dict(scale=0.25, block_size=4, max_context=4 * W, sinks=sinks)
    for name, strategy in STRATEGIES.items():
        out = strategy(queries, k, v, padded, context, **common)
        assert mx.all(mx.isfinite(out)).item(), name
        assert mx.abs(out[:, 0]).max().item() < 1e-30, name  # the sink takes all the weight
        plain = strategy(queries, k, v, padded, context, **{**common, "sinks": None})
        assert mx.abs(out[:, 1] - plain[:, 1]).max().item() < 1e-6, name


def test_wrong_sinks_or_window_say_why():
    rng = np.random.default_rng(3)
    queries, k, v, padded, context, _ = make_batch(rng, [9], 1)
    with pytest.raises(ValueError, match=r"sinks \(3,\).*\(9,\)"):
        paged_attention(queries, k, v, padded, context, scale=0.25, block_size=4, sinks=mx.zeros(3))
    with pytest.raises(ValueError, match="window 0"):
        AttentionPlan(BACKENDS["mlx"], padded, [9], block_size=4, window=0)
    assert math.isfinite(W)
