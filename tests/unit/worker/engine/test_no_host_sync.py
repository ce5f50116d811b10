"""Building a step never reads device data on the host.

Between launching a step (`mx.async_eval`) and resolving it, a host read of any device array
waits for the step in flight (an in-order stream), which on an Apple GPU idles the GPU for a
whole step. These tests build steps with a step in flight and count every way an MLX array
reaches the host while `ModelRunner.run` builds the next one.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import make_engine, reference_greedy, tiny_model

HOST_READS = ("tolist", "item", "__array__", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def counting_host_reads(reads: list[str]):
    """Record (by name) every host read of an mx.array and every mx.eval inside the block."""
    saved = {name: getattr(mx.array, name) for name in HOST_READS}
    saved_eval = mx.eval

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            reads.append(name)
            return fn(self, *args, **kwargs)

        return counted

    for name, fn in saved.items():
        setattr(mx.array, name, wrap(name, fn))
    mx.eval = lambda *a, **k: (reads.append("eval"), saved_eval(*a, **k))[1]
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(mx.array, name, fn)
        mx.eval = saved_eval


def test_the_counter_sees_each_kind_of_host_read():
    """So that a silent counter cannot pass the real test."""
    reads: list[str] = []
    a = mx.array([3])
    with counting_host_reads(reads):
        a.tolist()
        a.item()
        int(a)
        float(a)
        bool(a)
        mx.eval(a)
    assert reads == ["tolist", "item", "__int__", "__float__", "__bool__", "eval"]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=24),
        SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=3, logprobs=True),
    ],
    ids=["greedy", "sampled"],
)
def test_pipelined_decode_builds_steps_without_host_reads(sampling):
    model = tiny_model("llama")
    engine = make_engine(model)
    runner = engine.runner
    original_run = runner.run
    pipelined, reads = [], []

    def run(plan, device_tokens=None, times=None):
        if device_tokens is None or times is not None:
            return original_run(plan, device_tokens, times)
        assert engine._inflight is not None  # a step is in flight while this one is built
        with counting_host_reads(reads):
            out = original_run(plan, device_tokens, times)
        pipelined.append(len(plan.decode))
        return out

    runner.run = run
    prompts = {f"r{i}": [(5 * i + j) % 97 for j in range(9 + 4 * i)] for i in range(3)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, sampling)
    outputs: dict[str, list[int]] = {}
    while engine.has_work():
        for delta in engine.step():
            assert delta.error is None
            outputs.setdefault(delta.request_id, []).extend(delta.token_ids)
    assert len(pipelined) >= 10, "steady decode should have been pipelined"
    assert reads == [], f"the forward read device data on the host: {sorted(set(reads))}"
    if sampling.greedy:
        for rid, prompt in prompts.items():
            assert outputs[rid] == reference_greedy(model, prompt, 24)


def test_mixed_and_prefill_steps_build_without_host_reads():
    """The non-pipelined plans obey the same rule while they build (they evaluate after)."""
    engine = make_engine(tiny_model("qwen3"), prefill_chunk=16, step_token_budget=32)
    original_run, reads, kinds = engine.runner.run, [], []

    def run(plan, device_tokens=None, times=None):
        with counting_host_reads(reads):
            out = original_run(plan, device_tokens, times)
        kinds.append(plan.kind.value)
        return out

    engine.runner.run = run
    engine.add_request("a", list(range(40)), SamplingParams(max_tokens=30))
    for _ in range(4):
        engine.step()
    engine.add_request("b", list(range(3, 60)), SamplingParams(max_tokens=5))
    while engine.has_work():
        engine.step()
    assert {"prefill", "decode", "mixed"} <= set(kinds)
    assert reads == []
