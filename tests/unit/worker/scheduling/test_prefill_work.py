"""Long prompts share a step one at a time, oldest first (worker/engine/prefill_work.py): two
long prompts sent together finish their prefills one after the other, not both at the end;
a short prompt still joins a step beside a long chunk."""

from __future__ import annotations

import random

from shared.protocol import INTERACTIVE
from tests.unit.worker.engine.test_scheduler_pressure import BLOCK, run_plan
from tests.unit.worker.scheduling.test_priority import seq
from worker.config import EngineConfig
from worker.engine.caches import KVManager
from worker.engine.prefill_work import PrefillWork
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence
from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache

CHUNK, BUDGET = 8, 32  # a short step reads CHUNK * BUDGET = 256 query-key pairs


def scheduler() -> Scheduler:
    pool = BlockPool(256, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(block_size=BLOCK, prefill_chunk=CHUNK, step_token_budget=BUDGET)
    return Scheduler(KVManager(pool, RadixCache(pool), config), config, max_context=400)


def prefill_steps(s: Scheduler, until: Sequence, rng: random.Random) -> list[set[str]]:
    """Run steps until `until` has its first token; each step's prefilling request ids."""
    steps = []
    while until.num_computed < until.prompt_len:
        plan = s.schedule()
        steps.append({c.seq.request_id for c in plan.prefill})
        run_plan(s, plan, rng)
    return steps


def test_two_long_prompts_prefill_one_after_the_other_once_their_contexts_are_long():
    s, rng = scheduler(), random.Random(0)
    older, younger = (seq(name, i, INTERACTIVE, length=120) for i, name in enumerate("ab"))
    s.add(older)
    s.add(younger)
    steps = prefill_steps(s, older, rng)
    # side by side while their chunks read few keys (8 x 8..32 pairs beside the first's)...
    assert steps[0] == {"a", "b"}
    # ...then the older alone: it has its prompt done while the younger still has most left
    assert steps[-1] == {"a"}
    assert younger.prefill_left > younger.prompt_len // 2
    assert sum(step == {"a"} for step in steps) >= 10
    rest = prefill_steps(s, younger, rng)
    assert all(step == {"b"} for step in rest)
    # one prompt after the other takes no more steps than side by side would
    assert len(steps) + len(rest) <= 2 * -(-120 // CHUNK)


def test_a_short_prompt_joins_a_step_beside_a_long_chunk():
    s, rng = scheduler(), random.Random(1)
    long = seq("long", 0, INTERACTIVE, length=200)
    s.add(long)
    for _ in range(10):  # its context is now 80 tokens: each chunk reads 640 pairs
        run_plan(s, s.schedule(), rng)
    s.add(seq("short", 1, INTERACTIVE, length=6))
    plan = s.schedule()
    assert {c.seq.request_id for c in plan.prefill} == {"long", "short"}


def test_the_first_chunk_of_a_step_runs_whatever_its_work():
    work = PrefillWork(short=256)
    assert work.fits(256, 20_000)
    work.take(256, 20_000)
    assert work.fits(8, 32)  # a short prompt's chunk beside it
    work.take(8, 32)
    assert not work.fits(256, 20_000)  # another long one waits
