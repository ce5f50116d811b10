"""The batch hold (worker/engine/batch_yield.py, issue 50): when the last interactive request
on a worker ends, batch lines wait `batch_hold_s` for the next one, and while interactive work
is recent a step of batch rows only queues no step behind it."""

from __future__ import annotations

import random

from shared.protocol import BATCH, INTERACTIVE
from tests.unit.worker.engine.test_scheduler_pressure import BLOCK, run_plan
from tests.unit.worker.scheduling.test_priority import seq
from worker.config import EngineConfig
from worker.engine.batch_yield import RECENT_S
from worker.engine.caches import KVManager
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Status
from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache
from worker.runner.plan import StepKind

HOLD_S = 0.15


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scheduler_with_batch(clock: Clock) -> tuple[Scheduler, list]:
    """Two batch lines decoding on a scheduler with the hold, and one interactive request
    that ran to its end beside them."""
    pool = BlockPool(64, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(
        block_size=BLOCK, prefill_chunk=8, step_token_budget=32, batch_hold_s=HOLD_S
    )
    kv = KVManager(pool, RadixCache(pool), config)
    scheduler = Scheduler(kv, config, max_context=200, clock=clock)
    batch = [seq(f"b{i}", i, BATCH, length=6, max_tokens=60) for i in range(2)]
    for s in batch:
        scheduler.add(s)
    rng = random.Random(0)
    live = seq("i0", 5, INTERACTIVE, length=6, max_tokens=2)
    scheduler.add(live)
    while live.status is not Status.FINISHED:
        run_plan(scheduler, scheduler.schedule(), rng)
    return scheduler, batch


def test_batch_work_waits_the_hold_after_the_last_interactive_request_then_runs():
    clock = Clock()
    scheduler, batch = scheduler_with_batch(clock)
    assert scheduler.hold_s() == HOLD_S
    assert scheduler.schedule().kind is StepKind.IDLE  # nothing runs: the hold
    clock.now = HOLD_S / 2
    assert 0 < scheduler.hold_s() < HOLD_S and scheduler.schedule().kind is StepKind.IDLE
    clock.now = HOLD_S
    assert scheduler.hold_s() == 0
    plan = scheduler.schedule()
    assert {s.request_id for s in plan.decode + [c.seq for c in plan.prefill]} == {"b0", "b1"}


def test_an_interactive_request_in_the_hold_runs_at_once_alone():
    clock = Clock()
    scheduler, batch = scheduler_with_batch(clock)
    clock.now += HOLD_S / 3
    scheduler.add(seq("i1", 9, INTERACTIVE, length=6, max_tokens=2))
    assert scheduler.hold_s() == 0
    plan = scheduler.schedule()
    assert [c.seq.request_id for c in plan.prefill] == ["i1"] and plan.decode == []


def test_no_hold_without_interactive_work_before_or_with_the_hold_off():
    clock = Clock()
    for hold in (HOLD_S, 0.0):
        pool = BlockPool(64, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
        config = EngineConfig(block_size=BLOCK, prefill_chunk=8, batch_hold_s=hold)
        scheduler = Scheduler(KVManager(pool, RadixCache(pool), config), config, 200, clock=clock)
        scheduler.add(seq("b0", 0, BATCH, length=6, max_tokens=4))
        assert scheduler.hold_s() == 0 and scheduler.schedule().kind is not StepKind.IDLE
    scheduler, _ = scheduler_with_batch(clock)
    scheduler.batch_hold.hold_s = 0.0
    assert scheduler.hold_s() == 0 and scheduler.schedule().kind is not StepKind.IDLE


def test_batch_only_steps_are_not_pipelined_while_interactive_work_is_recent():
    clock = Clock()
    scheduler, batch = scheduler_with_batch(clock)
    clock.now += HOLD_S
    rng = random.Random(1)
    while (plan := scheduler.schedule()).prefill:  # until both batch lines decode
        run_plan(scheduler, plan, rng)
    assert plan.kind is StepKind.DECODE
    for s in plan.decode:  # the step in flight, as the engine launches it
        scheduler.computed(s, 1, in_flight=True)
    running = list(scheduler.running)
    assert not scheduler.can_continue_decode(running)
    clock.now += RECENT_S
    assert scheduler.can_continue_decode(running)
