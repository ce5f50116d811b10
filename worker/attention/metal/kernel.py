"""The Metal paged-attention backend: the kernel of `worker.attention.metal.source` through
`mx.fast.metal_kernel`.

Where it is verified: on Linux, tests compile the exact kernel body with the SIMT emulator
(`tests/support/metal_emulator`) and compare it with the MLX-ops reference over random batches; on a
Mac, `worker.attention.selftest.self_test` runs it against the reference before a worker uses
it. `unavailable_reason` is None only where Metal is here AND the kernel passed that
self-test in this process, so `backend="auto"` never picks an unchecked kernel; the worker
start (the lead's wiring) calls `verify_metal_backend` for its block size and dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from worker.attention.metal import quant as metal_quant
from worker.attention.metal import variants as metal_variants
from worker.attention.metal import window as metal_window
from worker.attention.metal.plan import MetalPlan
from worker.attention.metal.source import make_launch, with_options

# (name, input_names, output_names, source, ...) -> callable(**Launch) -> [out]; tests pass
# the emulator's `EmulatedKernel` here.
KernelFactory = Callable[..., Callable[..., list[mx.array]]]


class _SelfTestVerdict:
    """Whether the kernel passed its self-test in this process: "auto" must never pick a
    kernel that was not checked against the reference on this very machine."""

    def __init__(self):
        self.reason: str | None = "the kernel has not been self-tested in this process yet"

    def record(self, ok: bool, reason: str) -> None:
        self.reason = None if ok else f"the kernel failed its self-test: {reason}"


SELF_TEST = _SelfTestVerdict()


def metal_reason() -> str | None:
    """Why Metal itself is missing here, or None."""
    if not mx.metal.is_available():
        return "Metal is not available on this machine (mx.metal.is_available() is False)"
    return None


def unavailable_reason() -> str | None:
    """Why the Metal backend can't run here, or None when it can: Metal is present and the
    kernel passed `worker.attention.selftest.verify_metal_backend` in this process."""
    return metal_reason() or SELF_TEST.reason


class _KernelCache:
    """One kernel object per factory and body: MLX compiles a pipeline per template
    instantiation on first use and caches it by name, so building the object once is all we
    keep."""

    def __init__(self):
        # keyed by the factory, whether the body reads quantized K/V, whether it writes
        # partial softmax states (`metal_variants`), walks a sliding window and adds sinks
        # (`metal_window`)
        self._kernels: dict[tuple, Callable] = {}

    def get(
        self,
        factory: KernelFactory,
        quantized: bool = False,
        partial: bool = False,
        windowed: bool = False,
        sinks: bool = False,
    ):
        key = (factory, quantized, partial, windowed, sinks)
        if key not in self._kernels:
            name, inputs, outputs, body = metal_window.kernel_spec(
                quantized=quantized, partial=partial, windowed=windowed, sinks=sinks
            )
            self._kernels[key] = factory(name, inputs, outputs, body, ensure_row_contiguous=True)
        return self._kernels[key]


_KERNELS = _KernelCache()


def paged_attention_metal(
    queries: mx.array,
    k_pool: mx.array,
    v_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    scale: float,
    block_size: int,
    max_context: int,
    kernel_factory: KernelFactory | None = None,
    metal_plan: MetalPlan | None = None,
    window: int | None = None,
    sinks: mx.array | None = None,
) -> mx.array:
    """The kernel's entry point; same contract as the "mlx" strategies (`max_context` unused:
    each threadgroup reads its own sequence's length). Raises NotImplementedError on a shape
    the kernel does not serve (see `metal_source.unsupported_reason`). Quantized pools
    (`--kv-bits`) go to the variant of `worker.attention.metal.quant`; `metal_plan` (the
    backend's per-forward preparation, `metal_plan.plan_forward`) picks split-K or
    prefix-grouped (`worker.attention.metal.variants`), else the plain kernel runs. `window`
    and `sinks` (`worker.attention.window`) pick the variants of `metal_window`."""
    quantized = metal_quant.is_quantized(k_pool)
    factory = kernel_factory or mx.fast.metal_kernel
    common = dict(scale=scale, block_size=block_size)
    windowed = window is not None
    if metal_plan is not None and metal_plan.variant == "split":
        kernel = _KERNELS.get(factory, quantized, partial=True, windowed=windowed)
        return metal_variants.split_k(
            kernel,
            queries,
            k_pool,
            v_pool,
            block_tables,
            context_lengths,
            parts=metal_plan.parts,
            part_blocks=metal_plan.part_blocks,
            window=window,
            sinks=sinks,
            **common,
        )
    if metal_plan is not None and metal_plan.variant == "grouped":
        if windowed:
            raise ValueError("the prefix-grouped variant takes no window (`metal_plan`)")
        kernel = _KERNELS.get(factory, quantized, partial=True)
        return metal_variants.prefix_grouped(
            kernel, queries, k_pool, v_pool, plan=metal_plan.grouped, sinks=sinks, **common
        )
    launch = (metal_quant.make_launch if quantized else make_launch)(
        queries, k_pool, v_pool, block_tables, context_lengths, **common
    )
    launch = with_options(launch, window=window, sinks=sinks)
    kernel = _KERNELS.get(factory, quantized, windowed=windowed, sinks=sinks is not None)
    return kernel(**launch._asdict())[0]
