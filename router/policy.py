"""Routing policies: pick one worker among healthy candidates for a request.

cache_aware: cost = prefill_weight x uncached prompt blocks + load, lowest wins; the worker a
prefix was last sent to (`router.affinity`) gets `affinity_share` of the prompt's blocks off
its cost, which keeps tenants partitioned when the fleet's KV cannot hold them all; but when
load is badly unbalanced (max - min > balance_abs_threshold and max > balance_rel_threshold x min,
as SGLang's router does) it falls back to the least-loaded worker, so a hot prefix cannot pile
every request on one worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

POLICY_NAMES = ("cache_aware", "round_robin", "least_load")


class Candidate(NamedTuple):
    worker_id: str
    load: int  # running + waiting requests
    matched_blocks: int  # leading prompt blocks the worker holds
    prompt_blocks: int  # full blocks of the prompt at this worker's block size
    affinity: bool = False  # this prefix was last sent to this worker


class Policy(Protocol):
    name: str

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        """The chosen candidate; `candidates` is non-empty."""


@dataclass
class CacheAwarePolicy:
    prefill_weight: float = 0.1  # one queued request costs as much as 10 uncached blocks
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 2.0
    # an affinity worker counts as holding this share of the prompt it may have lost: enough
    # to win a tie of misses, not enough to beat a worker that holds the whole prefix
    affinity_share: float = 0.5
    name: str = "cache_aware"
    _turn: int = 0  # rotates among equal-cost workers, so idle workers share new prefixes

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        if self.is_unbalanced(candidates):
            return _least_loaded(candidates)
        best = min((self.cost(c), c.load) for c in candidates)
        ties = sorted(
            (c for c in candidates if (self.cost(c), c.load) == best), key=lambda c: c.worker_id
        )
        self._turn += 1
        return ties[(self._turn - 1) % len(ties)]

    def cost(self, c: Candidate) -> float:
        uncached = c.prompt_blocks - c.matched_blocks
        if c.affinity:
            uncached = max(0.0, uncached - self.affinity_share * c.prompt_blocks)
        return self.prefill_weight * uncached + c.load

    def is_unbalanced(self, candidates: Sequence[Candidate]) -> bool:
        loads = [c.load for c in candidates]
        low, high = min(loads), max(loads)
        return high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low


@dataclass
class RoundRobinPolicy:
    name: str = "round_robin"
    _next: int = 0

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        ordered = sorted(candidates, key=lambda c: c.worker_id)
        chosen = ordered[self._next % len(ordered)]
        self._next += 1
        return chosen


@dataclass
class LeastLoadPolicy:
    name: str = "least_load"

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        return _least_loaded(candidates)


def _least_loaded(candidates: Sequence[Candidate]) -> Candidate:
    # Among equally loaded workers, prefer the one holding more of the prompt.
    return min(candidates, key=lambda c: (c.load, -c.matched_blocks, c.worker_id))


def make_policy(
    name: str,
    prefill_weight: float = 0.1,
    balance_abs_threshold: int = 8,
    balance_rel_threshold: float = 2.0,
) -> Policy:
    if name == "cache_aware":
        return CacheAwarePolicy(prefill_weight, balance_abs_threshold, balance_rel_threshold)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_load":
        return LeastLoadPolicy()
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
