"""PrefixPins: pinned prefixes survive eviction until their deadline, renew, stay within their
bound (oldest released first), survive splits, hand released paths to the lower tier."""

from __future__ import annotations

import mlx.core as mx
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.kv import BlockPool, RadixCache
from worker.kv.pins import PrefixPins

BS = 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(num_blocks: int = 32, max_blocks: int = 8):
    pool = BlockPool(num_blocks, BS, num_layers=1, num_kv_heads=1, head_dim=1, dtype=mx.float32)
    cache = RadixCache(pool)
    clock = FakeClock()
    return pool, cache, PrefixPins(cache, max_blocks, clock), clock


def cache_prompt(cache, pool, tokens) -> None:
    """A finished sequence's prompt, as the engine leaves it: cached, held by nobody."""
    match = cache.match_prefix(tokens)
    cache.lock(match.node)
    pool.incref(match.block_ids)
    new = pool.allocate(pool.blocks_for_tokens(len(tokens)) - len(match.block_ids))
    blocks = match.block_ids + new
    cache.insert(tokens, blocks)
    cache.unlock(match.node)
    pool.decref(blocks)


def check(pool, cache, pins) -> None:
    pool.check_integrity()
    cache.check_integrity()
    pins.check_integrity()


def evict_all(cache) -> None:
    cache.evict(cache.evictable_blocks)


A = list(range(100, 108))  # 4 blocks
B = list(range(200, 208))
C = list(range(300, 308))


def test_a_pin_keeps_its_prefix_until_its_deadline_then_lru_takes_it():
    pool, cache, pins, clock = setup()
    cache_prompt(cache, pool, A + [1])  # the pin covers A's full blocks, not the tail token
    assert pins.pin(A + [1], 9, ttl_s=300)
    assert (len(pins), pins.pinned_blocks) == (1, 4)
    evict_all(cache)
    assert cache.peek_prefix_length(A) == 8
    check(pool, cache, pins)
    clock.now += 299
    assert pins.expire() == 0
    evict_all(cache)
    assert cache.peek_prefix_length(A) == 8
    clock.now += 1
    assert pins.expire() == 1
    assert (len(pins), pins.pinned_blocks, pins.expired) == (0, 0, 1)
    assert cache.evictable_blocks == 4
    evict_all(cache)
    assert cache.peek_prefix_length(A) == 0
    check(pool, cache, pins)


def test_pinning_again_renews_to_the_later_deadline():
    pool, cache, pins, clock = setup()
    cache_prompt(cache, pool, A)
    assert pins.pin(A, 8, ttl_s=300)
    clock.now += 200
    assert pins.pin(A, 8, ttl_s=300)  # a hit 200 s later: 300 s from now
    assert pins.deadline(A, 8) == clock.now + 300
    assert pins.pin(A, 8, ttl_s=5)  # a shorter TTL never shortens a pin
    assert pins.deadline(A, 8) == clock.now + 300
    assert len(pins) == 1
    clock.now += 299
    assert pins.expire() == 0  # the first deadline (now past) was superseded
    evict_all(cache)
    assert cache.peek_prefix_length(A) == 8
    clock.now += 1
    assert pins.expire() == 1
    check(pool, cache, pins)


def test_past_the_bound_the_oldest_pin_goes_first():
    pool, cache, pins, _ = setup(max_blocks=8)
    for prompt in (A, B, C):
        cache_prompt(cache, pool, prompt)
    assert pins.pin(A, 8, 60)
    assert pins.pin(B, 8, 60)
    assert pins.pin(A, 8, 60)  # renewed: now B is the oldest
    assert pins.pin(C, 8, 60)
    assert pins.pinned_blocks == 8 and pins.released_for_room == 1
    assert pins.deadline(B, 8) is None
    assert pins.deadline(A, 8) is not None and pins.deadline(C, 8) is not None
    evict_all(cache)
    assert [cache.peek_prefix_length(p) for p in (A, B, C)] == [8, 0, 8]
    check(pool, cache, pins)


def test_nested_pins_count_shared_blocks_once():
    pool, cache, pins, _ = setup(max_blocks=4)
    cache_prompt(cache, pool, A)
    assert pins.pin(A, 4, 60)  # a system-prompt breakpoint
    assert pins.pin(A, 8, 60)  # and a later one in the same prompt
    assert (len(pins), pins.pinned_blocks, pins.released_for_room) == (2, 4, 0)
    check(pool, cache, pins)


