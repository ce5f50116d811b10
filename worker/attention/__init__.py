"""Paged attention over the worker's KV pool: the one front the rest of the worker imports.

`select_backend` picks a backend at start-up (self-testing the Metal kernel where it could
run); a forward builds one `AttentionPlan` per step and calls it for every layer;
`write_kv` stores the step's new K/V in the pool; `install_attention_hook` routes mlx-lm's
attention calls to the plan; `ForwardContext` (`forward`) carries a forward's own data to
every hook inside mlx-lm's model code; a runner keeps its pool's gathered prefix K/V across
ticks in a `PrefixKV` it makes and hands each plan (`prefix_kv`). The modules behind it:
`paged` (backends and the plan), `mlx_ops`/`tiles`/`shared_prefix` (the "mlx" backend's
strategies), the `metal` package (the "metal" backend), `selftest` and `select` (choosing
one). Sliding windows (`AttentionPlan(..., window=W)`) and attention sinks
(`plan(..., sinks=...)`) reach every strategy and kernel variant: `window` and
`metal.window`. The modules behind this front import one another by their full path
(`worker.attention.selftest`), never through it: the front imports them, so a member that
imported it back would close a cycle.
"""

from worker.attention.forward import ForwardContext, building, current_forward
from worker.attention.hook import install_attention_hook
from worker.attention.paged import (
    AttentionBackend,
    AttentionPlan,
    BackendUnavailableError,
    paged_attention,
    resolve_backend,
    slot_ids,
    write_kv,
)
from worker.attention.prefix_kv import PREFIX_KV_BYTES, PrefixKV
from worker.attention.select import select_backend

__all__ = [
    "AttentionBackend",
    "AttentionPlan",
    "BackendUnavailableError",
    "ForwardContext",
    "PREFIX_KV_BYTES",
    "PrefixKV",
    "building",
    "current_forward",
    "install_attention_hook",
    "paged_attention",
    "resolve_backend",
    "select_backend",
    "slot_ids",
    "write_kv",
]
