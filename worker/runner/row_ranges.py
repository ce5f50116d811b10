"""Position ranges a model draws from its cache's `offset`: one per row of our batches.

mlx-lm's Llama 4 computes two things with `mx.arange` over `cache.offset`, as if a batch were
one sequence: its chunk mask (`arange(cache[0].start_position, offset + L)`) and, in its
layers without RoPE, a per-position query temperature (`arange(offset + 1, offset + L + 1)`).
Our caches' `offset` is each row's first position, an array (B,), which `mx.arange` refuses.

So the `mx` such a model's module sees (`ROW_RANGES`) is mlx.core with one change: while one of
our forwards is built (`worker.attention.forward`: its `queries`, L), an `arange` whose start
is an array gives each row its L positions from that start, shaped (B, L, 1). The model lays a range it draws along the query
axis with `[:, None]`, which then reads (B, 1, L, 1) against queries (B, heads, L, dim): the
temperature comes out per row, as mlx-lm computes it for each sequence alone. The chunk mask
built over such ranges is never used (a chunked layer attends with its span's mask:
`LayerCache.attention_mask`). Every other call goes to mlx.core unchanged, so mlx-lm's own
generation in the same process runs as before. The architecture sweep (greedy output equal
to mlx-lm's, batched, with the temperature active) and the load-time check hold it right.
"""

from __future__ import annotations

import sys
import types

import mlx.core as mx
import mlx.nn as nn

from worker.attention import current_forward
from worker.runner.layer_groups import model_type

# model types whose modules draw position ranges from `cache.offset`
ROW_RANGES = frozenset({"llama4"})


class _RowRangesCore(types.ModuleType):
    """mlx.core, with `arange` over per-row starts inside our forwards."""

    def __init__(self):
        super().__init__("mlx.core", "mlx.core, with per-row ranges in our forwards")

    def __getattr__(self, name: str):
        return getattr(mx, name)

    @staticmethod
    def arange(*args, **kwargs) -> mx.array:
        forward = current_forward()
        if forward is None or not args or not isinstance(args[0], mx.array):
            return mx.arange(*args, **kwargs)
        start = args[0]  # (B,): each row's first position of the range
        return (start[:, None] + mx.arange(forward.queries, dtype=start.dtype))[..., None]


_CORE = _RowRangesCore()


def install_row_ranges(model: nn.Module) -> None:
    """Mutates: the module defining `model` sees `_CORE` as `mx`, if its model type is one of
    `ROW_RANGES`. Idempotent."""
    module = sys.modules.get(type(model).__module__)
    if model_type(model) in ROW_RANGES and module is not None and getattr(module, "mx", None) is mx:
        module.mx = _CORE