def test_a_pin_larger_than_the_bound_or_not_cached_is_not_taken():
    pool, cache, pins, _ = setup(max_blocks=3)
    cache_prompt(cache, pool, A)
    assert not pins.pin(A, 8, 60)
    assert pins.refused == 1
    assert not pins.pin(B, 8, 60)  # not in the tree
    assert not pins.pin(A, 1, 60)  # no full block
    assert (len(pins), cache.num_locks) == (0, 0)
    assert pins.pin(A, 6, 60)  # three blocks fit
    check(pool, cache, pins)


def test_a_split_of_the_pinned_path_keeps_the_pin():
    pool, cache, pins, clock = setup()
    cache_prompt(cache, pool, A)
    assert pins.pin(A, 8, 60)
    cache_prompt(cache, pool, A[:4] + [9, 9, 9, 9])  # splits A's node after two blocks
    assert pins.pin(A, 4, 60)  # ends at the split: pins the upper part too
    evict_all(cache)
    assert cache.peek_prefix_length(A) == 8
    assert cache.peek_prefix_length(A[:4] + [9, 9]) == 4  # the other branch went
    check(pool, cache, pins)
    clock.now += 60
    assert pins.expire() == 2 and cache.num_locks == 0
    check(pool, cache, pins)


def test_released_for_room_the_path_is_spilled_and_stays_cached():
    pool, cache, pins, _ = setup()
    copied = []
    pins.spill = lambda ids, hashes, parent, tokens: copied.append(tuple(tokens))
    cache_prompt(cache, pool, A)
    cache_prompt(cache, pool, A[:4] + [9, 9, 9, 9])  # the pinned path is two nodes
    assert pins.pin(A, 8, 60)
    assert pins.release_oldest()
    assert copied == [tuple(A[:4]), tuple(A[4:])]  # root first, as eviction would
    assert cache.peek_prefix_length(A) == 8  # kept in memory until LRU wants it
    assert not pins.release_oldest()
    check(pool, cache, pins)


def test_due_pins_go_first_when_room_is_needed():
    pool, cache, pins, clock = setup()
    copied = []
    pins.spill = lambda *node: copied.append(node)
    for prompt, ttl in ((A, 60), (B, 600)):
        cache_prompt(cache, pool, prompt)
        pins.pin(prompt, 8, ttl)
    clock.now += 60
    assert pins.release_oldest()  # A was due: released, not spilled
    assert (pins.expired, pins.released_for_room, copied) == (1, 0, [])
    assert pins.deadline(B, 8) is not None
    check(pool, cache, pins)


def test_clear_lets_the_cache_reset():
    pool, cache, pins, _ = setup()
    cache_prompt(cache, pool, A)
    pins.pin(A, 8, 60)
    pins.clear()
    cache.reset()
    check(pool, cache, pins)


def test_expiry_is_a_heap_peek_when_nothing_is_due():
    pool, cache, pins, clock = setup()
    cache_prompt(cache, pool, A)
    for _ in range(1000):  # renewals leave stale deadlines behind; the heap stays bounded
        clock.now += 1
        pins.pin(A, 8, 60)
    assert len(pins._heap) <= 2 * len(pins) + PrefixPins.COMPACT_SLACK
    assert pins.expire() == 0
    check(pool, cache, pins)


prompts = st.lists(st.integers(0, 3), min_size=2, max_size=10)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("cache"), prompts),
        st.tuples(st.just("pin"), prompts, st.integers(1, 10), st.sampled_from([5, 50, 500])),
        st.tuples(st.just("wait"), st.integers(1, 100)),
        st.tuples(st.just("evict"), st.integers(1, 8)),
        st.tuples(st.just("release")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_traffic_never_evicts_a_live_pin_and_keeps_the_books(steps):
    pool, cache, pins, clock = setup(num_blocks=24, max_blocks=6)
    for step in steps:
        if step[0] == "cache":
            need = pool.blocks_for_tokens(len(step[1]))
            cache.evict(pool.shortfall(need))
            if pool.can_allocate(need):
                cache_prompt(cache, pool, step[1])
        elif step[0] == "pin":
            _, prompt, n, ttl = step
            pinned = pins.pin(prompt, min(n, len(prompt)), ttl)
            assert pinned == (pins.deadline(prompt, min(n, len(prompt))) is not None)
        elif step[0] == "wait":
            clock.now += step[1]
            pins.expire()
            assert all(d > clock.now for d in pins._deadline.values())
        elif step[0] == "evict":
            cache.evict(step[1])
        else:
            pins.release_oldest()
        check(pool, cache, pins)  # (a pinned node evicted fails here)
        assert pins.pinned_blocks <= 6
