"""Quantized K/V pools: written quantized, gathered dequantized, by every MLX-ops strategy."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from worker.attention import paged_attention, slot_ids, write_kv
from worker.attention.mlx_ops import blockwise_attention, gather_attention
from worker.attention.paged import BackendUnavailableError
from worker.attention.select import select_backend
from worker.attention.shared_prefix import plan_shared_prefixes, shared_prefix_attention
from worker.attention.tiles import prepare_tiles, tiled_attention
from worker.kv import BlockPool, bytes_per_block
from worker.kv.quant import QuantizedKV
from worker.runner.model_support import ModelShape

BS, HKV, D = 8, 2, 64


def quant_pool(bits: int, group: int = 64, blocks: int = 16) -> QuantizedKV:
    return QuantizedKV.zeros(blocks * BS, HKV, D, bits=bits, group_size=group, dtype=mx.float32)


@pytest.mark.parametrize(("bits", "group"), [(8, 64), (8, 32), (4, 64), (4, 32)])
def test_write_then_gather_round_trips_within_the_quantization_step(bits, group):
    pool = quant_pool(bits, group)
    values = mx.random.normal((20, HKV, D), key=mx.random.key(bits + group))
    slots = mx.array(np.random.default_rng(0).permutation(16 * BS)[:20], dtype=mx.int32)
    write_kv(pool, pool, slots, values, values)
    back = np.array(pool.take(slots))
    assert pool.shape == (16 * BS, HKV, D) and back.dtype == np.float32
    grouped = np.array(values).reshape(20, HKV, D // group, group)
    step = (grouped.max(-1) - grouped.min(-1)) / (2**bits - 1)  # one quantization step
    error = np.abs(back - np.array(values)).reshape(grouped.shape).max(-1)
    assert (error <= step + 1e-5).all()  # within one step (MLX rounds its scales too)
    assert error.max() > 0  # it did quantize
    rows = slots[:, None] * HKV + mx.arange(HKV)  # the (slots * Hkv, D) view
    assert np.allclose(np.array(pool.rows(rows)), back)


def filled(bits: int, num_blocks: int = 16):
    """A quantized pool pair and plain pools holding exactly its dequantized values."""
    k, v = quant_pool(bits, blocks=num_blocks), quant_pool(bits, blocks=num_blocks)
    slots = mx.arange(num_blocks * BS, dtype=mx.int32)
    keys = mx.random.normal((num_blocks * BS, HKV, D), key=mx.random.key(1))
    write_kv(k, v, slots, keys, mx.random.normal(keys.shape, key=mx.random.key(2)))
    return k, v, k.take(slots), v.take(slots)


@pytest.mark.parametrize("bits", [8, 4])
def test_every_strategy_reads_a_quantized_pool_as_its_dequantized_values(bits):
    k, v, k_plain, v_plain = filled(bits)
    tables = mx.array([[3, 1, 4, 0, 5, 9], [2, 6, 5, 3, 7, 8], [3, 1, 4, 10, 11, 12]], mx.int32)
    lengths = [41, 30, 37]
    lens = mx.array(lengths, dtype=mx.int32)
    common = dict(scale=0.125, block_size=BS, max_context=max(lengths))
    for lq in (1, 4, 12):  # 12 queries: 24 rows per KV head, dequantized rather than qmm
        q = mx.random.normal((3, 4, lq, D), key=mx.random.key(lq))
        want = gather_attention(q, k_plain, v_plain, tables, lens, **common)
        got = {
            "gather": gather_attention(q, k, v, tables, lens, **common),
            "blockwise": blockwise_attention(q, k, v, tables, lens, blocks_per_step=2, **common),
            "tiled": tiled_attention(q, k, v, tables, lens, tile_bytes=4096, **common),
            "auto": paged_attention(q, k, v, tables, lens, scale=0.125, block_size=BS),
        }
        for name, out in got.items():
            assert np.allclose(np.array(out), np.array(want), atol=1e-4), (name, lq)
    # decode rows of one tenant: four blocks shared, one block each of their own
    host = [[3, 1, 4, 0, own] for own in (5, 6, 7, 9)]
    tables, lengths = mx.array(host, dtype=mx.int32), [37, 38, 39, 40]
    lens = mx.array(lengths, dtype=mx.int32)
    common = dict(scale=0.125, block_size=BS, max_context=max(lengths))
    q = mx.random.normal((4, 4, 1, D), key=mx.random.key(9))
    plan = plan_shared_prefixes(host, lengths, BS, HKV)
    assert plan is not None and plan.depths == [4] and plan.prefix_rows.shape[2] == 4 * BS
    tiles = prepare_tiles(
        lengths, 1, 4, k, BS, block_tables=tables, context_lengths=lens, host_tables=host
    )
    assert tiles.shared is not None
    want = gather_attention(q, k_plain, v_plain, tables, lens, **common)
    got = shared_prefix_attention(q, k, v, plan, scale=0.125)
    assert np.allclose(np.array(got), np.array(want), atol=1e-4)


def test_pool_accounts_quantized_bytes_and_copies_all_three_arrays_on_write():
    plain = BlockPool(8, BS, num_layers=2, num_kv_heads=HKV, head_dim=D, dtype=mx.float32)
    q8 = BlockPool(8, BS, num_layers=2, num_kv_heads=HKV, head_dim=D, dtype=mx.float32, kv_bits=8)
    q4 = BlockPool(
        8,
        BS,
        num_layers=2,
        num_kv_heads=HKV,
        head_dim=D,
        dtype=mx.float32,
        kv_bits=4,
        kv_group_size=32,
    )
    # 8 bits, groups of 64, float32 scale + bias: 64 + 8 bytes per head vector vs 256
    assert plain.bytes_per_block == 2 * 2 * BS * HKV * 256
    assert q8.bytes_per_block == 2 * 2 * BS * HKV * 72
    assert q4.bytes_per_block == 2 * 2 * BS * HKV * (32 + 16)
    assert q8.bytes_per_block == bytes_per_block(BS, 2, HKV, D, mx.float32, 8, 64)
    assert (q8.kv_layout, q4.kv_layout, plain.kv_layout) == ("q8g64", "q4g32", "float32")
    (block,) = q8.allocate(1)
    slots = mx.arange(block * BS, (block + 1) * BS, dtype=mx.int32)
    values = mx.random.normal((BS, HKV, D), key=mx.random.key(3))
    for layer in range(2):
        write_kv(q8.k[layer], q8.v[layer], slots, values * (layer + 1), values - layer)
    q8.set_cached(block)
    copy = q8.copy_on_write(block)
    assert copy != block and q8.ref_count(copy) == 1 and q8.ref_count(block) == 0
    for layer in range(2):
        for pool in (q8.k[layer], q8.v[layer]):
            for array in pool.arrays():
                assert np.array_equal(
                    np.array(array[slots]), np.array(array[slots + (copy - block) * BS])
                )
    q8.unset_cached(block)
    assert q8.check_integrity().free == 7


def test_quantized_kv_reports_its_layout_and_goes_to_the_kernel_where_metal_is():
    """--kv-bits no longer rules the Metal kernel out (its quantized variant is self-tested:
    tests/unit/worker/attention/test_attention_select.py); here, without Metal, MLX ops."""
    shape = ModelShape(2, HKV, D, mx.float32, 97, 4)
    q4 = BlockPool(4, BS, num_layers=2, num_kv_heads=HKV, head_dim=D, dtype=mx.float32, kv_bits=4)
    backend, report = select_backend("auto", shape, BS, q4)
    if not mx.metal.is_available():
        assert backend.name == "mlx" and "Metal is not available" in report.self_test
        with pytest.raises(BackendUnavailableError, match="Metal is not available"):
            select_backend("metal", shape, BS, q4)
    # registered with the router, shown by /v1/cluster: 2 layers x K, V x 2 heads x 40 bytes
    assert (report.kv_layout, report.kv_bytes_per_token) == ("q4g64", 2 * 2 * HKV * 40)


def test_slot_ids_unchanged_for_quantized_writes():
    k, v = quant_pool(8), quant_pool(8)
    tables = mx.array([[2, 5]], dtype=mx.int32)
    slots = slot_ids(tables, mx.array([6], dtype=mx.int32), 4, BS)
    values = mx.random.normal((1, 4, HKV, D), key=mx.random.key(5))
    write_kv(k, v, slots, values, values)
    assert np.allclose(np.array(k.take(slots[0])), np.array(values[0]), atol=0.05)


def test_the_router_shows_each_workers_kv_layout():
    from router.cluster.registry import WorkerState
    from shared.protocol import AttentionReport, Register, decode, encode

    report = AttentionReport("mlx", "auto", "not run", kv_layout="q8g64", kv_bytes_per_token=720)
    info = decode(encode(Register("w1", "m", BS, 10, "h", 1, attention=report)))
    shown = WorkerState(info, b"w1", 0.0).to_json()
    assert (shown["kv_layout"], shown["kv_bytes_per_token"]) == ("q8g64", 720)
    plain = WorkerState(Register("w2", "m", BS, 10, "h", 1), b"w2", 0.0).to_json()
    assert plain["kv_layout"] is None


def test_metrics_show_each_workers_kv_layout_and_bytes_per_token():
    from router.cluster.registry import WorkerState
    from router.metrics.router_metrics import Metrics
    from shared.protocol import AttentionReport, Register

    q8 = AttentionReport("mlx", "auto", "not run", kv_layout="q8g64", kv_bytes_per_token=720)
    f32 = AttentionReport("mlx", "auto", "not run", kv_layout="float32", kv_bytes_per_token=2560)
    workers = [
        WorkerState(Register(w, "m", BS, 10, "h", 1, attention=a), w.encode(), 0.0)
        for w, a in (("w1", q8), ("w2", f32))
    ]
    workers.append(WorkerState(Register("w3", "m", BS, 10, "h", 1), b"w3", 0.0))  # older worker
    text = Metrics().render(workers, pending=0)
    assert 'mlx_fleet_worker_kv_layout_info{kv_layout="q8g64",worker="w1"} 1.0' in text
    assert 'mlx_fleet_worker_kv_layout_info{kv_layout="float32",worker="w2"} 1.0' in text
    assert 'mlx_fleet_worker_kv_bytes_per_token{worker="w1"} 720.0' in text
    assert 'mlx_fleet_worker_kv_bytes_per_token{worker="w2"} 2560.0' in text
    assert 'worker="w3"' not in text.split("mlx_fleet_worker_kv_layout_info")[-1]
