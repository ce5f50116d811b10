"""The simulated experiments: one JSON-able row per (scenario, size, policy), bound included.

- pressure: the issue's two-worker configuration as loadgen runs it (closed loop, concurrency
  16; 24 or 16 tenants of ~1.4k-token prompts; 500 MiB KV each = 355 blocks of 32 tokens of
  the default model's float32 K/V; this CPU's speeds: ~300 prefill tokens/s, ~0.2 s a decode
  step at batch 8).
- fleet: 16-64 workers, Zipf-distributed tenants with multi-turn sessions, open loop at a
  fixed rate per worker, accelerator-like speeds; the fleet's KV holds ~8 system prompts per
  worker, against 512 tenants.
- conversations: 2-8 workers, tenants' conversations that share a prompt_cache_key but not a
  prefix (workload.Conversations), run with and without the keys on the same traffic.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

from router.routing.policy import CacheAwarePolicy, Policy, make_policy
from scripts.fleetsim.bound import pooled_lru_hit_rate
from scripts.fleetsim.fleet import Fleet, FleetShape
from scripts.fleetsim.sim_worker import CostModel
from scripts.fleetsim.workload import Conversations, ConversationShape, Traffic, TrafficShape

POLICIES = ("cache_aware", "cache_aware_no_partition", "round_robin", "least_load")


def policy_named(name: str) -> Policy:
    """A router policy; cache_aware_no_partition is cache_aware with its KV-pressure mode off
    (the policy before issue 15), for comparison."""
    if name == "cache_aware_no_partition":
        return CacheAwarePolicy(pressure_eviction_rate=math.inf)
    return make_policy(name)


THIS_CPU = CostModel(prefill_s_per_token=0.0033, decode_step_s=0.15, decode_s_per_seq=0.01)
ACCELERATOR = CostModel(prefill_s_per_token=0.0002, decode_step_s=0.02, decode_s_per_seq=0.001)


@dataclass(frozen=True)
class Scenario:
    name: str
    fleet: FleetShape
    traffic: TrafficShape | ConversationShape
    requests: int
    warmup: int
    concurrency: int | None = None  # closed loop; None: open loop at rate_per_worker
    rate_per_worker: float = 4.0
    seed: int = 0


def pressure(tenants: int, seed: int = 0, requests: int = 1000) -> Scenario:
    return Scenario(
        f"pressure-{tenants}-tenants",
        FleetShape(workers=2, capacity_blocks=355, block_size=32, cost=THIS_CPU),
        TrafficShape(tenants=tenants, system_tokens=1400, question_tokens=20, output_tokens=32),
        requests=requests,
        warmup=requests // 5,
        concurrency=16,
        seed=seed,
    )


def pressure_as_run(tenants: int, seed: int = 0) -> Scenario:
    """The real two-worker measurement in docs/benchmarks-history.md (issue 15): 72 requests at
    concurrency 8, 16 output tokens, ~1.33k-token prompts, ~340 blocks per worker; every
    request counts (the tenants' first visits, a third of them, are misses for any router)."""
    return Scenario(
        f"pressure-as-run-{tenants}-tenants",
        FleetShape(workers=2, capacity_blocks=340, block_size=32, cost=THIS_CPU),
        TrafficShape(tenants=tenants, system_tokens=1330, question_tokens=20, output_tokens=16),
        requests=72,
        warmup=0,
        concurrency=8,
        seed=seed,
    )


def fleet(workers: int, seed: int = 0, requests_per_worker: int = 300) -> Scenario:
    return Scenario(
        f"fleet-{workers}",
        FleetShape(workers=workers, capacity_blocks=355, block_size=32, cost=ACCELERATOR),
        TrafficShape(
            tenants=512,
            zipf_s=0.9,
            system_tokens=1400,
            question_tokens=40,
            output_tokens=64,
            continue_prob=0.5,
            max_turns=6,
            sessions_per_tenant=4,
        ),
        requests=requests_per_worker * workers,
        warmup=requests_per_worker * workers // 3,
        rate_per_worker=4.0,
        seed=seed,
    )


def conversations(
    workers: int,
    seed: int = 0,
    requests_per_worker: int = 300,
    key_per: str = "tenant",
    closed: bool = False,
) -> Scenario:
    """Open loop at 4 req/s per worker, 6 tenants per worker (the KV about holds their live
    conversations), or closed loop with 8 clients per worker and 16 tenants per worker (KV
    pressure: the caches evict and the policy partitions)."""
    return Scenario(
        f"conversations-{'closed' if closed else 'open'}-key-per-{key_per}",
        FleetShape(workers=workers, capacity_blocks=355, block_size=32, cost=ACCELERATOR),
        ConversationShape(tenants=(16 if closed else 6) * workers, key_per=key_per),
        requests=requests_per_worker * workers,
        warmup=requests_per_worker * workers // 3,
        concurrency=8 * workers if closed else None,
        rate_per_worker=4.0,
        seed=seed,
    )


def run(scenario: Scenario, policies=POLICIES, keys: bool | None = None) -> list[dict]:
    """One row per policy and one for the capacity bound; `keys=False` strips the requests'
    prompt_cache_keys (the same traffic otherwise), and the rows say which."""
    rate = scenario.rate_per_worker * scenario.fleet.workers
    source = Conversations if isinstance(scenario.traffic, ConversationShape) else Traffic
    requests = source(scenario.traffic, scenario.seed).requests(scenario.requests, rate)
    if keys is False:
        requests = [replace(r, cache_key=None) for r in requests]
    shape = scenario.fleet
    common = {
        "scenario": scenario.name,
        "workers": shape.workers,
        "seed": scenario.seed,
        "tenants": scenario.traffic.tenants,
        "requests": scenario.requests - scenario.warmup,
        **({} if keys is None else {"keys": keys}),
    }
    rows = []
    for policy in policies:
        cpu = time.process_time()
        result = Fleet(shape, policy_named(policy)).run(
            requests, scenario.concurrency, scenario.warmup
        )
        rows.append(
            {
                **common,
                "policy": policy,
                "hit_rate": round(result.hit_rate, 4),
                "req_per_s": round(common["requests"] / result.sim_seconds, 3),
                "imbalance": round(result.imbalance, 3),
                "evicted_blocks": result.evicted_blocks,
                "sim_cpu_s": round(time.process_time() - cpu, 2),
            }
        )
    capacity = shape.capacity_blocks * shape.workers
    bound = pooled_lru_hit_rate(requests, capacity, shape.block_size, scenario.warmup)
    rows.append({**common, "policy": "capacity_bound", "hit_rate": round(bound, 4)})
    return rows


def describe(scenario: Scenario) -> dict:
    return asdict(scenario)
