"""BlockPool: states, ref counts, copy-on-write on real K/V, sizing."""

import logging
import os

import mlx.core as mx
import numpy as np
import pytest

from worker.kv import (
    DEFAULT_BLOCK_SIZE,
    BlockPool,
    IntegrityError,
    KVCacheError,
    OutOfBlocksError,
    PoolUsage,
    bytes_per_block,
    device_memory_bytes,
    memory_budget_bytes,
    num_blocks_for_budget,
)


def make_pool(num_blocks=6, block_size=4, num_layers=2):
    return BlockPool(
        num_blocks, block_size, num_layers=num_layers, num_kv_heads=2, head_dim=3, dtype=mx.float32
    )


def block_slice(pool, block_id):
    return slice(block_id * pool.block_size, (block_id + 1) * pool.block_size)


def fill_block(pool, block_id, value):
    """Writes distinct K and V values per layer into a block's slots."""
    shape = (pool.block_size, pool.num_kv_heads, pool.head_dim)
    for layer in range(pool.num_layers):
        pool.k[layer][block_slice(pool, block_id)] = mx.full(shape, value + layer)
        pool.v[layer][block_slice(pool, block_id)] = mx.full(shape, -(value + layer))


def block_kv(pool, block_id):
    s = block_slice(pool, block_id)
    return [(np.array(k[s]), np.array(v[s])) for k, v in zip(pool.k, pool.v, strict=True)]


def test_storage_layout_is_flat_slots_per_layer():
    pool = make_pool(num_blocks=5, block_size=4, num_layers=3)
    assert len(pool.k) == len(pool.v) == 3
    for array in pool.k + pool.v:
        assert array.shape == (5 * 4, 2, 3)
        assert array.dtype == mx.float32


def test_default_block_size_is_32():
    assert DEFAULT_BLOCK_SIZE == 32
    pool = BlockPool(2, num_layers=1, num_kv_heads=1, head_dim=1)
    assert pool.block_size == 32
    assert pool.k[0].shape == (64, 1, 1)


def test_bad_shape_raises_value_error():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0, 4, num_layers=1, num_kv_heads=1, head_dim=1)
    with pytest.raises(ValueError, match="head_dim"):
        BlockPool(2, 4, num_layers=1, num_kv_heads=1, head_dim=0)


def test_construction_logs_block_count(caplog):
    with caplog.at_level(logging.INFO, logger="worker.kv.block_pool"):
        make_pool(num_blocks=7)
    assert "7 blocks" in caplog.text


def test_allocate_is_deterministic_oldest_free_first():
    pool = make_pool(num_blocks=4)
    assert pool.allocate(2) == [0, 1]
    pool.decref([1])
    pool.decref([0])
    assert pool.allocate(4) == [2, 3, 1, 0]
    assert pool.num_free == 0


def test_allocate_beyond_free_raises_and_changes_nothing():
    pool = make_pool(num_blocks=3)
    pool.allocate(2)
    assert pool.can_allocate(1)
    assert not pool.can_allocate(2)
    with pytest.raises(OutOfBlocksError, match="only 1 free"):
        pool.allocate(2)
    assert pool.num_free == 1
    pool.check_integrity()


