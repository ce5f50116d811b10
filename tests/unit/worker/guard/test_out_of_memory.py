"""An allocation failure inside a step fails that step's requests, not the worker: the
others complete with mlx-lm's greedy output, the pool stays intact, the next requests run."""

from __future__ import annotations

import pytest

import worker.engine.outputs as outputs_module
from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    METAL_OOM,
    drive,
    make_engine,
    reference_greedy,
    tiny_model,
)
from tests.support.engine_fixtures import random_prompt as prompt
from worker.kv.memory import (
    OUT_OF_MEMORY,
    MemoryBudgetTooSmall,
    is_out_of_memory,
    plan_memory,
)
from worker.runner.plan import StepKind

GREEDY = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def check_next_requests_run(engine, model):
    p = prompt(19, 9)
    engine.add_request("next", p, GREEDY)
    outputs, errors = {}, {}
    drive(engine, outputs, errors)
    assert not errors and outputs["next"] == reference_greedy(model, p, 8)
    engine.check_integrity()


def test_failed_prefill_step_fails_its_requests_only(model, monkeypatch):
    # a long prompt arriving while `a` decodes is a SEPARATE step: decode, then prefill
    engine = make_engine(model, prefill_chunk=256, step_token_budget=512)
    pa, pb = prompt(13, 1), prompt(200, 2)
    engine.add_request("a", pa, GREEDY)
    outputs, errors = {}, {}
    for _ in range(3):
        for delta in engine.step():
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    fired = []
    real = engine.runner.run

    def run(plan, *args, **kwargs):
        if not fired and plan.prefill:
            fired.append(plan.kind)
            raise RuntimeError(METAL_OOM)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "run", run)
    cleared = []
    monkeypatch.setattr(outputs_module, "clear_cache", lambda: cleared.append(1))
    engine.add_request("b", pb, GREEDY)
    drive(engine, outputs, errors)
    assert fired == [StepKind.PREFILL] and cleared == [1]
    assert set(errors) == {"b"} and errors["b"].startswith(OUT_OF_MEMORY)
    assert outputs["a"] == reference_greedy(model, pa, 8)
    engine.check_integrity()
    check_next_requests_run(engine, model)


@pytest.mark.parametrize("kind", [StepKind.PREFILL, StepKind.DECODE])
def test_failed_step_of_each_kind_frees_blocks_and_serving_goes_on(model, monkeypatch, kind):
    engine = make_engine(model)
    prompts = {"a": prompt(11, 3), "b": prompt(17, 4)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, GREEDY)
    fired = []
    real = engine.runner.run

    def run(plan, *args, **kwargs):
        # a prompts-only forward: padded (PREFILL) or, short prompts, unpadded (MIXED)
        prompts_only = plan.prefill and not plan.decode
        if not fired and (plan.kind is kind or kind is StepKind.PREFILL and prompts_only):
            fired.append(kind)
            raise RuntimeError(METAL_OOM)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "run", run)
    outputs, errors = {}, {}
    drive(engine, outputs, errors)
    assert fired == [kind]
    assert set(errors) == {"a", "b"}  # both were in the failed step
    assert all(e.startswith(OUT_OF_MEMORY) for e in errors.values())
    engine.check_integrity()
    assert not engine.scheduler.has_work()
    check_next_requests_run(engine, model)


