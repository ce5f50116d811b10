"""Routing policies: pick one worker among healthy candidates for a request.

cache_aware: cost = prefill_weight x uncached prompt blocks + load, lowest wins (a block the
worker can pull from a peer counts the pull's share of recomputing it: router.routing.transfer,
so an idle worker that pulls beats a busy holder); the worker a
prefix was last sent to (`router.routing.affinity`) gets `affinity_share` of the prompt's blocks off
its cost, which keeps tenants partitioned when the fleet's KV cannot hold them all; but when
load is badly unbalanced (max - min > balance_abs_threshold and max > balance_rel_threshold x min,
as SGLang's router does) it falls back to the least-loaded worker, so a hot prefix cannot pile
every request on one worker. Between workers equal in cost and load, an interactive request
goes to the one running fewer of a batch's lines (`Candidate.batch_rows`), then in turn.

Under KV pressure (some worker's prefix cache has been evicting blocks lately) the fleet
cannot hold every tenant, and trading a few uncached blocks for load lets each LRU see every
tenant and churn. cache_aware then partitions: a prefix goes to the worker that holds it (or
it was last sent to) while that worker's recent share of requests stays within `max_imbalance`
of the mean and its in-flight load is not badly over the least loaded's; a new prefix goes to
the worker with the fewest recent requests. Tuned in the fleet simulator (scripts/fleet_sim.py;
docs/benchmarks-history.md: 96-98% of the capacity bound on the two-worker, 24-tenant configuration).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from router.routing.recent_share import RecentShares
from shared.config.choices import POLICY_NAMES
from shared.config.sections import RouterSection


class Candidate(NamedTuple):
    worker_id: str
    load: int  # running + waiting requests
    matched_blocks: int  # leading prompt blocks the worker holds
    prompt_blocks: int  # full blocks of the prompt at this worker's block size
    affinity: bool = False  # this prefix was last sent to this worker
    eviction_rate: float = 0.0  # blocks its cache evicts per heartbeat, smoothed
    keyed: bool = False  # the request's prompt_cache_key was last sent to this worker
    # the fleet cache (router.routing.transfer): blocks beyond `matched_blocks` it can pull
    # from their holder, each costing `pull_ratio` of recomputing it
    pull_blocks: int = 0
    pull_ratio: float = 1.0
    # a batch's lines in flight there (part of `load`): between workers equal in cost and
    # load, the one with fewer is serving more live requests already, so its batch is held to
    # the small bound (router.routing.job.batch_room); sending live traffic there leaves the
    # other workers to the batch, and the request meets fewer batch rows in its worker's steps
    batch_rows: int = 0

    @property
    def uncached(self) -> float:
        """Prompt blocks it would compute, a pulled block counting its share of one."""
        pulled = self.pull_blocks * self.pull_ratio
        return self.prompt_blocks - self.matched_blocks - self.pull_blocks + pulled


class Policy(Protocol):
    name: str

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        """The chosen candidate; `candidates` is non-empty."""


@dataclass
class CacheAwarePolicy:
    # the three knobs a user sets (their defaults are the settings' declarations)
    prefill_weight: float = RouterSection.prefill_weight
    balance_abs_threshold: int = RouterSection.balance_abs_threshold
    balance_rel_threshold: float = RouterSection.balance_rel_threshold
    # an affinity worker counts as holding this share of the prompt it may have lost: enough
    # to win a tie of misses, not enough to beat a worker that holds the whole prefix
    affinity_share: float = 0.5
    # under KV pressure: a prefix stays on its worker while the requests routed there lately
    # are at most the mean x (1 + max_imbalance) + balance_slack (0.15: in the simulator 0.3
    # let closed-loop req/s fall 5-10% from a 1.1 max/mean skew, 0.1 cost 3-5% hit rate)
    max_imbalance: float = 0.15
    balance_slack: float = 1.0
    # evicting more than this (blocks per heartbeat, smoothed) is KV pressure: after one
    # burst, pressure mode lasts about a minute
    pressure_eviction_rate: float = 0.1
    # under pressure a miss costs a whole prefill and someone else's cached prefix, so the
    # in-flight guard lets a worker run further ahead before its prefixes move. Measured
    # (docs/benchmarks-history.md, round 6): at concurrency 16 this lets all 16 requests sit on one
    # worker for 40 s while the other idles, yet with 8 or 4 (both workers 98-99% busy) the
    # moved prefixes' evictions cost hits (57% / 52% against 61%) and req/s did not rise
    pressure_balance_abs_threshold: int = 16
    name: str = "cache_aware"
    _turn: int = 0  # rotates among equal-cost workers, so idle workers share new prefixes
    _shares: RecentShares = field(default_factory=RecentShares)

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        chosen = self._choose(candidates)
        self._shares.add(chosen.worker_id, len(candidates))
        return chosen

    def _choose(self, candidates: Sequence[Candidate]) -> Candidate:
        if any(c.eviction_rate > self.pressure_eviction_rate for c in candidates):
            return self.choose_partitioned(candidates)
        if self.is_unbalanced(candidates):
            return _least_loaded(candidates)
        keyed = self.keyed_within_guard(candidates)
        if keyed is not None:
            return keyed
        best = min((self.cost(c), c.load, c.batch_rows) for c in candidates)
        ties = sorted(
            (c for c in candidates if (self.cost(c), c.load, c.batch_rows) == best),
            key=lambda c: c.worker_id,
        )
        self._turn += 1
        return ties[(self._turn - 1) % len(ties)]

    def cost(self, c: Candidate) -> float:
        uncached = c.uncached
        if c.affinity:
            uncached = max(0.0, uncached - self.affinity_share * c.prompt_blocks)
        return self.prefill_weight * uncached + c.load

    def keyed_within_guard(self, candidates: Sequence[Candidate]) -> Candidate | None:
        """The worker that served this prompt_cache_key last, unless its load is badly over
        the least loaded's (the balance guard): a key is a stronger hint than a short prefix."""
        keyed = next((c for c in candidates if c.keyed), None)
        low = min(c.load for c in candidates)
        if keyed is None or self._overloaded(keyed.load, low, self.balance_abs_threshold):
            return None
        return keyed

    def choose_partitioned(self, candidates: Sequence[Candidate]) -> Candidate:
        """The worker that holds (or last served) this prefix, within the load cap; a new
        prefix goes where the cache is under the least pressure."""
        eligible = self.within_share(candidates)
        keyed = next((c for c in eligible if c.keyed), None)
        if keyed is not None:
            return keyed
        best = max(eligible, key=lambda c: (self.holding(c), -c.load, c.worker_id))
        if self.holding(best) * 2 >= best.prompt_blocks > 0:
            return best
        recent = self._shares.recent
        return min(eligible, key=lambda c: (recent(c.worker_id), c.load, c.worker_id))

    def within_share(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Candidates whose recent requests are within the imbalance cap and whose load is
        not badly over the least loaded's (the balance guard, per worker here, so that one
        hot worker does not send every prefix to the least loaded)."""
        mean = self._shares.mean(c.worker_id for c in candidates)
        cap = mean * (1 + self.max_imbalance) + self.balance_slack
        low = min(c.load for c in candidates)
        eligible = [
            c
            for c in candidates
            if self._shares.recent(c.worker_id) <= cap
            and not self._overloaded(c.load, low, self.pressure_balance_abs_threshold)
        ]
        return eligible or [_least_loaded(candidates)]

    def _overloaded(self, load: int, low: int, abs_threshold: int) -> bool:
        return load - low > abs_threshold and load > self.balance_rel_threshold * low

    def holding(self, c: Candidate) -> int:
        """Blocks of the prompt the worker holds, its last worker counting as holding all."""
        return c.prompt_blocks if c.affinity else c.matched_blocks

    def is_unbalanced(self, candidates: Sequence[Candidate]) -> bool:
        loads = [c.load for c in candidates]
        return self._overloaded(max(loads), min(loads), self.balance_abs_threshold)


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
    # Among equally loaded workers, prefer the one holding (or cheaply pulling) more of it.
    return min(candidates, key=lambda c: (c.load, c.uncached, c.worker_id))


def make_policy(
    name: str,
    prefill_weight: float = RouterSection.prefill_weight,
    balance_abs_threshold: int = RouterSection.balance_abs_threshold,
    balance_rel_threshold: float = RouterSection.balance_rel_threshold,
) -> Policy:
    if name == "cache_aware":
        return CacheAwarePolicy(prefill_weight, balance_abs_threshold, balance_rel_threshold)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_load":
        return LeastLoadPolicy()
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