def test_blocks_for_tokens_is_ceil():
    pool = make_pool(block_size=4)
    assert [pool.blocks_for_tokens(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_ref_counts_and_free_on_last_decref():
    pool = make_pool()
    (block,) = pool.allocate(1)
    pool.incref([block, block])
    assert pool.ref_count(block) == 3
    pool.decref([block, block])
    assert not pool.is_free(block)
    pool.decref([block])
    assert pool.is_free(block)
    assert pool.check_integrity() == PoolUsage(free=6, held=0, cached_only=0)


def test_double_free_raises_and_changes_nothing():
    pool = make_pool()
    a, b = pool.allocate(2)
    pool.decref([a])
    with pytest.raises(KVCacheError, match="double free"):
        pool.decref([a])
    with pytest.raises(KVCacheError, match="double free"):
        pool.decref([b, b])  # b has one reference: nothing may change
    assert pool.ref_count(b) == 1
    pool.check_integrity()


def test_incref_of_free_block_raises():
    pool = make_pool()
    with pytest.raises(KVCacheError, match="free block 0"):
        pool.incref([0])


def test_out_of_range_id_raises():
    pool = make_pool(num_blocks=2)
    with pytest.raises(KVCacheError, match="out of range"):
        pool.ref_count(2)
    with pytest.raises(KVCacheError, match="out of range"):
        pool.decref([-1])


def test_cached_block_survives_ref_zero_until_uncached():
    pool = make_pool()
    (block,) = pool.allocate(1)
    pool.set_cached(block)
    pool.decref([block])
    assert pool.check_integrity() == PoolUsage(free=5, held=0, cached_only=1)
    pool.incref([block])  # a cache hit revives it
    assert pool.check_integrity() == PoolUsage(free=5, held=1, cached_only=0)
    pool.decref([block])
    pool.unset_cached(block)
    assert pool.is_free(block)
    assert pool.check_integrity() == PoolUsage(free=6, held=0, cached_only=0)


def test_unset_cached_of_held_block_keeps_it_held():
    pool = make_pool()
    (block,) = pool.allocate(1)
    pool.set_cached(block)
    pool.unset_cached(block)
    assert pool.ref_count(block) == 1
    assert not pool.is_free(block)
    pool.check_integrity()


def test_set_cached_needs_a_held_uncached_block():
    pool = make_pool()
    with pytest.raises(KVCacheError, match="must be held"):
        pool.set_cached(0)
    (block,) = pool.allocate(1)
    pool.set_cached(block)
    with pytest.raises(KVCacheError, match="must be held"):
        pool.set_cached(block)
    with pytest.raises(KVCacheError, match="not cached"):
        pool.unset_cached(1)


def test_hold_listener_hears_cached_blocks_crossing_zero():
    pool = make_pool()
    heard = []
    pool.set_hold_listener(lambda ids, held: heard.append((ids, held)))
    a, b = pool.allocate(2)
    pool.set_cached(a)
    pool.decref([a, b])  # only the cached block is news
    pool.incref([a, a])
    pool.decref([a])
    assert heard == [([a], False), ([a], True)]
    with pytest.raises(KVCacheError, match="already has"):
        pool.set_hold_listener(lambda ids, held: None)


def test_copy_on_write_exclusive_block_is_the_same_block():
    pool = make_pool()
    (block,) = pool.allocate(1)
    assert not pool.needs_copy(block)
    assert pool.copy_on_write(block) == block
    assert pool.ref_count(block) == 1


def test_copy_on_write_shared_block_copies_kv_in_every_layer():
    pool = make_pool()
    a, b = pool.allocate(2)
    fill_block(pool, a, 10.0)
    fill_block(pool, b, 20.0)
    before = block_kv(pool, a)
    pool.incref([a])  # a second sequence shares `a`
    assert pool.needs_copy(a)
    new = pool.copy_on_write(a)
    assert new not in (a, b)
    assert pool.ref_count(a) == 1
    assert pool.ref_count(new) == 1
    for (k_new, v_new), (k_old, v_old) in zip(block_kv(pool, new), before, strict=True):
        np.testing.assert_array_equal(k_new, k_old)
        np.testing.assert_array_equal(v_new, v_old)
    fill_block(pool, new, 99.0)  # writing the copy leaves the original alone
    for (k_now, v_now), (k_old, v_old) in zip(block_kv(pool, a), before, strict=True):
        np.testing.assert_array_equal(k_now, k_old)
        np.testing.assert_array_equal(v_now, v_old)
    assert block_kv(pool, b)[1][0][0, 0, 0] == 21.0  # its neighbour too
    pool.check_integrity()


def test_copy_on_write_of_cached_block_held_once_copies():
    """The tree's copy must never change, even when one sequence is its only user."""
    pool = make_pool()
    (block,) = pool.allocate(1)
    fill_block(pool, block, 5.0)
    pool.set_cached(block)
    new = pool.copy_on_write(block)
    assert new != block
    assert pool.ref_count(block) == 0
    assert pool.is_cached(block)
    np.testing.assert_array_equal(block_kv(pool, new)[0][0], block_kv(pool, block)[0][0])
    assert pool.check_integrity() == PoolUsage(free=4, held=1, cached_only=1)


def test_copy_on_write_without_free_block_raises_and_changes_nothing():
    pool = make_pool(num_blocks=1)
    (block,) = pool.allocate(1)
    pool.incref([block])
    assert not pool.can_copy_on_write(block)
    with pytest.raises(OutOfBlocksError):
        pool.copy_on_write(block)
    assert pool.ref_count(block) == 2


def test_copy_on_write_of_unheld_block_raises():
    pool = make_pool()
    with pytest.raises(KVCacheError, match="not held"):
        pool.copy_on_write(0)


def test_check_integrity_catches_corruption():
    pool = make_pool()
    pool.allocate(1)
    pool._free.append(pool._free[0])
    with pytest.raises(IntegrityError, match="duplicates"):
        pool.check_integrity()
    pool = make_pool()
    (block,) = pool.allocate(1)
    pool._free.append(block)
    with pytest.raises(IntegrityError, match="listed but in use"):
        pool.check_integrity()
    pool = make_pool()
    pool._free.popleft()
    with pytest.raises(IntegrityError, match="unused but not listed"):
        pool.check_integrity()
    pool = make_pool()
    pool._refs[3] = -1
    with pytest.raises(IntegrityError, match="negative"):
        pool.check_integrity()


def test_num_blocks_for_budget():
    per_block = bytes_per_block(32, 30, 3, 64, mx.float16)
    assert per_block == 2 * 30 * 32 * 3 * 64 * 2
    assert num_blocks_for_budget(per_block * 10 + per_block - 1, 32, 30, 3, 64, mx.float16) == 10
    assert BlockPool.num_blocks_for_budget(per_block, 32, 30, 3, 64, mx.float16) == 1
    assert num_blocks_for_budget(per_block, 32, 30, 3, 64, mx.float32) == 0
    with pytest.raises(ValueError):
        num_blocks_for_budget(-1, 32, 30, 3, 64, mx.float16)


def test_memory_budget_is_a_fraction_of_device_memory():
    total = device_memory_bytes()
    if not mx.metal.is_available():
        assert total == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_budget_bytes(0.5) == int(total * 0.5)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            memory_budget_bytes(bad)
