"""Run an mlx-lm model over the paged KV pool, without forking mlx-lm's model files.

The seam (see DESIGN.md): attention in mlx-lm models does rope(offset=cache.offset) ->
cache.update_and_fetch(k, v) -> base.scaled_dot_product_attention(q, k, v, cache=cache).
We hand each layer a `PagedLayerCache`, whose update_and_fetch scatters the new K/V into the
pool by slot id, and patch `scaled_dot_product_attention` so that, for our cache, it runs
paged attention over the sequence's blocks instead of the dense K/V it was given.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as mlx_base

from worker.kv.block_pool import BlockPool
from worker.paged_attention import paged_attention, write_kv

_original_sdpa = mlx_base.scaled_dot_product_attention


def _sdpa(queries, keys, values, cache, scale, mask, sinks=None, **kwargs):
    if isinstance(cache, PagedLayerCache):
        if sinks is not None:
            raise NotImplementedError("attention sinks are not supported over the paged KV")
        return cache.attend(queries, scale)
    return _original_sdpa(
        queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks, **kwargs
    )


def install_paged_attention() -> None:
    """Route mlx-lm's attention through `_sdpa`, in base and in every model module loaded."""
    mlx_base.scaled_dot_product_attention = _sdpa
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("mlx_lm.models.")
            and getattr(module, "scaled_dot_product_attention", None) is _original_sdpa
        ):
            module.scaled_dot_product_attention = _sdpa


install_paged_attention()


@dataclass(frozen=True)
class BatchLayout:
    """Where one forward's tokens go in the pool and what each query may attend to.

    Rows are sequences, right-padded to a common length L. Padding tokens write to a scratch
    block and their outputs are ignored; `context_lengths` counts them as if real so that
    every row's queries are its last L positions (the paged-attention contract), while the
    causal mask keeps real queries off the padding keys.
    """

    tokens: mx.array  # (B, L) int32
    offsets: mx.array  # (B,) position of each row's first token
    write_slots: mx.array  # (B * L,) pool slot of each token
    block_tables: mx.array  # (B, max_blocks)
    context_lengths: mx.array  # (B,) offsets + L
    last_index: mx.array  # (B,) index in L of each row's last real token


def build_layout(
    rows: list[tuple[list[int], int, list[int]]], block_size: int, scratch_block: int
) -> BatchLayout:
    """`rows`: (new token ids, position of the first, block ids of the sequence)."""
    width = max(len(toks) for toks, _, _ in rows)
    tokens, offsets, slots, last = [], [], [], []
    for toks, start, blocks in rows:
        tokens.append(toks + [0] * (width - len(toks)))
        offsets.append(start)
        last.append(len(toks) - 1)
        for pos in range(start, start + len(toks)):
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        slots.extend(scratch_block * block_size + i % block_size for i in range(width - len(toks)))
    max_blocks = max(-(-(start + width) // block_size) for _, start, _ in rows)
    tables = [
        blocks[:max_blocks] + [scratch_block] * (max_blocks - len(blocks)) for _, _, blocks in rows
    ]
    offsets_arr = mx.array(offsets, dtype=mx.int32)
    return BatchLayout(
        tokens=mx.array(tokens, dtype=mx.int32),
        offsets=offsets_arr,
        write_slots=mx.array(slots, dtype=mx.int32),
        block_tables=mx.array(tables, dtype=mx.int32),
        context_lengths=offsets_arr + width,
        last_index=mx.array(last, dtype=mx.int32),
    )


class PagedLayerCache:
    """What one attention layer sees as its cache during one forward."""

    def __init__(self, pool: BlockPool, layer: int, layout: BatchLayout, backend: str):
        self.pool, self.layer, self.layout, self.backend = pool, layer, layout, backend

    @property
    def offset(self) -> mx.array:
        return self.layout.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        B, H, L, D = keys.shape
        write_kv(
            self.pool.k[self.layer],
            self.pool.v[self.layer],
            self.layout.write_slots,
            keys.swapaxes(1, 2).reshape(B * L, H, D),
            values.swapaxes(1, 2).reshape(B * L, H, D),
        )
        return keys, values

    def make_mask(self, *args, **kwargs):
        return None  # paged attention applies causality and lengths itself

    def attend(self, queries: mx.array, scale: float) -> mx.array:
        return paged_attention(
            queries,
            self.pool.k[self.layer],
            self.pool.v[self.layer],
            self.layout.block_tables,
            self.layout.context_lengths,
            scale=scale,
            block_size=self.pool.block_size,
            backend=self.backend,
        )


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: mx.Dtype
    vocab_size: int


def probe_shape(model: nn.Module) -> ModelShape:
    """Layer count, KV heads, head dim and the K/V dtype, read off a one-token forward."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([[0]]), cache=cache)
    keys = cache[0].state[0]
    return ModelShape(len(cache), keys.shape[1], keys.shape[3], keys.dtype, logits.shape[-1])


class ModelRunner:
    """Forward passes of one model over a BlockPool."""

    def __init__(
        self, model: nn.Module, pool: BlockPool, scratch_block: int, backend: str = "auto"
    ):
        self.model, self.pool, self.scratch_block, self.backend = (
            model,
            pool,
            scratch_block,
            backend,
        )
        if not hasattr(model, "model"):
            raise NotImplementedError(f"{type(model).__name__} has no .model backbone")
        self._head = model_head(model)

    def forward(
        self, rows: list[tuple[list[int], int, list[int]]], tokens: mx.array | None = None
    ) -> mx.array:
        """Logits (B, V) at each row's last real token; K/V of every row written to the pool.

        `tokens` (B,), when given, replaces the rows' token ids: one decode token per row,
        still on the device (the previous step's samples)."""
        layout = build_layout(rows, self.pool.block_size, self.scratch_block)
        if tokens is not None:
            layout = dataclasses.replace(layout, tokens=tokens.astype(mx.int32).reshape(-1, 1))
        caches = [
            PagedLayerCache(self.pool, i, layout, self.backend) for i in range(self.pool.num_layers)
        ]
        # The backbone, then the output projection on the rows' last real tokens only:
        # projecting every prefill position onto the vocabulary is wasted work.
        hidden = self.model.model(layout.tokens, cache=caches)
        last = hidden[mx.arange(hidden.shape[0]), layout.last_index]
        return self._head(last)


def model_head(model: nn.Module):
    """The output projection of an mlx-lm causal LM (tied embeddings or lm_head)."""
    args = getattr(model, "args", None)
    if getattr(args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return model.model.embed_tokens.as_linear
    return model.lm_head
