"""The chunked gated delta rule against mlx-lm's per-token loop, and when it is taken."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import gated_delta as mlx_gated_delta

from worker.attention import ForwardContext, building
from worker.runner.model_hooks import _original_gated_delta, install_model_hooks
from worker.state.gated_delta import MIN_TOKENS, chunked_gated_delta


def inputs(B: int, T: int, Hk: int, Hv: int, dtype=mx.float32, seed: int = 0):
    """Inputs shaped as mlx-lm's gated delta layers make them: q and k normalised, g a decay
    in (0, 1) (some near 0, some near 1), beta in (0, 1), a nonzero starting state."""
    key = iter(mx.random.split(mx.random.key(seed), 7))
    Dk, Dv = 32, 16
    q = mx.random.normal((B, T, Hk, Dk), key=next(key))
    k = mx.random.normal((B, T, Hk, Dk), key=next(key))
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * Dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((B, T, Hv, Dv), key=next(key))
    g = mx.exp(-mx.exp(2 * mx.random.normal((B, T, Hv), key=next(key))))
    beta = mx.sigmoid(mx.random.normal((B, T, Hv), key=next(key)))
    state = 0.3 * mx.random.normal((B, Hv, Dv, Dk), key=next(key))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), g, beta, state


def padding(B: int, T: int, left: bool = False) -> mx.array:
    lengths = mx.array([max(1, T - 5 * b) for b in range(B)])
    at = mx.arange(T)[None]
    return at >= T - lengths[:, None] if left else at < lengths[:, None]


@pytest.mark.parametrize(
    ("B", "T", "Hk", "Hv", "mask"),
    [
        (1, 8, 2, 2, None),  # shorter than a chunk
        (2, 16, 2, 4, None),  # exactly one chunk; grouped heads
        (3, 53, 2, 4, "right"),  # chunks and a partial one; rows of different lengths
        (2, 70, 1, 2, "left"),  # padding at the start (mlx-lm's batch_generate pads so)
        (4, 130, 2, 2, "right"),
    ],
)
def test_chunks_equal_the_per_token_loop(B, T, Hk, Hv, mask):
    q, k, v, g, beta, state = inputs(B, T, Hk, Hv)
    m = None if mask is None else padding(B, T, left=mask == "left")
    want_y, want_state = _original_gated_delta(q, k, v, g, beta, state, m)
    got_y, got_state = chunked_gated_delta(q, k, v, g, beta, state, m)
    if m is not None:  # a padded position's output is never read
        want_y = mx.where(m[..., None, None], want_y, 0.0)
        got_y = mx.where(m[..., None, None], got_y, 0.0)
    assert got_y.shape == want_y.shape and got_y.dtype == want_y.dtype
    assert mx.allclose(got_y, want_y, atol=2e-5, rtol=1e-4).item()
    assert mx.allclose(got_state, want_state, atol=2e-5, rtol=1e-4).item()


def test_a_fully_masked_row_keeps_its_state_exactly():
    q, k, v, g, beta, state = inputs(2, 20, 2, 2)
    mask = mx.array([[True] * 20, [False] * 20])
    _, after = chunked_gated_delta(q, k, v, g, beta, state, mask)
    assert mx.array_equal(after[1], state[1]).item()
    assert not mx.allclose(after[0], state[0]).item()


def test_half_precision_inputs_give_their_dtype_and_a_float32_state():
    q, k, v, g, beta, state = inputs(2, 24, 2, 2, dtype=mx.float16)
    want_y, want_state = _original_gated_delta(q, k, v, g, beta, state)
    got_y, got_state = chunked_gated_delta(q, k, v, g, beta, state)
    assert got_y.dtype == mx.float16 and got_state.dtype == mx.float32
    assert mx.allclose(got_y, want_y, atol=2e-3).item()
    assert mx.allclose(got_state, want_state, atol=2e-3).item()


def test_the_hook_takes_chunks_only_inside_our_forwards_and_for_prompt_chunks(monkeypatch):
    from worker.runner import model_hooks

    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape[1])
        return chunked_gated_delta(*args, **kwargs)

    monkeypatch.setattr(model_hooks, "chunked_gated_delta", counted)
    monkeypatch.setattr(mlx_gated_delta, "gated_delta_ops", _original_gated_delta)
    install_model_hooks(nn.Module())  # no layers: the module-level routes only
    assert mlx_gated_delta.gated_delta_ops is model_hooks._gated_delta
    q, k, v, g, beta, state = inputs(2, 24, 2, 2)
    ops = mlx_gated_delta.gated_delta_ops
    outside = ops(q, k, v, g, beta, state)  # mlx-lm's own generation: its loop
    with building(ForwardContext(mx.array([0, 0]))):
        inside = ops(q, k, v, g, beta, state)
        short = ops(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], state)
        vector = ops(q, k, v, mx.broadcast_to(g[..., None], (*g.shape, 32)), beta, state)
    assert calls == [24]  # not outside, not a decode step, not a per-channel decay
    assert MIN_TOKENS > 1
    for got, want in zip(inside, outside, strict=True):
        assert mx.allclose(got, want, atol=2e-5, rtol=1e-4).item()
    assert short[0].shape[1] == 1 and vector[0].shape == outside[0].shape
