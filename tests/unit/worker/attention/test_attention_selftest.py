"""The self-test a worker runs before trusting a paged-attention backend, with stand-in
candidates: one that raises, one that is wrong, one that is slow, one that is good.

The slow and good verdicts compare wall times, so their stand-ins are built with margins no
machine can close: the slow one sleeps 0.2 s per call; the good one hands back an answer
computed before timing starts (a dictionary look-up against a real attention)."""

from __future__ import annotations

import time

import mlx.core as mx
import pytest

from worker.attention import selftest
from worker.attention.metal import kernel as metal_kernel
from worker.attention.mlx_ops import gather_attention
from worker.attention.paged import resolve_backend
from worker.attention.selftest import SelfTestResult, prewarm, random_decode_batch, self_test

SHAPE = dict(block_size=16, num_heads=4, num_kv_heads=2, head_dim=64, batch=2, context=48)


def _reference(*args, **kwargs):
    kwargs.pop("tiles", None)
    return gather_attention(*args, **kwargs)


def raising(*args, **kwargs):
    raise RuntimeError("pipeline compile failed: no such function")


def wrong(*args, **kwargs):
    return _reference(*args, **kwargs) * 1.05 + 0.01


def slow(*args, **kwargs):
    time.sleep(0.2)
    return _reference(*args, **kwargs)


class Memoized:
    """Computes each answer once (eagerly, at the untimed first call), then returns it."""

    def __init__(self):
        self.answers: dict[int, mx.array] = {}

    def __call__(self, queries, *args, **kwargs):
        if id(queries) not in self.answers:
            answer = _reference(queries, *args, **kwargs)
            mx.eval(answer)
            self.answers[id(queries)] = answer
        return self.answers[id(queries)]


def test_raising_candidate_is_rejected_with_its_error():
    result = self_test(raising, dtype=mx.float32, **SHAPE)
    assert result == SelfTestResult(
        False, "raised RuntimeError: pipeline compile failed: no such function", None, None, None
    )


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_wrong_candidate_is_rejected_with_the_mismatch(dtype):
    result = self_test(wrong, dtype=dtype, **SHAPE)
    assert not result.ok
    assert result.reason.startswith("mismatch: max error")
    assert result.max_error > selftest.TOLERANCE[dtype]
    assert result.candidate_ms is None and result.reference_ms is None


def test_non_finite_candidate_is_rejected():
    result = self_test(lambda *a, **k: wrong(*a, **k) * float("nan"), dtype=mx.float32, **SHAPE)
    assert (result.ok, result.reason) == (False, "returned non-finite values")


def test_slow_candidate_is_rejected_as_slower():
    result = self_test(slow, dtype=mx.float32, repeats=2, **SHAPE)
    assert not result.ok
    assert result.reason.startswith("slower: ")
    assert result.candidate_ms > 150 and result.candidate_ms > result.reference_ms
    assert result.max_error <= selftest.TOLERANCE[mx.float32]


def test_good_candidate_is_accepted_with_both_timings():
    result = self_test(Memoized(), dtype=mx.float16, **SHAPE)
    assert result.ok, result.reason
    assert result.reason.startswith("matches (max error")
    assert 0 <= result.candidate_ms < result.reference_ms
    assert result.max_error <= selftest.TOLERANCE[mx.float16]


def test_prewarm_reports_each_pipeline():
    calls = []

    def fussy(queries, k_pool, *args, block_size, **kwargs):
        calls.append((block_size, k_pool.dtype))
        if block_size == 32:
            raise ValueError("no pipeline for 32")
        return _reference(queries, k_pool, *args, block_size=block_size, **kwargs)

    shape = {k: SHAPE[k] for k in ("num_heads", "num_kv_heads", "head_dim")}
    outcome = prewarm(fussy, [8, 32], [mx.float16, mx.bfloat16], **shape)
    assert outcome == {
        (8, "mlx.core.float16"): None,
        (8, "mlx.core.bfloat16"): None,
        (32, "mlx.core.float16"): "ValueError: no pipeline for 32",
        (32, "mlx.core.bfloat16"): "ValueError: no pipeline for 32",
    }
    # three pipeline variants per (block size, dtype); a failure stops that pair's runs
    assert len(calls) == 3 * 2 + 1 * 2


def test_metal_backend_stays_off_without_metal_or_a_passed_self_test(monkeypatch):
    monkeypatch.setattr(metal_kernel, "SELF_TEST", metal_kernel._SelfTestVerdict())
    result = selftest.verify_metal_backend(dtype=mx.float16, **SHAPE)
    if metal_kernel.metal_reason() is not None:  # this Linux machine
        assert not result.ok and "Metal is not available" in result.reason
        assert "Metal is not available" in metal_kernel.unavailable_reason()
    assert resolve_backend("auto").name == ("metal" if result.ok else "mlx")


def test_a_failed_self_test_keeps_auto_on_mlx_ops(monkeypatch):
    """Even where Metal is present, a failed verdict keeps the kernel out of "auto"."""
    verdict = metal_kernel._SelfTestVerdict()
    monkeypatch.setattr(metal_kernel, "SELF_TEST", verdict)
    monkeypatch.setattr(metal_kernel, "metal_reason", lambda: None)
    assert "not been self-tested" in metal_kernel.unavailable_reason()
    verdict.record(False, "mismatch: max error 1e-1 > tolerance 1e-2")
    assert "failed its self-test: mismatch" in metal_kernel.unavailable_reason()
    assert resolve_backend("auto").name == "mlx"
    verdict.record(True, "matches")
    assert metal_kernel.unavailable_reason() is None


def test_emulated_kernel_passes_the_match_and_loses_the_race():
    """The real kernel through the emulator: it matches, and (thread per lane on a CPU) is
    slower than MLX ops, so the verdict keeps MLX ops, saying so."""
    from functools import partial

    from tests.support.metal_emulator import EmulatedKernel

    kernel = partial(metal_kernel.paged_attention_metal, kernel_factory=EmulatedKernel)
    result = self_test(kernel, dtype=mx.bfloat16, repeats=1, **SHAPE)
    assert not result.ok and result.reason.startswith("slower: ")
    assert result.max_error <= selftest.TOLERANCE[mx.bfloat16]


def test_prewarm_shapes_cover_every_pipeline_a_worker_meets():
    """MLX names (and compiles) a pipeline per input kind: the prewarm shapes must hit every
    name that any batch size and context of one (block size, dtype) can produce."""
    from tests.support.metal_emulator.signature import kernel_name
    from worker.attention.metal.source import KERNEL_NAME, make_launch

    def name(batch, blocks, block_size=16):
        inputs = random_decode_batch(
            batch=batch,
            context=blocks * block_size,
            block_size=block_size,
            dtype=mx.float16,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
        )
        launch = make_launch(
            inputs.queries,
            inputs.k_pool,
            inputs.v_pool,
            inputs.block_tables,
            mx.array(inputs.lengths),
            scale=0.1,
            block_size=block_size,
        )
        return kernel_name(KERNEL_NAME, launch.inputs, launch.output_dtypes, launch.template)

    warmed = {name(b, n) for b, n in selftest.PREWARM_SHAPES}
    assert len(warmed) == 3
    met = {name(b, n) for b in (1, 2, 3, 7, 8, 9, 16) for n in (1, 2, 4, 8, 9)}
    assert met == warmed
