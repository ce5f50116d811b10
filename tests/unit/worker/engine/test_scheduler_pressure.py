"""The scheduler under KV pressure, driven without a model: every planned row must lie in its
sequence's blocks, and no sequence may be planned twice in one step (a sequence preempted
while the step was planned, then admitted again in the same step, once was: its second row
ran past its blocks and failed the whole forward)."""

from __future__ import annotations

import random

from shared.sampling import SamplingParams
from worker.config import EngineConfig
from worker.engine.caches import KVManager
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence, Status
from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache
from worker.runner.plan import StepKind

BLOCK = 4


def check_rows(plan) -> None:
    """What ModelRunner.plan_rows would build from `plan`, checked against the blocks."""
    for s in plan.decode:
        end = s.num_computed + 1 + len(s.draft)
        assert s.status is Status.RUNNING and end <= len(s.block_ids) * BLOCK
    for s, n in plan.prefill:
        assert s.status is Status.RUNNING and s.num_computed + n <= len(s.block_ids) * BLOCK


def run_plan(scheduler: Scheduler, plan, rng: random.Random) -> None:
    """The engine's bookkeeping for `plan` (each forward of a SEPARATE plan in turn)."""
    planned = plan.decode + [c.seq for c in plan.prefill]
    assert len({id(s) for s in planned}) == len(planned), "a sequence planned twice in a step"
    for part in plan.split():
        check_rows(part)
        for s in part.decode:
            scheduler.computed(s, 1)
            scheduler.append_token(s, rng.randrange(100, 200), None)
        for s, n in part.prefill:
            scheduler.computed(s, n)
            if s.num_computed == len(s.tokens):
                scheduler.append_token(s, rng.randrange(100, 200), None)


def test_no_row_runs_past_its_blocks_under_pressure():
    preemptions = sum(run_workload(seed) for seed in range(12))
    assert preemptions > 0  # the pool is small enough that the case comes up


def run_workload(seed: int) -> int:
    """Random requests over three shared prefixes for 400 steps; the preemptions seen."""
    rng = random.Random(seed)
    pool = BlockPool(24, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(
        block_size=BLOCK,
        prefill_chunk=8,
        step_token_budget=rng.choice([9, 12, 20]),
        max_running=6,
    )
    scheduler = Scheduler(KVManager(pool, RadixCache(pool), config), config, max_context=200)
    tenants = [[rng.randrange(1, 90) for _ in range(rng.randrange(8, 30))] for _ in range(3)]
    arrival, preemptions = 0, 0
    for _ in range(400):
        if rng.random() < 0.35:
            tokens = rng.choice(tenants) + [
                rng.randrange(1, 90) for _ in range(rng.randrange(1, 6))
            ]
            sampling = SamplingParams(max_tokens=rng.randrange(2, 12))
            scheduler.add(Sequence(f"r{arrival}", len(tokens), list(tokens), sampling, arrival))
            arrival += 1
        plan = scheduler.schedule()
        preemptions += len(plan.preempted)
        if plan.kind is not StepKind.IDLE:
            run_plan(scheduler, plan, rng)
    return preemptions


def test_a_prompt_that_would_overcommit_the_pool_waits_instead_of_preempting():
    pool = BlockPool(21, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)  # 20 usable
    config = EngineConfig(block_size=BLOCK, prefill_chunk=8, step_token_budget=16)
    scheduler = Scheduler(
        KVManager(pool, cache := RadixCache(pool), config), config, max_context=200
    )
    first = Sequence("a", 48, list(range(1, 49)), SamplingParams(max_tokens=4), 0)  # 13 blocks
    second = Sequence("b", 40, list(range(100, 140)), SamplingParams(max_tokens=4), 1)  # 11
    scheduler.add(first)
    scheduler.add(second)
    rng = random.Random(0)
    plan = scheduler.schedule()
    # room for both first chunks, not for both prompts: the second waits
    assert [c.seq for c in plan.prefill] == [first] and second.status is Status.WAITING
    while first.status is not Status.FINISHED:
        assert not plan.preempted
        run_plan(scheduler, plan, rng)
        plan = scheduler.schedule()
    assert second.status is Status.RUNNING  # admitted once the first one was done
    # the attempts that backed out counted nothing: each prompt's tokens (all but the last,
    # always computed) once, so the workers' hit rate is per request, not per attempt
    assert cache.hit_tokens + cache.miss_tokens == 47 + 39