def test_other_errors_are_not_called_out_of_memory():
    assert is_out_of_memory(RuntimeError(METAL_OOM))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("[malloc] Unable to allocate 1024 bytes."))
    assert not is_out_of_memory(RuntimeError("[matmul] shapes (2,3) and (4,5) mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not what MLX raises


def test_memory_plan_splits_the_budget_and_shrinks_the_step():
    gib = 2**30
    plan = plan_memory(
        8 * gib, 4 * gib, 2 * gib, per_token=1 << 20, step_tokens=1024, block_size=16
    )
    assert plan.weights + plan.kv + plan.activations <= plan.budget
    assert plan.kv == 2 * gib and plan.step_tokens == 1024
    # 1 GiB left after the weights: a quarter of it for activations at 1 MiB a token
    tight = plan_memory(
        5 * gib, 4 * gib, 2 * gib, per_token=1 << 20, step_tokens=1024, block_size=16
    )
    assert tight.step_tokens == 256 and tight.kv == gib - 256 * (1 << 20)
    with pytest.raises(MemoryBudgetTooSmall, match="weights"):
        plan_memory(3 * gib, 4 * gib, gib, per_token=1 << 20, step_tokens=1024, block_size=16)


def test_kept_prefixes_get_what_the_pool_leaves_within_the_budget():
    gib, mib = 2**30, 2**20
    room = plan_memory(8 * gib, 4 * gib, 2 * gib, mib, 1024, 16, kept_max=256 * mib)
    assert room.kept_prefixes == 256 * mib and room.free == 8 * gib - 7 * gib - 256 * mib
    # 1 GiB after the weights, a quarter for a step, 700 MiB asked for the pool: 68 MiB left
    tight = plan_memory(5 * gib, 4 * gib, 700 * mib, mib, 1024, 16, kept_max=256 * mib)
    assert tight.kept_prefixes == 68 * mib and tight.free == 0
    assert "kept prefixes 0.07" in tight.describe()
    full = plan_memory(5 * gib, 4 * gib, 2 * gib, mib, 1024, 16, kept_max=256 * mib)
    assert full.kept_prefixes == 0  # the pool took all there was


def test_engine_sizes_itself_from_the_budget(model, monkeypatch):
    from worker.config import EngineConfig
    from worker.engine.engine import Engine
    from worker.engine.startup import sizing

    limits = []  # not MLX's own: a 64 MiB limit would stall the rest of this process
    monkeypatch.setattr(sizing, "apply_limits", limits.append)

    config = EngineConfig(block_size=8, memory_budget_bytes=64 << 20, warmup=False)
    engine = Engine.create(model, config, max_context=512)
    plan = engine.memory
    assert plan is not None and plan.budget == 64 << 20
    assert plan.weights + plan.kv + plan.activations + plan.kept_prefixes <= plan.budget
    assert engine.runner.prefix_kv.budget == plan.kept_prefixes  # the kept K/V stays within it
    assert engine.config.prefill_chunk <= engine.config.step_token_budget == plan.step_tokens
    assert limits == [64 << 20]
    with pytest.raises(MemoryBudgetTooSmall):
        Engine.create(model, EngineConfig(block_size=8, memory_budget_bytes=1 << 10, warmup=False))


class FailingRead:
    """A step's sampled tokens whose read (the pipelined path's sync point) fails."""

    def __init__(self, tokens):
        self.tokens = tokens

    def tolist(self):
        raise RuntimeError(METAL_OOM)


def test_failure_when_a_pipelined_decode_step_is_read(model, monkeypatch):
    engine = make_engine(model)
    assert engine.config.pipeline_decode
    prompts = {"a": prompt(11, 5), "b": prompt(14, 6)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, GREEDY)
    real, fired = engine.runner.run, []

    def run(plan, device_tokens=None, *args):
        if isinstance(device_tokens, FailingRead):  # the next step runs on the real tokens
            device_tokens = device_tokens.tokens
        out = real(plan, device_tokens, *args)
        if not fired and plan.kind is StepKind.DECODE:
            fired.append(1)
            return out._replace(tokens=FailingRead(out.tokens))
        return out

    monkeypatch.setattr(engine.runner, "run", run)
    outputs, errors = {}, {}
    drive(engine, outputs, errors)
    assert fired and set(errors) == {"a", "b"}
    assert all(e.startswith(OUT_OF_MEMORY) for e in errors.values())
    engine.check_integrity()
    check_next_requests_run(engine, model)
