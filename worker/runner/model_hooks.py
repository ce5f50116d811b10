"""Faster CPU paths for three mlx-lm pieces, taken only while one of our forwards is built.

- **SwiGLU**: mlx-lm's `swiglu`, routed to `worker.attention.exp2.swiglu` (the sigmoid from
  exponent bits: MLX's CPU `sigmoid` costs ~6 ns per element here).
- **RoPE**: mlx-lm's attention calls `self.rope(x, offset=cache.offset)` for queries and keys
  in every layer, and on the CPU `mx.fast.rope` computes its cos and sin on each call: 60 calls
  per forward of the default model, 8.6 ms of a batch-8 decode forward, 33 ms of a 256-token
  prefill chunk. Every layer sees the same positions, so each layer's rope is wrapped
  (`TableRoPE`) and one table per forward is applied as `x * C + swap(x) * S` in a compiled
  kernel: 0.9 and 9 ms. The table is the model's own rope applied once to a probe (1 at the
  first element of each rotated pair, 0 at the second), so it holds whatever frequencies
  that rope uses; a rope whose table form does not match it on random inputs at load is left
  unwrapped.
- **The gated delta rule** (Qwen3-Next, Qwen3.5, Kimi Linear, OLMo hybrid, Bailing V3): on the
  CPU mlx-lm runs it token by token, eight small ops per token and layer; a prompt chunk of
  8 tokens or more goes through `worker.state.gated_delta` instead (matrix products per 16
  tokens; the same algebra, equal to the loop to float rounding): 4-7x less time in the
  recurrence over a 128-300-token prefill.

As with attention (`worker.attention.hook`), mlx-lm model modules bind `swiglu` at import, so
the hook is patched into every model module already imported. Both read the forward being
built from `worker.attention.forward` (its offsets; the tables are kept on it). A forward
that is not ours keeps mlx-lm's functions: mlx-lm's own generation in the same process (the
engine bench's baseline, the load-time check against mlx-lm), and every forward on a GPU,
where both are one fused kernel already.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import activations as mlx_activations
from mlx_lm.models import gated_delta as mlx_gated_delta

from worker.attention import ForwardContext, current_forward
from worker.attention.exp2 import BoundedCompile
from worker.attention.exp2 import swiglu as exp2_swiglu
from worker.attention.hook import rebind_in_models
from worker.state.gated_delta import MIN_TOKENS, chunked_gated_delta

_original_swiglu = mlx_activations.swiglu
_original_gated_delta = mlx_gated_delta.gated_delta_ops


def _fast() -> ForwardContext | None:
    """The forward being built, where the CPU paths apply to it; else None."""
    forward = current_forward()
    return forward if forward is not None and forward.cpu_fast_paths else None


def _swiglu(gate: mx.array, x: mx.array) -> mx.array:
    if _fast() is not None and gate.dtype == x.dtype == mx.float32:
        return exp2_swiglu(gate, x)
    return _original_swiglu(gate, x)


def _gated_delta(q, k, v, g, beta, state=None, mask=None):
    """mlx-lm's `gated_delta_ops`, in chunks for a prompt chunk of ours (scalar decay)."""
    if _fast() is None or state is None or g.ndim != 3 or q.shape[1] < MIN_TOKENS:
        return _original_gated_delta(q, k, v, g, beta, state, mask)
    return chunked_gated_delta(q, k, v, g, beta, state, mask)


def _swap(x: mx.array, traditional: bool) -> mx.array:
    """Each rotated pair's two elements exchanged (all of the last axis is rotated)."""
    if traditional:  # pairs (2i, 2i + 1)
        return x.reshape(*x.shape[:-1], -1, 2)[..., ::-1].reshape(x.shape)
    half = x.shape[-1] // 2  # pairs (i, i + half)
    return mx.concatenate([x[..., half:], x[..., :half]], axis=-1)


def _probe(shape: tuple[int, ...], traditional: bool) -> mx.array:
    """1 at the first element of each rotated pair, 0 at the second."""
    half = shape[-1] // 2
    if traditional:
        return mx.broadcast_to(mx.tile(mx.array([1.0, 0.0]), half), shape)
    return mx.broadcast_to(mx.concatenate([mx.ones((half,)), mx.zeros((half,))]), shape)


