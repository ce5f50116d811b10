"""Routing policies: cost trade-off, balance guard, round robin, least load."""

from __future__ import annotations

import pytest

from router.policy import CacheAwarePolicy, Candidate, make_policy


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
