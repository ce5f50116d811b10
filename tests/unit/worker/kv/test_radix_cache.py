"""RadixCache: matching, splitting, locking, LRU eviction, events."""

import mlx.core as mx
import pytest

from shared.hashing import ROOT_PARENT_HASH, hash_blocks
from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from worker.kv import BlockPool, IntegrityError, KVCacheError, RadixCache

BS = 2


@pytest.fixture
def events():
    return []


@pytest.fixture
def pool():
    return BlockPool(16, BS, num_layers=1, num_kv_heads=1, head_dim=1, dtype=mx.float32)


@pytest.fixture
def cache(pool, events):
    return RadixCache(pool, BS, on_event=events.append)


def run_sequence(cache, pool, tokens):
    """Admit, hold and finish a sequence the way the engine does; returns its block ids."""
    match = cache.match_prefix(tokens)
    cache.lock(match.node)
    pool.incref(match.block_ids)
    blocks = match.block_ids + pool.allocate(
        pool.blocks_for_tokens(len(tokens)) - len(match.block_ids)
    )
    cache.admitted(match, len(tokens))
    cache.insert(tokens, blocks)
    cache.unlock(match.node)
    pool.decref(blocks)
    cache.check_integrity()
    return blocks


def cache_tokens(cache, pool, tokens):
    """Inserts `tokens` with fresh blocks, then drops the caller's references."""
    blocks = pool.allocate(pool.blocks_for_tokens(len(tokens)))
    cached = cache.insert(tokens, blocks)
    pool.decref(blocks)
    cache.check_integrity()
    return cached, blocks


def test_block_size_must_match_the_pool(pool):
    with pytest.raises(ValueError, match="block_size"):
        RadixCache(pool, BS + 1)


def test_empty_cache_matches_nothing_and_counts_misses_once_admitted(cache):
    match = cache.match_prefix([1, 2, 3])
    assert match.node is cache.root
    assert match.block_ids == []
    assert match.num_tokens == 0
    assert (cache.hit_tokens, cache.miss_tokens) == (0, 0)  # an attempt counts nothing
    cache.admitted(match, 3)
    assert (cache.hit_tokens, cache.miss_tokens) == (0, 3)


def test_insert_then_match_full_blocks_only(cache, pool):
    cached, blocks = cache_tokens(cache, pool, [1, 2, 3, 4, 5])
    assert cached == 0
    assert cache.cached_blocks == 2  # the partial block [5] stays private
    assert pool.is_free(blocks[2])
    match = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert match.block_ids == blocks[:2]
    assert match.num_tokens == 4
    cache.admitted(match, 6)
    assert (cache.hit_tokens, cache.miss_tokens) == (4, 2)


def test_match_is_block_aligned(cache, pool):
    _, blocks = cache_tokens(cache, pool, [1, 2, 3, 4])
    assert cache.match_prefix([1, 2, 3, 9]).block_ids == blocks[:1]  # diverges inside block 2
    assert cache.match_prefix([1, 2, 3]).num_tokens == 2  # only 1 token of block 2
    assert cache.match_prefix([1]).num_tokens == 0
    assert cache.match_prefix([9, 2, 3, 4]).num_tokens == 0


def test_match_ending_inside_a_node_splits_it(cache, pool):
    _, blocks = cache_tokens(cache, pool, [1, 2, 3, 4, 5, 6])
    (node,) = cache.root.children.values()
    assert node.num_blocks == 3
    match = cache.match_prefix([1, 2, 3, 4, 7, 7])
    assert match.block_ids == blocks[:2]
    assert match.node.key == (1, 2, 3, 4)
    (lower,) = match.node.children.values()
    assert lower.key == (5, 6)
    assert lower.block_ids == blocks[2:]
    cache.check_integrity()


def test_peek_does_not_split_touch_or_count(cache, pool):
    cache_tokens(cache, pool, [1, 2, 3, 4, 5, 6])
    before = cache.root.children[(1, 2)].last_access
    assert cache.peek_prefix_length([1, 2, 3, 4, 9, 9]) == 4
    assert cache.peek_prefix_length([1, 2, 3, 4, 5, 6, 7]) == 6
    (node,) = cache.root.children.values()
    assert node.num_blocks == 3
    assert node.last_access == before
    assert (cache.hit_tokens, cache.miss_tokens) == (0, 0)


