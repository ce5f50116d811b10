"""A failed step leaves nothing it wrote in the prefix cache, and a failed first half of a
SEPARATE step (decode, then prefill) does not run the second half on what it ended."""

from __future__ import annotations

import mlx.core as mx
import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    METAL_OOM,
    drive,
    make_engine,
    reference_greedy,
    tiny_model,
)
from tests.support.engine_fixtures import random_prompt as prompt
from worker.runner.plan import StepKind

GREEDY = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def spoil(pool, block_id):
    """What a failed forward leaves in the block it was writing: garbage."""
    rows = slice(block_id * pool.block_size, (block_id + 1) * pool.block_size)
    for layer in range(pool.num_layers):
        for kv in (pool.k, pool.v):
            kv[layer][rows] = mx.full(kv[layer][rows].shape, 50.0, dtype=kv[layer].dtype)


class FailingRead:
    """A pipelined step's tokens whose read fails: its writes are garbage."""

    def __init__(self, tokens, on_read):
        self.tokens, self.on_read = tokens, on_read

    def tolist(self):
        self.on_read()
        raise RuntimeError(METAL_OOM)


def test_block_a_failed_pipelined_step_was_writing_is_not_cached(model, monkeypatch):
    engine = make_engine(model)  # blocks of 8: position 15 completes the second one
    assert engine.config.pipeline_decode and engine.block_size == 8
    pa = prompt(13, 1)
    engine.add_request("a", pa, GREEDY)
    real, fired = engine.runner.run, []

    def run(plan, device_tokens=None, *args):
        if isinstance(device_tokens, FailingRead):
            device_tokens = device_tokens.tokens
        out = real(plan, device_tokens, *args)
        row = plan.decode[0] if plan.decode else None
        if not fired and plan.kind is StepKind.DECODE and row.start == 15:
            fired.append(row.block_ids[1])  # this step writes the block's last row
            return out._replace(
                tokens=FailingRead(out.tokens, lambda: spoil(engine.pool, fired[0]))
            )
        return out

    monkeypatch.setattr(engine.runner, "run", run)
    outputs, errors = {}, {}
    drive(engine, outputs, errors)
    assert fired and set(errors) == {"a"}
    written = pa + reference_greedy(model, pa, 3)  # 16 tokens: two full blocks
    assert engine.cache.peek_prefix_length(written) == 8  # the second block is not cached
    engine.check_integrity()
    # a prompt that extends what `a` wrote computes it again, not from the garbage
    pc = written + prompt(5, 2)
    engine.add_request("c", pc, GREEDY)
    outputs, errors = {}, {}
    drive(engine, outputs, errors)
    assert not errors and outputs["c"] == reference_greedy(model, pc, 8)
    engine.check_integrity()


def test_failed_decode_half_of_a_separate_step_skips_what_it_ended(model, monkeypatch):
    engine = make_engine(model, prefill_chunk=256, step_token_budget=512)
    pa, pb = prompt(13, 3), prompt(150, 4)
    engine.add_request("a", pa, GREEDY, n=2)
    outputs, errors = {}, {}
    for _ in range(4):
        for delta in engine.step():
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    # choice 1 of `a` preempted: it prefills again, in the step where choice 0 decodes
    (choice1,) = [s for s in engine.scheduler.sequences_of("a") if s.choice == 1]
    engine.scheduler.preempt(choice1)
    engine.add_request("b", pb, GREEDY)  # a long chunk: the step is SEPARATE
    real, runs = engine.runner.run, []

    def run(plan, *args, **kwargs):
        runs.append(
            (
                plan.kind,
                [r.key.request_id for r in plan.decode],
                [r.key.request_id for r in plan.prefill],
            )
        )
        if len(runs) == 1:
            assert plan.kind is StepKind.DECODE and not plan.prefill
            raise RuntimeError(METAL_OOM)
        running = {s.key for s in engine.scheduler.running}
        assert all(r.key in running for r in plan.prefill)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "run", run)
    drive(engine, outputs, errors)
    assert runs[1] == (StepKind.PREFILL, [], ["b"])  # a's choice 1 was ended with a
    assert set(errors) == {"a"}
    assert outputs["b"] == reference_greedy(model, pb, 8)
    assert not engine.scheduler.has_work()
    assert engine.pool.check_integrity().held == 1  # the scratch block only: nothing leaked
    engine.check_integrity()
