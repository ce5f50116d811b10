"""2**y from exponent bits (`worker.attention.exp2`): the softmax weights and SwiGLU against
MLX's own `power` and `sigmoid`."""

from __future__ import annotations

import mlx.core as mx

from worker.attention import exp2
from worker.attention.exp2 import exp2_shifted, swiglu


def test_the_compiled_exp2_matches_power_to_two_ulp():
    scores = mx.concatenate(
        [
            mx.linspace(-130.0, 0.0, 100_003),  # every fraction and exponent the weights see
            mx.random.normal((4, 1000), key=mx.random.key(5)).reshape(-1) * 9,
            mx.array([-mx.inf, 0.0, -0.5, 0.5, -1e-7]),
        ]
    ).reshape(1, -1)
    top = scores.max(axis=-1, keepdims=True)
    got, want = exp2_shifted(scores, top), mx.power(2.0, scores - top)
    normal = want >= 2.0**-125
    error = mx.where(normal, mx.abs(got - want) / mx.where(normal, want, 1.0), 0.0)
    assert error.max().item() < 2.6e-7
    # below 2**-125 (masked keys included) a weight stays below 2**-125: nothing beside 1
    assert mx.where(normal, 0.0, got).max().item() <= 2.0**-125
    # and a masked key weighs exactly 0: a subnormal weight would make weights @ V slow
    assert got[0, -5].item() == 0.0 and mx.all(got[0, :1000] == 0.0).item()


def test_the_compiled_exp2_keeps_a_bounded_number_of_traces(monkeypatch):
    kernels = exp2.BoundedCompile(*exp2._EXP2.functions)
    monkeypatch.setattr(kernels, "MAX_SHAPES", 4)
    monkeypatch.setattr(exp2, "_EXP2", kernels)
    first = None
    for keys in range(1, 11):  # a decode tick's new width, ten times over
        x = mx.zeros((3, keys))
        assert mx.array_equal(exp2_shifted(x, x.max(axis=-1, keepdims=True)), mx.ones((3, keys)))
        first = first or kernels.compiled
        assert len(kernels.shapes) <= 4
    assert kernels.compiled is not first  # compiled anew: the old traces went with the old ones


def test_swiglu_matches_silu_to_float_rounding():
    gate = mx.concatenate(
        [
            mx.linspace(-200.0, 200.0, 100_001),  # past both ends of the clamp
            mx.random.normal((20_000,), key=mx.random.key(3)) * 6,
            mx.array([0.0, -0.0, 1e-30, -1e-30, 88.7, -88.7]),
        ]
    ).reshape(1, -1)
    x = mx.random.normal(gate.shape, key=mx.random.key(4))
    want = gate * mx.sigmoid(gate) * x
    got = swiglu(gate, x)
    big = mx.abs(want) > 1e-30
    error = mx.where(big, mx.abs(got - want) / mx.where(big, mx.abs(want), 1.0), 0.0)
    assert error.max().item() < 4e-7
    assert mx.all(mx.isfinite(got)).item()
    # a dtype the kernels do not take falls back to sigmoid
    half = swiglu(gate.astype(mx.float16), x.astype(mx.float16))
    assert half.dtype == mx.float16
