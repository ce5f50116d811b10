"""Routing policies: cost trade-off, balance guard, round robin, least load."""

from __future__ import annotations

import pytest

from router.routing.policy import CacheAwarePolicy, Candidate, make_policy


def cand(worker_id, load, matched, blocks=20):
    return Candidate(worker_id, load, matched, blocks)


def test_cache_aware_prefers_the_worker_holding_the_prefix():
    policy = CacheAwarePolicy(prefill_weight=0.5)
    chosen = policy.choose([cand("a", 1, 0), cand("b", 2, 18)])
    assert chosen.worker_id == "b"  # cost a = 11, b = 3


def test_cache_aware_trades_cache_for_load():
    policy = CacheAwarePolicy(prefill_weight=0.1, balance_abs_threshold=100)
    chosen = policy.choose([cand("a", 0, 0), cand("b", 5, 20)])
    assert chosen.worker_id == "a"  # cost a = 2, b = 5


def test_cache_aware_without_hits_is_least_loaded():
    policy = CacheAwarePolicy()
    assert policy.choose([cand("a", 3, 0), cand("b", 1, 0), cand("c", 2, 0)]).worker_id == "b"


def test_cache_aware_rotates_among_equal_costs():
    policy = CacheAwarePolicy()
    cands = [cand("b", 0, 0), cand("a", 0, 0), cand("c", 1, 0)]
    assert [policy.choose(cands).worker_id for _ in range(4)] == ["a", "b", "a", "b"]


def test_balance_guard_overrides_cache_affinity_when_badly_unbalanced():
    policy = CacheAwarePolicy(prefill_weight=10, balance_abs_threshold=4, balance_rel_threshold=2)
    hot, idle = cand("hot", 10, 20), cand("idle", 1, 0)
    assert policy.is_unbalanced([hot, idle])
    assert policy.choose([hot, idle]).worker_id == "idle"
    # Within the thresholds the prefix still wins.
    warm = cand("hot", 4, 20)
    assert not policy.is_unbalanced([warm, idle])
    assert policy.choose([warm, idle]).worker_id == "hot"


def test_round_robin_cycles_through_workers():
    policy = make_policy("round_robin")
    cands = [cand("b", 9, 0), cand("a", 0, 20), cand("c", 0, 0)]
    assert [policy.choose(cands).worker_id for _ in range(6)] == ["a", "b", "c"] * 2


def test_least_load_ignores_the_cache_except_to_break_ties():
    policy = make_policy("least_load")
    assert policy.choose([cand("a", 2, 20), cand("b", 1, 0)]).worker_id == "b"
    assert policy.choose([cand("a", 1, 0), cand("b", 1, 5)]).worker_id == "b"


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("random")


# ---- affinity: tenants stay partitioned when the fleet's KV cannot hold them all ----------


def test_affinity_remembers_the_deepest_prefix():
    from router.routing.affinity import PrefixAffinity

    affinity = PrefixAffinity()
    affinity.remember([1, 2, 3, 4, 5], "a")
    affinity.remember([1, 9], "b")  # shares only the first block
    assert affinity.lookup([1, 2, 3, 4, 5, 6]) == "a"
    assert affinity.lookup([1, 9, 7]) == "b"
    assert affinity.lookup([8]) is None
    small = PrefixAffinity(max_keys=3)
    for i in range(10):
        small.remember([100 + i], "a")
    assert small.lookup([100]) is None and small.lookup([109]) == "a"


def test_affinity_wins_a_tie_of_misses_but_not_against_a_full_hit():
    policy = CacheAwarePolicy()
    a, b = Candidate("a", 0, 0, 40), Candidate("b", 0, 0, 40, affinity=True)
    assert [policy.choose([a, b]).worker_id for _ in range(4)] == ["b"] * 4
    holder = Candidate("a", 0, 40, 40)
    assert policy.choose([holder, b]).worker_id == "a"