def test_insert_splits_on_divergence_and_keeps_tree_blocks(cache, pool):
    _, first = cache_tokens(cache, pool, [1, 2, 3, 4, 5, 6])
    cached, second = cache_tokens(cache, pool, [1, 2, 3, 4, 7, 8])
    assert cached == 4
    assert pool.is_free(second[0]) and pool.is_free(second[1])  # duplicates went back
    assert pool.is_cached(second[2])
    (shared_node,) = cache.root.children.values()
    assert shared_node.block_ids == first[:2]
    assert sorted(shared_node.children) == [(5, 6), (7, 8)]
    assert cache.match_prefix([1, 2, 3, 4, 7, 8]).block_ids == first[:2] + second[2:]


def test_insert_of_cached_tokens_returns_their_count(cache, pool):
    blocks = run_sequence(cache, pool, [1, 2, 3, 4])
    match = cache.match_prefix([1, 2, 3, 4, 5])
    assert match.block_ids == blocks
    assert cache.insert([1, 2, 3, 4, 5], match.block_ids + [15]) == 4  # extra id ignored
    assert cache.cached_blocks == 2


def test_insert_needs_held_uncached_blocks(cache, pool):
    with pytest.raises(ValueError, match="2 full blocks"):
        cache.insert([1, 2, 3, 4], [0])
    with pytest.raises(KVCacheError, match="held, uncached"):
        cache.insert([1, 2], [0])  # block 0 is free
    (a,) = pool.allocate(1)
    cache.insert([1, 2], [a])
    with pytest.raises(KVCacheError, match="held, uncached"):
        cache.insert([3, 4], [a])  # already cached for other tokens
    b = pool.allocate(1)[0]
    with pytest.raises(KVCacheError, match="held, uncached"):
        cache.insert([5, 6, 7, 8], [b, b])
    cache.check_integrity()


def test_events_chain_like_the_router_hashes(cache, pool, events):
    cache_tokens(cache, pool, [1, 2, 3, 4])
    cache_tokens(cache, pool, [1, 2, 5, 6])
    h12, h34 = hash_blocks([1, 2, 3, 4], BS)
    _, h56 = hash_blocks([1, 2, 5, 6], BS)
    assert events == [
        BlockStored(h12, ROOT_PARENT_HASH, (1, 2), BS),
        BlockStored(h34, h12, (3, 4), BS),
        BlockStored(h56, h12, (5, 6), BS),
    ]


def test_evict_takes_least_recently_used_leaf_first(cache, pool, events):
    _, a = cache_tokens(cache, pool, [1, 1])
    _, b = cache_tokens(cache, pool, [2, 2])
    _, c = cache_tokens(cache, pool, [3, 3])
    cache.match_prefix([1, 1])  # a is now the most recent
    events.clear()
    assert cache.evict(1) == 1
    assert pool.is_free(b[0]) and pool.is_cached(a[0]) and pool.is_cached(c[0])
    assert cache.evict(1) == 1
    assert pool.is_free(c[0])
    assert events == [
        BlockRemoved(tuple(hash_blocks([2, 2], BS))),
        BlockRemoved(tuple(hash_blocks([3, 3], BS))),
    ]
    cache.check_integrity()


def test_evict_cascades_to_parents_in_one_event(cache, pool, events):
    cache_tokens(cache, pool, [1, 2, 3, 4])
    cache_tokens(cache, pool, [1, 2, 5, 6])
    assert cache.evictable_blocks == 3
    events.clear()
    assert cache.evict(10) == 3
    assert cache.evicted_blocks == 3  # the heartbeat's eviction counter
    assert cache.cached_blocks == 0
    assert pool.num_free == 16
    (removed,) = events
    assert sorted(removed.block_hashes) == sorted(
        set(hash_blocks([1, 2, 3, 4], BS) + hash_blocks([1, 2, 5, 6], BS))
    )
    cache.check_integrity()


def test_evict_frees_whole_nodes_and_reports_the_count(cache, pool):
    cache_tokens(cache, pool, [1, 2, 3, 4, 5, 6])
    assert cache.evict(1) == 3  # a node goes as a whole
    assert cache.evict(1) == 0


