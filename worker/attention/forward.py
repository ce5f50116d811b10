"""What one of our forwards tells the hooks inside mlx-lm's model code, which we never fork.

mlx-lm's layers call our hooks with only what mlx-lm passes them: attention (`hook`) gets the
layer's cache, SwiGLU (`worker.runner.model_hooks`) two arrays, a rope (`TableRoPE`, `MRoPE` in
`worker.vision.mrope`) an array and `cache.offset`, an MLP (`worker.vision.deepstack`) its
input. The rest of what a forward needs reaches them here: the model runner builds one
`ForwardContext` per forward and enters it (`building`) around building the forward's graph,
and each hook reads `current_forward()`, None outside our forwards, so that mlx-lm's own
generation in the same process (the load-time check, the benchmarks' baseline) keeps mlx-lm's
behaviour. Each feature keeps its own code in its module and only its data here.

The current context is a `ContextVar`: each thread sees its own (None until it enters one),
and leaving a `building` block, by return or by exception, restores the one before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import mlx.core as mx

Table = tuple[mx.array, mx.array]  # a rope's (cos, sin) for every position of the forward


def _on_cpu() -> bool:
    return mx.default_device() == mx.cpu


@dataclass(eq=False)
class ForwardContext:
    """One forward's data: given by the runner, filled in by the hooks while it is built."""

    offsets: mx.array  # (B,): the caches' `offset`, each row's first position
    # (3, B, L) M-RoPE positions when a row has its own (Qwen-VL images), else None: 1-D rope
    mrope_positions: mx.array | None = None
    # Qwen3-VL deepstack: per deepstack layer k, (B, L, hidden) added to layer k's MLP output
    deepstack_adds: list[mx.array] | None = None
    # L, the query positions each row has in this forward (Llama 4's per-row ranges read it:
    # `worker.runner.row_ranges`)
    queries: int = 0
    # built on the CPU: the exp2 SwiGLU and the table RoPE apply (on a GPU mlx-lm's are fused)
    cpu_fast_paths: bool = field(default_factory=_on_cpu)
    # made on first use, shared by every layer: the table RoPE's (C, S) by rope kind
    # (`worker.runner.model_hooks`), M-RoPE's (cos, sin) by dtype (`worker.vision.mrope`)
    rope_tables: dict[int, Table] = field(default_factory=dict)
    mrope_tables: dict[mx.Dtype, Table] = field(default_factory=dict)
    # attention calls with no cache of ours: KV-shared layers attending K/V passed along
    uncached_attention: int = 0


_CURRENT: ContextVar[ForwardContext | None] = ContextVar("forward_context", default=None)


def current_forward() -> ForwardContext | None:
    """The forward being built on this thread, or None: not one of ours."""
    return _CURRENT.get()


@contextmanager
def building(context: ForwardContext) -> Iterator[ForwardContext]:
    """`context` is the current forward while the block runs; the one before it after."""
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)
