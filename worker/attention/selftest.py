"""Trust nothing untested: check a paged-attention backend against the MLX-ops reference on
this machine before a worker uses it.

`self_test` runs a candidate `run` (the `AttentionBackend.run` contract) and the "mlx" backend
on the same random decode batch, through the same `AttentionPlan` a forward uses, and says
whether the candidate matches (per-dtype tolerance) and is faster. `verify_metal_backend` does
that for the Metal kernel and records the verdict, which `worker.attention.metal.kernel`'s
`unavailable_reason` reports: "auto" picks the kernel only after it passed here. `prewarm`
runs a candidate once per (block size, dtype) so no request pays a pipeline compile.
With `quantize` (a worker with `--kv-bits`: plain pool -> the worker's quantized pool) the
pools are quantized first, so the kernel's quantized variant is what is tested and warmed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from worker.attention.metal import kernel as metal_kernel
from worker.attention.metal import plan as metal_plan
from worker.attention.paged import BACKENDS, AttentionBackend, AttentionPlan

# Max |candidate - reference| allowed; both sides compute in fp32 but round inputs/outputs to
# the dtype, and the reference may also run its matmuls in the dtype.
TOLERANCE = {mx.float32: 1e-4, mx.float16: 1e-2, mx.bfloat16: 6e-2}
# A plain `(slots, Hkv, D)` pool -> the same values in the worker's quantized pool layout.
Quantizer = Callable[[mx.array], object]


class SelfTestResult(NamedTuple):
    ok: bool
    reason: str
    candidate_ms: float | None
    reference_ms: float | None
    max_error: float | None


class DecodeBatch(NamedTuple):
    queries: mx.array
    k_pool: mx.array
    v_pool: mx.array
    block_tables: mx.array
    lengths: list[int]


def random_decode_batch(
    *, batch, context, block_size, dtype, num_heads, num_kv_heads, head_dim, seed=0, quantize=None
) -> DecodeBatch:
    """Decode rows (Lq 1) of lengths up to `context`, partial last blocks, shuffled tables."""
    rng = np.random.default_rng(seed)
    lengths = [max(1, context - int(rng.integers(0, block_size))) for _ in range(batch)]
    blocks_per_row = -(-context // block_size)
    num_blocks = batch * blocks_per_row
    tables = rng.permutation(num_blocks).reshape(batch, blocks_per_row).astype(np.int32)
    shape = (num_blocks * block_size, num_kv_heads, head_dim)
    pools = [mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype) for _ in "kv"]
    if quantize is not None:
        pools = [quantize(pool) for pool in pools]
    queries = rng.normal(size=(batch, num_heads, 1, head_dim)).astype(np.float32)
    tables = mx.array(tables, dtype=mx.int32)
    return DecodeBatch(mx.array(queries).astype(dtype), *pools, tables, lengths)


def shared_prefix_batch(
    *,
    rows,
    tenants,
    prefix,
    own,
    block_size,
    dtype,
    num_heads,
    num_kv_heads,
    head_dim,
    seed=0,
    quantize=None,
) -> DecodeBatch:
    """Decode rows of `tenants` tenants: each tenant's rows share its `prefix` tokens (whole
    blocks), then each row has up to `own` tokens of its own; shuffled block ids."""
    rng = np.random.default_rng(seed)
    shared, mine = -(-prefix // block_size), -(-own // block_size)
    order = [int(b) for b in rng.permutation(tenants * shared + rows * mine)]
    tables, lengths = [], []
    for row in range(rows):
        tenant = row % tenants
        start = tenants * shared + row * mine
        tables.append(
            [*order[tenant * shared : (tenant + 1) * shared], *order[start : start + mine]]
        )
        lengths.append(shared * block_size + max(1, own - int(rng.integers(0, block_size))))
    shape = (len(order) * block_size, num_kv_heads, head_dim)
    pools = [mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype) for _ in "kv"]
    if quantize is not None:
        pools = [quantize(pool) for pool in pools]
    queries = rng.normal(size=(rows, num_heads, 1, head_dim)).astype(np.float32)
    tables = mx.array(tables, dtype=mx.int32)
    return DecodeBatch(mx.array(queries).astype(dtype), *pools, tables, lengths)


def plan_call(
    backend: AttentionBackend,
    batch: DecodeBatch,
    block_size: int,
    window: int | None = None,
    sinks: mx.array | None = None,
) -> Callable[[], mx.array]:
    plan = AttentionPlan(
        backend,
        batch.block_tables,
        batch.lengths,
        block_size=block_size,
        host_tables=batch.block_tables.tolist(),
        window=window,
    )
    scale = batch.queries.shape[-1] ** -0.5
    return lambda: plan(batch.queries, batch.k_pool, batch.v_pool, scale=scale, sinks=sinks)


def median_ms(step: Callable[[], mx.array], repeats: int) -> float:
    """Median wall time of `step` evaluated, after one untimed warm-up (pipeline compile)."""
    mx.eval(step())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(step())
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def self_test(
    candidate_run: Callable[..., mx.array],
    *,
    block_size: int,
    dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    batch: int = 8,
    context: int = 512,
    repeats: int = 5,
    quantize: Quantizer | None = None,
    inputs: DecodeBatch | None = None,
    candidate_prepare: Callable[..., dict] | None = None,
    baseline: AttentionBackend | None = None,
    window: int | None = None,
    sinks: mx.array | None = None,
    need_faster: bool = True,
) -> SelfTestResult:
    """Does `candidate_run` match the MLX-ops reference on a random decode batch (or
    `inputs`), and is it faster there than the reference (or `baseline`)? Never raises for
    the candidate's faults: they become `reason`."""
    inputs = inputs or random_decode_batch(
        batch=batch,
        context=context,
        block_size=block_size,
        dtype=dtype,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        quantize=quantize,
    )
    extra = {} if candidate_prepare is None else {"prepare": candidate_prepare}
    candidate = plan_call(
        AttentionBackend("candidate", candidate_run, lambda: None, **extra),
        inputs,
        block_size,
        window,
        sinks,
    )
    reference = plan_call(BACKENDS["mlx"], inputs, block_size, window, sinks)
    want = reference()
    try:
        got = candidate()
        mx.eval(got)
    except Exception as error:  # the candidate's failure is the verdict, not a crash
        return SelfTestResult(False, f"raised {type(error).__name__}: {error}", None, None, None)
    mismatch = _mismatch(got, want, dtype)
    if mismatch is not None:
        reason, error = mismatch
        return SelfTestResult(False, reason, None, None, error)
    error = _max_error(got, want)
    if not need_faster:  # a feature of a kernel already chosen: right is what it must be
        return SelfTestResult(True, f"matches (max error {error:.2e})", None, None, error)
    if baseline is not None:
        reference = plan_call(baseline, inputs, block_size)
    candidate_ms, reference_ms = median_ms(candidate, repeats), median_ms(reference, repeats)
    against = "MLX ops" if baseline is None else baseline.name
    timing = f"{candidate_ms:.3f} ms vs {against} {reference_ms:.3f} ms"
    if candidate_ms >= reference_ms:
        return SelfTestResult(False, f"slower: {timing}", candidate_ms, reference_ms, error)
    return SelfTestResult(
        True,
        f"matches (max error {error:.2e}), faster: {timing}",
        candidate_ms,
        reference_ms,
        error,
    )


