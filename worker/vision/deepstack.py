"""Qwen3-VL's deepstack inside mlx-lm's decoder layers, no forked model file.

Qwen3-VL adds, after each of its first few language layers, features of as many middle
layers of its vision tower to the image tokens' hidden states (mlx-vlm's
`_deepstack_process`). mlx-lm serves the language model as plain Qwen3, so while one of our
forwards has image rows (its `ForwardContext.deepstack_adds`, made by `scattered_adds`:
`adds[k]` (B, L, hidden), the features at the image tokens' columns, zero elsewhere), the MLP
of layer k, wrapped by `install_deepstack`, returns its output plus `adds[k]`: the layer's
output is then `h + mlp + adds[k]`, mlx-vlm's `(h + mlp) + adds[k]` up to the order of one
addition. Outside such a forward the MLP runs alone.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from worker.attention import current_forward


class DeepstackMLP(nn.Module):
    """Layer `index`'s MLP; in a forward with deepstack additions, its output plus its own."""

    def __init__(self, mlp: nn.Module, index: int):
        super().__init__()
        self.inner = mlp
        self._index = index

    def __call__(self, x: mx.array) -> mx.array:
        out = self.inner(x)
        forward = current_forward()
        adds = forward.deepstack_adds if forward is not None else None
        if adds is None or self._index >= len(adds):
            return out
        return out + adds[self._index].astype(out.dtype)


def scattered_adds(features: mx.array, index: mx.array, batch: int, width: int) -> list:
    """Per deepstack layer, (batch, width, hidden) holding `features[:, k]` (image tokens,
    layers, hidden) at the flat positions `index`, zero elsewhere."""
    adds = []
    for k in range(features.shape[1]):
        add = mx.zeros((batch * width, features.shape[-1]), dtype=features.dtype)
        add[index] = features[:, k]
        adds.append(add.reshape(batch, width, -1))
    return adds


def install_deepstack(trunk: nn.Module, layers: int) -> None:
    """Wrap the MLPs of the first `layers` decoder layers of `trunk`; idempotent."""
    for index, layer in enumerate(getattr(trunk, "layers", [])[:layers]):
        if not isinstance(layer.mlp, DeepstackMLP):
            layer.mlp = DeepstackMLP(layer.mlp, index)
