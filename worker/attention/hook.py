"""The one seam into mlx-lm: its `scaled_dot_product_attention`, routed to our paged cache.

mlx-lm model modules bind `scaled_dot_product_attention` from `mlx_lm.models.base` when they
are imported, so the hook is patched into base and into every model module already imported.
It is installed when a `ModelRunner` is made (not at import), and `worker.runner.model_support`
checks, per model, that every layer's attention really goes through it.
"""

from __future__ import annotations

import sys

from mlx_lm.models import base as mlx_base

from worker.attention.forward import current_forward

_original_sdpa = mlx_base.scaled_dot_product_attention


def _paged_sdpa(queries, keys, values, cache, scale, mask, sinks=None, **kwargs):
    note = getattr(cache, "note_attention", None)
    if note is None:  # not our cache: mlx-lm's own attention, unchanged
        if (forward := current_forward()) is not None:  # a KV-shared layer: K/V passed along
            forward.uncached_attention += 1
        return _original_sdpa(
            queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks, **kwargs
        )
    mask = cache.attention_mask(mask)  # a chunked layer's: ours, not the model's
    note(mask, sinks, keys, values)
    if cache.gathered:  # K/V gathered from the pool, the mask ours: mlx-lm's own attention
        return _original_sdpa(
            queries, keys, values, cache=None, scale=scale, mask=mask, sinks=sinks, **kwargs
        )
    return cache.attend(queries, scale, sinks)


def install_attention_hook() -> None:
    """Route mlx-lm's attention through `_paged_sdpa`, in base and in every model module
    loaded so far. Idempotent; the hook leaves non-paged caches to mlx-lm's own function."""
    mlx_base.scaled_dot_product_attention = _paged_sdpa
    rebind_in_models("scaled_dot_product_attention", _original_sdpa, _paged_sdpa)


def rebind_in_models(name: str, original, replacement) -> None:
    """Every mlx-lm model module loaded so far that bound `name` to `original` at import gets
    `replacement` instead (model modules import their helpers by name)."""
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("mlx_lm.models.") and getattr(module, name, None) is original:
            setattr(module, name, replacement)