def test_locked_path_survives_eviction(cache, pool):
    cache_tokens(cache, pool, [1, 2, 3, 4, 5, 6])
    cache_tokens(cache, pool, [7, 8])
    match = cache.match_prefix([1, 2, 3, 4])
    cache.lock(match.node)
    assert cache.evictable_blocks == 2  # [5, 6] below the lock and [7, 8]
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).num_tokens == 4
    cache.unlock(match.node)
    assert cache.evictable_blocks == 2
    assert cache.evict(100) == 2
    cache.check_integrity()


def test_held_blocks_are_not_evicted(cache, pool):
    blocks = pool.allocate(2)
    cache.insert([1, 2, 3, 4], blocks)  # the caller still holds them
    assert cache.evictable_blocks == 0
    assert cache.evict(5) == 0
    pool.decref(blocks[1:])
    assert cache.evictable_blocks == 0  # the node goes whole or not at all
    pool.decref(blocks[:1])
    assert cache.evictable_blocks == 2
    cache.check_integrity()


def test_held_child_keeps_its_unheld_parent(cache, pool):
    cache_tokens(cache, pool, [1, 2])
    child = pool.allocate(1)
    cache.insert([1, 2, 3, 4], cache.match_prefix([1, 2]).block_ids + child)
    assert cache.evictable_blocks == 0
    pool.decref(child)
    assert cache.evictable_blocks == 2
    cache.check_integrity()


def test_unlock_below_zero_raises(cache, pool):
    cache_tokens(cache, pool, [1, 2])
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)
    cache.unlock(node)
    with pytest.raises(KVCacheError, match="not locked"):
        cache.unlock(node)
    cache.lock(cache.root)  # root: nothing to protect, no-op
    cache.unlock(cache.root)
    assert cache.num_locks == 0


def test_lock_of_evicted_node_raises(cache, pool):
    cache_tokens(cache, pool, [1, 2])
    node = cache.match_prefix([1, 2]).node
    cache.evict(1)
    with pytest.raises(KVCacheError, match="evicted"):
        cache.lock(node)


def test_lock_survives_a_later_split(cache, pool):
    cache_tokens(cache, pool, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    cache.match_prefix([1, 2, 9, 9])  # splits the locked node
    assert cache.evict(10) == 0
    cache.check_integrity()
    cache.unlock(node)
    assert cache.evict(10) == 2


def test_reset_refuses_while_locked(cache, pool):
    cache_tokens(cache, pool, [1, 2])
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)
    with pytest.raises(KVCacheError, match="lock"):
        cache.reset()
    cache.unlock(node)


def test_reset_frees_cached_blocks_and_leaves_held_ones(cache, pool, events):
    cache_tokens(cache, pool, [1, 2, 3, 4])
    held = pool.allocate(1)
    cache.insert([5, 6], held)
    cache.reset()
    assert events[-1] == AllBlocksCleared()
    assert cache.cached_blocks == 0
    assert cache.evictable_blocks == 0
    assert pool.num_free == 15
    assert pool.ref_count(held[0]) == 1 and not pool.is_cached(held[0])
    assert cache.match_prefix([1, 2, 3, 4]).num_tokens == 0
    cache.check_integrity()
    pool.decref(held)
    assert pool.num_free == 16


def test_check_integrity_catches_a_broken_hash_chain(cache, pool):
    cache_tokens(cache, pool, [1, 2, 3, 4])
    (node,) = cache.root.children.values()
    node.block_hashes[1] ^= 1
    with pytest.raises(IntegrityError, match="chain"):
        cache.check_integrity()


def test_check_integrity_catches_a_stray_cached_block(cache, pool):
    (block,) = pool.allocate(1)
    pool.set_cached(block)
    with pytest.raises(IntegrityError, match="not in the tree"):
        cache.check_integrity()


def test_a_live_block_that_fills_up_leaves_the_live_set(cache, pool):
    """A running sequence offers its partial block (live), decodes until it is full and caches
    it; its copy-on-write rewrite then lets go of the block, which must no longer be live."""
    (block,) = pool.allocate(1)
    assert cache.insert_tail([5], [block], live=True)
    assert cache.partials.is_live(block)
    cache.insert([5, 6], [block])  # the block filled up and joined the tree
    assert not cache.partials.is_live(block)
    new = pool.copy_on_write(block)  # a rewrite of its last slot: the cached one stays put
    assert new != block and pool.ref_count(block) == 0
    cache.check_integrity()
    pool.decref([new])
