"""The fast CPU paths for mlx-lm's SwiGLU and RoPE (`worker.runner.model_hooks`): taken in our
forwards only, equal to mlx-lm's own to float rounding, and greedy output unchanged."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import activations as mlx_activations
from mlx_lm.models import llama

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    ARCHS,
    make_engine,
    random_prompt,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from worker.attention import ForwardContext, building, current_forward
from worker.attention.exp2 import swiglu
from worker.runner import model_hooks
from worker.runner.model_hooks import TableRoPE, install_model_hooks


def test_only_our_forwards_get_the_fast_swiglu(monkeypatch):
    calls = []
    monkeypatch.setattr(model_hooks, "exp2_swiglu", lambda g, x: calls.append(1) or swiglu(g, x))
    install_model_hooks(tiny_model())
    assert llama.swiglu is model_hooks._swiglu is mlx_activations.swiglu
    gate, x = mx.random.normal((2, 8)), mx.random.normal((2, 8))
    want = model_hooks._original_swiglu(gate, x)
    assert mx.allclose(llama.swiglu(gate, x), want).item() and not calls  # mlx-lm's forward
    with building(ForwardContext(mx.zeros((2,), dtype=mx.int32))):  # the CPU: the exp2 kernels
        assert mx.allclose(llama.swiglu(gate, x), want, rtol=1e-6).item()
        half = llama.swiglu(gate.astype(mx.float16), x.astype(mx.float16))
        assert mx.allclose(half, want.astype(mx.float16), rtol=1e-2).item()
    assert calls == [1]  # float16 went to mlx-lm's function
    assert mx.allclose(llama.swiglu(gate, x), want).item() and calls == [1]  # after: mlx-lm's


@pytest.mark.parametrize(
    "rope",
    [
        nn.RoPE(16, traditional=True, base=10000.0),
        nn.RoPE(16, traditional=False, base=1e6),
        nn.RoPE(16, traditional=False, base=10000.0, scale=0.25),
    ],
    ids=["traditional", "halves", "scaled"],
)
def test_the_table_rope_matches_the_layers_own(rope):
    wrapped = TableRoPE(rope, 0, *model_hooks._rope_form(rope))
    offsets = mx.array([0, 17, 3000], dtype=mx.int32)
    for width in (1, 5):  # decode rows, a prefill chunk
        q = mx.random.normal((3, 6, width, 16), key=mx.random.key(width))
        k = mx.random.normal((3, 2, width, 16), key=mx.random.key(width + 9))
        with building(ForwardContext(offsets)):
            got = [wrapped(q, offset=offsets), wrapped(k, offset=offsets)]
            other = wrapped(q, offset=mx.array(offsets))  # not the forward's offsets: the layer's
            assert current_forward().rope_tables  # the table was made once, for both
        assert mx.allclose(got[0], rope(q, offset=offsets), atol=1e-5).item()
        assert mx.allclose(got[1], rope(k, offset=offsets), atol=1e-5).item()
        assert mx.array_equal(other, rope(q, offset=offsets)).item()
        assert mx.array_equal(wrapped(q, offset=offsets), rope(q, offset=offsets)).item()


def test_a_rope_whose_table_form_does_not_match_stays_unwrapped():
    class Squared(nn.Module):  # not a rotation: no table reproduces it
        dims, traditional = 16, False

        def __call__(self, x, offset=0):
            return x * x

    model = tiny_model()
    model.model.layers[0].self_attn.rope = Squared()
    install_model_hooks(model)
    ropes = [layer.self_attn.rope for layer in model.model.layers]
    assert isinstance(ropes[0], Squared) and isinstance(ropes[1], TableRoPE)
    install_model_hooks(model)  # idempotent: nothing wrapped twice
    assert isinstance(model.model.layers[1].self_attn.rope.inner, nn.Module)
    assert not isinstance(model.model.layers[1].self_attn.rope.inner, TableRoPE)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_greedy_output_equals_mlx_lm_with_the_hooks(arch, monkeypatch):
    tables = []
    real_table = model_hooks._table
    monkeypatch.setattr(model_hooks, "_table", lambda *a: tables.append(1) or real_table(*a))
    model = tiny_model(arch, seed=3)
    engine = make_engine(model)  # installs the hooks
    assert all(isinstance(layer.self_attn.rope, TableRoPE) for layer in model.model.layers)
    prompts = {f"r{i}": random_prompt(20 + 13 * i, seed=i) for i in range(3)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=12))
    tables.clear()  # the load-time probe's forwards are not steps
    steps, real_step = [], engine.step
    monkeypatch.setattr(engine, "step", lambda: steps.append(1) or real_step())
    outputs = run_to_completion(engine)
    # the forwards took the table path: one table per forward, not one per layer
    assert 0 < len(tables) <= len(steps)
    for rid, prompt in prompts.items():
        assert outputs[rid] == reference_greedy(model, prompt, 12), rid