def _max_error(got: mx.array, want: mx.array) -> float:
    return mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()


def _mismatch(got: mx.array, want: mx.array, dtype) -> tuple[str, float | None] | None:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"returned {got.shape} {got.dtype}, expected {want.shape} {want.dtype}", None
    if not mx.all(mx.isfinite(got.astype(mx.float32))).item():
        return "returned non-finite values", None
    error = _max_error(got, want)
    if error > TOLERANCE[dtype]:
        return f"mismatch: max error {error:.3e} > tolerance {TOLERANCE[dtype]:.0e}", error
    return None


# (batch, blocks per row) of the prewarm runs. MLX passes an input of fewer than 8 elements
# as `constant` memory, which is a different pipeline: block tables and context lengths of
# < 8 / >= 8 elements give three variants a worker meets (batch 1 short, batch 1 long, batch 8).
PREWARM_SHAPES = ((1, 1), (1, 8), (8, 1))


def prewarm(
    candidate_run: Callable[..., mx.array],
    block_sizes,
    dtypes,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    quantize: Quantizer | None = None,
) -> dict[tuple[int, str], str | None]:
    """Run the candidate on each pipeline variant per (block size, dtype), so each is compiled
    before a request needs it. Returns {(block_size, dtype name): None, or why it failed}."""
    outcome = {}
    for block_size in block_sizes:
        for dtype in dtypes:
            outcome[(block_size, str(dtype))] = _prewarm_one(
                candidate_run,
                block_size,
                dtype,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                quantize=quantize,
            )
    return outcome


