"""Prompts mid-prefill share a step oldest first (worker/engine/scheduler.py): two long
prompts sent together take as many steps as side by side, but the older is done in about
half of them; a sliding-window model's chunks stay within what its pages are sized for."""

from __future__ import annotations

import random

from shared.protocol import INTERACTIVE
from tests.unit.worker.engine.test_scheduler_pressure import BLOCK, run_plan
from tests.unit.worker.scheduling.test_priority import seq
from worker.config import EngineConfig
from worker.engine.caches import KVManager
from worker.engine.scheduler import Scheduler
from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache

CHUNK = 8
LENGTH = 120


def scheduler() -> Scheduler:
    pool = BlockPool(256, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(block_size=BLOCK, prefill_chunk=CHUNK, step_token_budget=32)
    return Scheduler(KVManager(pool, RadixCache(pool), config), config, max_context=400)


def test_two_long_prompts_sent_together_finish_one_after_the_other():
    s, rng = scheduler(), random.Random(0)
    older, younger = (seq(name, i, INTERACTIVE, length=LENGTH) for i, name in enumerate("ab"))
    s.add(older)
    s.add(younger)
    done_at, step = {}, 0
    while "b" not in done_at:
        plan = s.schedule()
        step += 1
        assert sum(c.num_tokens for c in plan.prefill) <= 2 * CHUNK  # no longer a step
        run_plan(s, plan, rng)
        for prompt in (older, younger):
            if prompt.num_computed >= prompt.prompt_len:
                done_at.setdefault(prompt.request_id, step)
    side_by_side = -(-LENGTH // CHUNK)
    assert done_at["b"] <= side_by_side + 1
    assert done_at["a"] <= side_by_side // 2 + 2
