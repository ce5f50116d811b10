"""SwiGLU in our forwards: mlx-lm's `swiglu`, routed to `worker.attention.exp2.swiglu` while
one of our forwards is being built on the CPU.

mlx-lm model modules bind `swiglu` from `mlx_lm.models.activations` when they are imported,
so, as with attention (`worker.attention.hook`), the hook is patched into that module and into
every model module already imported; it is installed when a `ModelRunner` is made. A forward
that is not ours keeps mlx-lm's function: mlx-lm's own generation in the same process (the
engine bench's baseline, the load-time check against mlx-lm), and every forward on a GPU,
where MLX's `sigmoid` is one fused kernel and three would be slower.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
from mlx_lm.models import activations as mlx_activations

from worker.attention.exp2 import swiglu as exp2_swiglu

_original_swiglu = mlx_activations.swiglu
_state = threading.local()  # .cpu: building one of our forwards, on the CPU


def _swiglu(gate: mx.array, x: mx.array) -> mx.array:
    if getattr(_state, "cpu", False) and gate.dtype == x.dtype == mx.float32:
        return exp2_swiglu(gate, x)
    return _original_swiglu(gate, x)


def install_activation_hook() -> None:
    """Route mlx-lm's `swiglu` through `_swiglu`, in its module and in every model module
    loaded so far. Idempotent; outside `our_forward` the hook calls mlx-lm's own function."""
    mlx_activations.swiglu = _swiglu
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("mlx_lm.models.")
            and getattr(module, "swiglu", None) is _original_swiglu
        ):
            module.swiglu = _swiglu


@contextmanager
def our_forward() -> Iterator[None]:
    """While one of our forwards' graphs is built: the exp2 SwiGLU, where the device is a CPU."""
    before = getattr(_state, "cpu", False)
    _state.cpu = mx.default_device() == mx.cpu
    try:
        yield
    finally:
        _state.cpu = before