def _serve_tenants(policy_name: str, tenants: int, capacity: int, requests: int) -> float:
    """Two simulated workers, each an LRU of `capacity` tenants' prefixes, behind the real
    dispatcher, policy and prefix index; the hit rate over `requests` random tenant visits."""
    import random
    from collections import OrderedDict

    from router.cluster.registry import WorkerRegistry, WorkerState
    from router.metrics.router_metrics import Metrics
    from router.routing.dispatcher import Dispatcher
    from router.routing.prefix_index import PrefixIndex
    from shared.hashing import hash_blocks
    from shared.kv_events import BlockRemoved, BlockStored
    from shared.protocol import Register, TokenDelta, Usage
    from shared.sampling import SamplingParams

    registry, index, sent = WorkerRegistry(), PrefixIndex(ttl_s=0.0), []
    for name in ("w0", "w1"):
        registry.add(WorkerState(Register(name, "m", 4, 1000, "h", 1), name.encode(), 0.0))
    dispatcher = Dispatcher(
        registry,
        index,
        make_policy(policy_name),
        lambda ident, msg: sent.append((ident, msg)),
        Metrics().model("model"),
        max_pending=100,
        max_resubmits=1,
    )
    caches = {"w0": OrderedDict(), "w1": OrderedDict()}
    prompts = [[1000 * t + i for i in range(40)] for t in range(tenants)]
    rng, hits = random.Random(0), 0
    for r in range(requests):
        tenant = rng.randrange(tenants)
        job = dispatcher.start(f"r{r}", prompts[tenant], SamplingParams(max_tokens=1))
        worker = registry.get(job.worker_id)
        cache = caches[job.worker_id]
        hashes = hash_blocks(prompts[tenant], 4)
        if tenant in cache:
            hits += 1
            cache.move_to_end(tenant)
        else:
            cache[tenant] = hashes
            for i, h in enumerate(hashes):
                index.apply(job.worker_id, BlockStored(h, hashes[i - 1] if i else 0, (0,) * 4, 4))
            if len(cache) > capacity:
                _, gone = cache.popitem(last=False)
                index.apply(job.worker_id, BlockRemoved(tuple(gone)))
        dispatcher.on_delta(worker, TokenDelta(job.wire_id, (), "stop", Usage(40, 0, 0)))
    return hits / requests


def test_cache_aware_uses_the_fleets_combined_kv_under_pressure():
    """24 tenants, room for 8 per worker: round robin makes each worker cycle through all 24
    (hit rate ~ 8/24); routed to where a prefix lives, no tenant is held twice and the two
    caches act as one of 16 (~ 16/24)."""
    aware = _serve_tenants("cache_aware", tenants=24, capacity=8, requests=600)
    rr = _serve_tenants("round_robin", tenants=24, capacity=8, requests=600)
    assert aware >= 1.7 * rr, (aware, rr)
    assert aware > 0.55


# ---- KV pressure: partition prefixes, within the imbalance cap ----------------------------


def pressed(worker_id, load, matched=0, blocks=44, affinity=False):
    """A candidate whose cache has been evicting (the fleet cannot hold every prefix)."""
    return Candidate(worker_id, load, matched, blocks, affinity, eviction_rate=5.0)


def test_under_pressure_a_prefix_stays_on_its_worker_despite_lower_load_elsewhere():
    home, idle = pressed("a", 6, affinity=True), pressed("b", 2)
    assert CacheAwarePolicy().choose([home, idle]).worker_id == "a"
    # Without pressure the cost trade moves it: 0.1 x 22 uncached blocks < 4 requests of load.
    calm = [Candidate("a", 6, 0, 44, affinity=True), Candidate("b", 2, 0, 44)]
    assert CacheAwarePolicy().choose(calm).worker_id == "b"


def test_under_pressure_new_prefixes_go_to_the_worker_with_fewer_recent_requests():
    policy = CacheAwarePolicy()
    for _ in range(10):  # "a" has served a tenant lately
        policy.choose([pressed("a", 0, affinity=True), pressed("b", 0)])
    # a new prefix (held nowhere, no last worker) goes to "b", even though "a" is as idle
    assert policy.choose([pressed("a", 0), pressed("b", 0)]).worker_id == "b"


def test_under_pressure_a_worker_holding_the_whole_prefix_serves_it():
    chosen = CacheAwarePolicy().choose([pressed("a", 1), pressed("b", 3, matched=44)])
    assert chosen.worker_id == "b"


def test_under_pressure_a_hot_prefix_spills_but_load_stays_within_the_cap():
    """One prefix, sent to whichever worker served it last: the policy keeps it home until
    that worker's recent share is over the cap, and requests per worker end within 30%."""
    policy, last, served = CacheAwarePolicy(), "a", {"a": 0, "b": 0, "c": 0}
    for _ in range(600):
        chosen = policy.choose([pressed(w, 0, affinity=w == last) for w in sorted(served)])
        served[chosen.worker_id] += 1
        last = chosen.worker_id
    mean = sum(served.values()) / len(served)
    assert max(served.values()) <= 1.3 * mean, served
    assert min(served.values()) > 0


def test_under_pressure_a_badly_overloaded_home_is_left():
    home, idle = pressed("a", 30, affinity=True), pressed("b", 1)
    assert CacheAwarePolicy().choose([home, idle]).worker_id == "b"