def _prewarm_one(candidate_run, block_size, dtype, **shape) -> str | None:
    backend = AttentionBackend("prewarm", candidate_run, lambda: None)
    try:
        for batch, blocks in PREWARM_SHAPES:
            inputs = random_decode_batch(
                batch=batch,
                context=blocks * block_size,
                block_size=block_size,
                dtype=dtype,
                **shape,
            )
            mx.eval(plan_call(backend, inputs, block_size)())
    except Exception as error:  # reported, so the caller can fall back
        return f"{type(error).__name__}: {error}"
    return None


def verify_metal_backend(
    *, block_size: int, dtype, num_heads: int, num_kv_heads: int, head_dim: int, **sizes
) -> SelfTestResult:
    """Self-test the Metal kernel here and record the verdict (see the module docstring)."""
    missing = metal_kernel.metal_reason()
    if missing is not None:
        result = SelfTestResult(False, missing, None, None, None)
    else:
        result = self_test(
            metal_kernel.paged_attention_metal,
            block_size=block_size,
            dtype=dtype,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            **sizes,
        )
    metal_kernel.SELF_TEST.record(result.ok, result.reason)
    return result


# The shape each variant is for: split-K a lone long row, prefix-grouped a multi-tenant decode.
VARIANT_BATCHES = {
    "split": lambda **kw: random_decode_batch(batch=1, context=4096, **kw),
    "grouped": lambda **kw: shared_prefix_batch(rows=8, tenants=2, prefix=1024, own=48, **kw),
}


# The window and sink variants, on a decode batch whose rows run past the window (which starts
# mid-block) and on one with a sink per head (large ones too: their logit dominates).
FEATURE_BATCHES = {
    "window": lambda **kw: (
        random_decode_batch(batch=4, context=520, **kw),
        3 * kw["block_size"] + 5,
    ),
    "sinks": lambda **kw: (random_decode_batch(batch=4, context=300, seed=1, **kw), None),
}


def sinks_of(num_heads: int) -> mx.array:
    return mx.array([[0.5, -1.0, 3.0, 12.0, -30.0, 0.0][h % 6] for h in range(num_heads)])


def forced(variant: str) -> Callable[..., dict]:
    """A "metal" preparation that runs `variant` wherever it applies."""
    return lambda **kw: {"metal_plan": metal_plan.plan_forward(only=variant, **kw)}


def verify_metal_variants(
    *,
    block_size: int,
    dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    repeats=5,
    quantize: Quantizer | None = None,
) -> dict[str, SelfTestResult]:
    """Self-test split-K and prefix-grouped on the shape each is for: each must match the
    MLX-ops reference and beat the plain kernel there; and the window and sink variants
    (`FEATURE_BATCHES`), which must match it. Record the verdicts (`metal_plan.VERDICTS`), so
    a forward uses a variant only where it passed on this machine (a window or sinks that did
    not pass: those calls run the MLX-ops reference, `paged._metal_checked`)."""
    plain = AttentionBackend(
        "the plain kernel", metal_kernel.paged_attention_metal, lambda: None, forced("plain")
    )
    results = {}
    for variant, make in VARIANT_BATCHES.items():
        missing = metal_kernel.metal_reason()
        if missing is not None:
            results[variant] = SelfTestResult(False, missing, None, None, None)
        else:
            inputs = make(
                block_size=block_size,
                dtype=dtype,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                quantize=quantize,
            )
            results[variant] = self_test(
                metal_kernel.paged_attention_metal,
                block_size=block_size,
                dtype=dtype,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                repeats=repeats,
                inputs=inputs,
                candidate_prepare=forced(variant),
                baseline=plain,
            )
        metal_plan.VERDICTS.record(variant, results[variant].ok, results[variant].reason)
    for feature, make in FEATURE_BATCHES.items():
        missing = metal_kernel.metal_reason()
        if missing is not None:
            results[feature] = SelfTestResult(False, missing, None, None, None)
        else:
            inputs, window = make(
                block_size=block_size,
                dtype=dtype,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                quantize=quantize,
            )
            sinks = sinks_of(num_heads) if feature == "sinks" else None
            results[feature] = self_test(
                metal_kernel.paged_attention_metal,
                block_size=block_size,
                dtype=dtype,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                inputs=inputs,
                window=window,
                sinks=sinks,
                need_faster=False,
            )
        metal_plan.VERDICTS.record(feature, results[feature].ok, results[feature].reason)
    return results