def _table(rope: nn.Module, x: mx.array, offset, traditional: bool):
    """(C, S) of `rope` at `offset` for rows shaped as `x`, broadcast over its heads."""
    probed = rope(_probe((x.shape[0], 1, *x.shape[2:]), traditional), offset=offset)
    if traditional:
        cos, sin = probed[..., 0::2], probed[..., 1::2]
        pair = probed.shape[:-1] + (-1,)
        return mx.repeat(cos, 2, axis=-1), mx.stack([-sin, sin], axis=-1).reshape(pair)
    cos, sin = mx.split(probed, 2, axis=-1)
    return mx.concatenate([cos, cos], axis=-1), mx.concatenate([-sin, sin], axis=-1)


def _rotate(x: mx.array, cos: mx.array, sin: mx.array, *, traditional: bool) -> mx.array:
    return x * cos + _swap(x, traditional) * sin


# compiled once per layout for all layers: one trace per shape, not one per layer
_ROTATE = {t: BoundedCompile(partial(_rotate, traditional=t)) for t in (False, True)}


class TableRoPE(nn.Module):
    """A layer's rope, applied from the forward's shared table inside our forwards."""

    def __init__(self, rope: nn.Module, kind: int, traditional: bool, dims: int):
        super().__init__()
        self.inner = rope
        self._kind, self._traditional, self._dims = kind, traditional, dims

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        forward = _fast()
        if (
            forward is None
            or offset is not forward.offsets
            or x.dtype != mx.float32
            or x.shape[-1] != self._dims
        ):
            return self.inner(x, offset=offset)
        tables = forward.rope_tables
        if self._kind not in tables:
            tables[self._kind] = _table(self.inner, x, offset, self._traditional)
        cos, sin = tables[self._kind]
        (rotate,) = _ROTATE[self._traditional](x, cos, sin)
        return rotate(x, cos, sin)


def _rope_form(rope: nn.Module) -> tuple[bool, int] | None:
    """(traditional, dims) of a rope whose table form matches it on random inputs, or None."""
    traditional, dims = bool(getattr(rope, "traditional", False)), getattr(rope, "dims", None)
    if not isinstance(dims, int) or dims % 2:
        return None
    x = mx.random.normal((2, 3, 5, dims), key=mx.random.key(0))
    offset = mx.array([0, 4000], dtype=mx.int32)
    try:
        want = rope(x, offset=offset)
        got = _rotate(x, *_table(rope, x, offset, traditional), traditional=traditional)
        ok = mx.allclose(got, want, rtol=1e-4, atol=1e-4).item()
    except (ValueError, TypeError):
        return None
    return (traditional, dims) if ok else None


def install_model_hooks(model: nn.Module) -> None:
    """Route mlx-lm's `swiglu` through `_swiglu` (in its module and every model module loaded
    so far) and its gated delta loop through `_gated_delta`, and wrap each attention layer's
    rope in a `TableRoPE` where its form checks out. Idempotent; outside our forwards on the
    CPU all are mlx-lm's own."""
    mlx_activations.swiglu = _swiglu
    mlx_gated_delta.gated_delta_ops = _gated_delta  # called by name from its own module
    rebind_in_models("swiglu", _original_swiglu, _swiglu)
    kinds: list[tuple[nn.Module, tuple[bool, int]]] = []  # a rope of each kind, and its form
    layers = getattr(model, "layers", None) or getattr(getattr(model, "model", None), "layers", [])
    for layer in layers:  # `model`: the trunk (`worker.runner.trunk`) or the whole model
        attention = getattr(layer, "self_attn", None)
        rope = getattr(attention, "rope", None)
        if rope is None or isinstance(rope, TableRoPE) or not isinstance(rope, nn.Module):
            continue
        form = _rope_form(rope)
        if form is None:
            continue
        same = (i for i, (r, f) in enumerate(kinds) if f == form and _same_rope(r, rope, form))
        kind = next(same, len(kinds))
        if kind == len(kinds):
            kinds.append((rope, form))
        attention.rope = TableRoPE(rope, kind, *form)


def _same_rope(a: nn.Module, b: nn.Module, form: tuple[bool, int]) -> bool:
    """Whether two ropes of one form give the same table (layers usually share one)."""
    x = mx.ones((1, 1, 3, form[1]))
    offset = mx.array([7], dtype=mx.int32)
    return mx.array_equal(a(x, offset=offset), b(x, offset=offset)).item()
