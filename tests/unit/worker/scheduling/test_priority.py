"""Priority classes in the worker's scheduler (issue 43): waiting interactive work is admitted
before batch work, and when blocks run out batch sequences are preempted first."""

from __future__ import annotations

import random
from collections import deque

from shared.protocol import BATCH, INTERACTIVE
from shared.sampling import SamplingParams
from tests.unit.worker.engine.test_scheduler_pressure import BLOCK, run_plan
from worker.config import EngineConfig
from worker.engine.caches import KVManager
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence, Status, enqueue, preemption_victim
from worker.kv.block_pool import BlockPool
from worker.kv.radix_cache import RadixCache
from worker.runner.plan import StepKind


def seq(name: str, arrival: int, priority: int, length: int = 8, max_tokens: int = 4) -> Sequence:
    tokens = [arrival * 100 + i + 1 for i in range(length)]
    s = Sequence(name, length, tokens, SamplingParams(max_tokens=max_tokens), arrival)
    s.priority = priority
    return s


def names(waiting) -> list[str]:
    return [s.request_id for s in waiting]


def test_interactive_work_waits_ahead_of_batch_work():
    waiting: deque[Sequence] = deque()
    for i, (name, priority) in enumerate(
        [("b1", BATCH), ("i1", INTERACTIVE), ("b2", BATCH), ("i2", INTERACTIVE)]
    ):
        enqueue(waiting, seq(name, i, priority))
    assert names(waiting) == ["i1", "i2", "b1", "b2"]


def test_a_preempted_sequence_resumes_first_of_its_class():
    waiting: deque[Sequence] = deque()
    for i, name in enumerate(["i1", "b1"]):
        enqueue(waiting, seq(name, i, INTERACTIVE if name[0] == "i" else BATCH))
    enqueue(waiting, seq("b0", 5, BATCH), first=True)
    enqueue(waiting, seq("i0", 6, INTERACTIVE), first=True)
    assert names(waiting) == ["i0", "i1", "b0", "b1"]


def test_the_victim_is_batch_work_even_when_it_is_older():
    running = [seq("b-old", 0, BATCH), seq("i-new", 2, INTERACTIVE), seq("b-mid", 1, BATCH)]
    assert preemption_victim(running).request_id == "b-mid"
    assert preemption_victim(running[:2]).request_id == "b-old"
    assert preemption_victim([seq("i1", 0, 0), seq("i2", 3, 0)]).request_id == "i2"


