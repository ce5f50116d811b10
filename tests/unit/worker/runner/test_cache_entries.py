"""Two caches per layer (`worker.runner.layer_cache`): the model gets a CacheList of our layer
caches where mlx-lm would make one, each member its own slot of the pool; it may read and
assign their `keys`/`values` as it does mlx-lm's; and the writes of a layer's second cache are
evaluated with the step even when nothing reads them."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import CacheList

from tests.support.arch_zoo import build
from tests.support.engine_fixtures import make_engine
from worker.kv.block_pool import BlockPool
from worker.runner.layer_cache import CacheEntries, LayerCache

# per slot (K heads, K width, V heads, V width): MLA's latent and rope, an indexer's keys twice
SHAPES = [(1, 16, 1, 8), (1, 16, 1, 16)] * 2


def _pool() -> BlockPool:
    return BlockPool(4, 4, num_layers=4, num_kv_heads=1, head_dim=16, layer_shapes=SHAPES)


def _cache(pool: BlockPool, layer: int) -> LayerCache:
    slots = mx.array([4], dtype=mx.int32)
    return LayerCache(pool, layer, mx.array([0], dtype=mx.int32), slots, None)


def test_a_cachelist_entry_is_given_its_members():
    pool = _pool()
    caches = [_cache(pool, i) for i in range(4)]
    entries = CacheEntries(sizes=(2, 2), lists=(True, True)).of(caches, [])
    assert all(isinstance(e, CacheList) for e in entries)
    assert [list(e.caches) for e in entries] == [caches[:2], caches[2:]]
    # a CacheList of one stays a CacheList (MiniMax-M3's dense layers index it)
    one = CacheEntries(sizes=(1, 1), lists=(True, False)).of(caches[:2], [])
    assert isinstance(one[0], CacheList) and one[1] is caches[1]


def test_second_caches_writes_are_step_outputs_and_states_are_not():
    pool = _pool()
    written = CacheEntries(sizes=(2, 2), lists=(True, True)).unread_writes(pool)
    assert len(written) == 8 and all(any(a is b for b in pool.k + pool.v) for a in written)
    # Falcon-H1: a state and one attention cache per layer, nothing read-less
    hybrid = CacheEntries(slot_map=(-1, 0, -2, 1), sizes=(2, 2), lists=(True, True))
    assert hybrid.unread_writes(pool) == []
    assert CacheEntries().unread_writes(pool) == []


def test_keys_and_values_read_what_was_fetched_and_assignments_are_dropped():
    pool = _pool()
    cache = _cache(pool, 1)
    assert cache.keys is None and cache.values is None
    k = mx.ones((1, 1, 1, 16))
    fetched = cache.update_and_fetch(k, k)
    assert cache.keys is fetched[0] and cache.values is fetched[1]
    cache.values = mx.zeros_like(cache.keys)  # DeepSeek V3.2's indexer
    cache.keys = mx.depends(cache.keys, [cache.values])  # its MLA layer, of the indexer
    assert cache.keys is fetched[0] and cache.values is fetched[1]
    assert mx.array_equal(pool.k[1][4], k[0, :, 0]).item()


def test_deepseek_v32_runs_two_slots_per_layer_gathered():
    model = build("deepseek_v32")
    engine = make_engine(model)
    layers = len(model.model.layers)
    assert engine.pool.num_layers == 2 * layers
    assert engine.runner.layout.entries.lists == (True,) * layers
    assert all(engine.runner.layout.gathered)
    assert engine.pool.layer_shapes[1] != engine.pool.layer_shapes[0]  # the indexer's own


def test_an_indexer_handed_its_keys_as_values_keeps_no_second_copy():
    from worker.runner.layer_cache import KEYS_ONLY_V
    from worker.runner.model_support import probe_shape

    model = build("deepseek_v32")
    shape = probe_shape(model)
    layers = len(model.model.layers)
    assert shape.keys_only == tuple(range(1, 2 * layers, 2))  # each layer's indexer slot
    h, d, hv, dv = shape.shapes()[1]
    assert (hv, dv) == (h, d)  # as mlx-lm holds it
    engine = make_engine(model)
    assert [s[2:] for s in engine.pool.layer_shapes[1::2]] == [KEYS_ONLY_V] * layers
    assert engine.pool.layer_shapes[0] == shape.shapes()[0]  # MLA's latent and rope, whole
    assert shape.pool_shapes(quantized=True) == shape.shapes()  # groups need the width
    # the slot writes its keys and hands them back as values; other values are refused
    cache = _cache(engine.pool, 1)
    k = mx.ones((1, h, 1, d))
    keys, values = cache.update_and_fetch(k, k)
    assert keys is values
    with pytest.raises(RuntimeError, match="keys-only"):
        _cache(engine.pool, 1).update_and_fetch(k, mx.zeros_like(k))
