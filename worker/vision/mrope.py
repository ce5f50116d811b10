"""Qwen-VL's 3-D rotary positions (M-RoPE) inside mlx-lm's attention, no forked model file.

mlx-lm serves Qwen2.5-VL's language model as plain Qwen2 with 1-D RoPE, each attention calling
`self.rope(x, offset=cache.offset)`: right for text, where a token's three positions (time,
row, column) are equal and M-RoPE's three frequency sections all turn by the same angle (the
tiny model's text logits match mlx-vlm's to 1e-6). An image's tokens sit at (t, row, column)
from where it starts, and every token after it at its index plus the prompt's rope delta (an
image of h×w merged patches advances positions by max(h, w), not h·w); fed 1-D positions the
image prompts' logits are off by 0.5 on the tiny model.

So while one of our forwards has 3-D positions (its `ForwardContext.mrope_positions`, made by
`forward_positions`), each layer's rope, wrapped in an `MRoPE` by `install_mrope`, applies
mlx-vlm's own M-RoPE: the family's rotary embedding (cos and sin made once per forward and
dtype, kept on the context and shared by all layers) and its
`apply_multimodal_rotary_pos_emb`. Outside that, the wrapped rope runs as before (text-only
forwards keep the CPU table path of `worker.runner.model_hooks`). Nothing here is CPU-only.

A prompt's positions (`image_rope_index`) are host arithmetic on its ids and image grids, in
numpy: computed off the engine thread (worker/vision/preparing.py) before the request is queued.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from worker.attention import current_forward


def forward_positions(
    starts: list[int], own: list[np.ndarray | None], width: int
) -> mx.array | None:
    """A forward's 3-D positions (3, B, width) when a row has its own (`own[b]`: (3, n),
    an M-RoPE image prompt or its decode); the other rows, and the padding, at their index
    from `starts[b]`. None when no row has any: the layers' own rope then."""
    if all(p is None for p in own):
        return None
    index = np.array(starts)[:, None] + np.arange(width)
    out = np.repeat(index[None], 3, axis=0).astype(np.int32)
    for b, positions in enumerate(own):
        if positions is not None:
            out[:, b, : positions.shape[1]] = positions
    return mx.array(out)


class MRoPE(nn.Module):
    """A layer's rope; in a forward with M-RoPE positions, the family's M-RoPE at those."""

    def __init__(self, rope: nn.Module, rotary: nn.Module, apply: Callable):
        super().__init__()
        self.inner = rope
        self._mrope = (rotary, apply)  # a tuple: not a child module of the model

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        forward = current_forward()
        if forward is None or forward.mrope_positions is None:
            return self.inner(x, offset=offset)
        rotary, apply = self._mrope
        tables = forward.mrope_tables
        if x.dtype not in tables:
            tables[x.dtype] = rotary(x, forward.mrope_positions)
        cos, sin = tables[x.dtype]
        return apply(x, x, cos, sin)[0]  # (queries, keys): the second is never evaluated


def install_mrope(trunk: nn.Module, rotary: nn.Module, apply: Callable) -> int:
    """Wrap the rope of every attention layer of `trunk` (outermost); idempotent. Returns
    how many layers were wrapped."""
    wrapped = 0
    for layer in getattr(trunk, "layers", []):
        attention = getattr(layer, "self_attn", None)
        rope = getattr(attention, "rope", None)
        if rope is None or isinstance(rope, MRoPE):
            continue
        attention.rope = MRoPE(rope, rotary, apply)
        wrapped += 1
    return wrapped


def image_rope_index(
    ids: np.ndarray, grids: np.ndarray, merge: int, image_id: int, vision_start_id: int
) -> tuple[np.ndarray, int]:
    """A prompt's M-RoPE positions (3, len(ids)) and rope delta (a token past the prompt sits
    at index + delta): mlx-vlm's `get_rope_index` for images (Qwen2-VL, Qwen2.5-VL, Qwen3-VL
    agree there) in numpy, with no device work and no host read of a device array. Each image
    (`grids[i]`: t, h, w patches) starts where its first image token is; its tokens sit at
    (t, row, column) from the text before it, and the text after it goes on from their max."""
    tokens = ids.tolist()
    images = sum(
        1
        for a, b in zip(tokens, tokens[1:], strict=False)
        if a == vision_start_id and b == image_id
    )
    pieces: list[np.ndarray] = []
    start = 0
    for i in range(images):
        end = tokens.index(image_id, start)
        t, h, w = (int(x) for x in grids[i])
        h, w = h // merge, w // merge
        first = int(pieces[-1].max()) + 1 if pieces else 0
        pieces.append(np.repeat(np.arange(end - start)[None] + first, 3, axis=0))
        grid = np.indices((t, h, w)).reshape(3, -1)  # (t, row, column) of each image token
        pieces.append(grid + end - start + first)
        start = end + t * h * w
    if start < len(tokens):
        first = int(pieces[-1].max()) + 1 if pieces else 0
        pieces.append(np.repeat(np.arange(len(tokens) - start)[None] + first, 3, axis=0))
    positions = np.concatenate(pieces, axis=1).astype(np.int32)
    return positions, int(positions.max()) + 1 - len(tokens)