def test_under_pressure_batch_sequences_are_preempted_and_interactive_ones_finish():
    """A small pool: two batch sequences started first, then interactive ones arrive; every
    preemption takes a batch sequence while one runs, and the interactive ones finish first."""
    pool = BlockPool(17, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(block_size=BLOCK, prefill_chunk=8, step_token_budget=16, batch_hold_s=0)
    scheduler = Scheduler(KVManager(pool, RadixCache(pool), config), config, max_context=200)
    batch = [seq(f"b{i}", i, BATCH, length=12, max_tokens=20) for i in range(2)]
    interactive = [seq(f"i{i}", 10 + i, INTERACTIVE, length=12, max_tokens=12) for i in range(2)]
    rng, finished, victims = random.Random(0), [], []
    for s in batch:
        scheduler.add(s)
    for step in range(200):
        if step == 3:
            for s in interactive:
                scheduler.add(s)
        running = list(scheduler.running)
        plan = scheduler.schedule()
        for victim in plan.preempted:
            if any(s.priority == BATCH for s in running):
                assert victim.priority == BATCH
            victims.append(victim.request_id)
        if plan.kind is not StepKind.IDLE:
            run_plan(scheduler, plan, rng)
        finished += [s.request_id for s in batch + interactive if s.status is Status.FINISHED]
        if not scheduler.has_work():
            break
    order = list(dict.fromkeys(finished))
    assert victims, "the pool is small enough that a preemption comes up"
    assert set(order[:2]) == {"i0", "i1"} and set(order) == {"i0", "i1", "b0", "b1"}


def test_the_engine_queues_a_request_in_its_class():
    """Generate.priority reaches the scheduler: a batch request waits behind interactive ones
    that arrived after it (the worker loop passes `msg.priority` to add_request)."""
    from tests.support.engine_fixtures import make_engine, tiny_model

    engine = make_engine(tiny_model())
    engine.add_request("batch", [1, 2, 3, 4, 5], SamplingParams(max_tokens=2), priority=BATCH)
    engine.add_request("live", [6, 7, 8, 9], SamplingParams(max_tokens=2))
    assert names(engine.scheduler.waiting) == ["live", "batch"]
    assert [s.priority for s in engine.scheduler.waiting] == [INTERACTIVE, BATCH]


def test_batch_lines_pause_while_an_interactive_prompt_prefills_and_resume_intact():
    """Issue 50: two batch lines decode; an interactive prompt of several chunks arrives. Each
    step while it prefills is its own (no batch row, no batch admission); the batch lines keep
    their blocks and computed tokens (never preempted, nothing recomputed) and decode again
    once it has its first token. A batch line waiting then is admitted only after."""
    pool = BlockPool(64, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(block_size=BLOCK, prefill_chunk=8, step_token_budget=32, batch_hold_s=0)
    scheduler = Scheduler(KVManager(pool, RadixCache(pool), config), config, max_context=200)
    batch = [seq(f"b{i}", i, BATCH, length=6, max_tokens=40) for i in range(2)]
    for s in batch:
        scheduler.add(s)
    rng = random.Random(0)
    for _ in range(3):  # both batch lines prefilled, decoding
        run_plan(scheduler, scheduler.schedule(), rng)
    assert all(not s.is_prefilling and s.status is Status.RUNNING for s in batch)
    live = seq("i0", 10, INTERACTIVE, length=30, max_tokens=3)
    late = seq("b2", 11, BATCH, length=6, max_tokens=2)
    scheduler.add(live)
    scheduler.add(late)
    paused_steps = 0
    while live.is_prefilling or live.status is Status.WAITING:
        before = {s.request_id: (s.num_computed, list(s.block_ids)) for s in batch}
        plan = scheduler.schedule()
        planned = plan.decode + [c.seq for c in plan.prefill]
        assert planned == [live], [s.request_id for s in planned]
        assert late.status is Status.WAITING  # not admitted beside the interactive prefill
        run_plan(scheduler, plan, rng)
        for s in batch:  # kept (the block reserved for its next token, too)
            computed, blocks = before[s.request_id]
            assert s.num_computed == computed and s.block_ids[: len(blocks)] == blocks
        paused_steps += 1
    assert paused_steps == 4  # 30 tokens in chunks of 8
    plan = scheduler.schedule()  # the interactive decodes; the batch lines resume beside it
    assert {s.request_id for s in plan.decode} >= {"i0", "b0", "b1"}
    assert all(s.num_preemptions == 0 for s in batch)


def test_paused_batch_lines_answer_as_if_never_paused():
    """Through the engine and the tiny model: batch lines paused for an interactive prompt's
    prefill answer exactly the greedy tokens they would alone, and so does the prompt."""
    from tests.support.engine_fixtures import make_engine, reference_greedy, tiny_model

    model = tiny_model()
    engine = make_engine(model, batch_hold_s=0)  # (the hold: test_batch_hold.py)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = {"b0": list(range(1, 20)), "b1": list(range(30, 45))}
    for name, prompt in prompts.items():
        engine.add_request(name, prompt, greedy, priority=BATCH)
    outputs: dict[str, list[int]] = {}
    paused = 0
    for step in range(200):
        if step == 3:
            prompts["live"] = [(7 * i) % 90 + 1 for i in range(150)]  # several chunks
            engine.add_request("live", prompts["live"], greedy)
        running = {s.request_id: s.num_computed for s in engine.scheduler.running}
        for delta in engine.step():
            assert delta.error is None
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
        after = {s.request_id: s.num_computed for s in engine.scheduler.running}
        if "live" in running and any(after.get(b) == running.get(b) for b in ("b0", "b1")):
            paused += 1
        if not engine.has_work():
            break
    assert paused >= 2
    for name, prompt in prompts.items():
        assert outputs[name] == reference_greedy(model, prompt, 12), name


def test_batch_prompts_prefill_one_chunk_a_step_together():
    """Issue 50: eight batch lines arriving at an idle worker prefill one chunk's worth of
    tokens a step between them (an interactive request arriving mid-step waits for a short
    step), while an interactive prompt still takes its own chunk beside them."""
    pool = BlockPool(256, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1)
    config = EngineConfig(block_size=BLOCK, prefill_chunk=8, step_token_budget=64, batch_hold_s=0)
    scheduler = Scheduler(KVManager(pool, RadixCache(pool), config), config, max_context=200)
    batch = [seq(f"b{i}", i, BATCH, length=12, max_tokens=2) for i in range(8)]
    for s in batch:
        scheduler.add(s)
    rng, steps = random.Random(0), 0
    while any(s.status is not Status.FINISHED for s in batch):
        plan = scheduler.schedule()
        assert sum(c.num_tokens for c in plan.prefill if c.seq.yields) <= config.prefill_chunk
        run_plan(scheduler, plan, rng)
        steps += 1
        if steps == 2:
            live = seq("i0", 20, INTERACTIVE, length=12, max_tokens=2)
            scheduler.add(live)
            plan = scheduler.schedule()
            assert [c.seq.request_id for c in plan.prefill] == ["i0"]
            assert plan.prefill[0].num_tokens == config.prefill_chunk
            run_plan(scheduler, plan, rng)
    assert steps >= 8 * 12 // config.prefill_chunk
