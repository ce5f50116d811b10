"""A worker's attention backend choice at start, with stand-in "Metal" kernels: one that
fails and one that gives wrong numbers (the worker must pick MLX ops, say why, and serve
correctly), one that passes (the worker uses it), and `metal` insisted on where it can't run."""

from __future__ import annotations

import mlx.core as mx
import pytest

from shared.sampling import SamplingParams
from tests.support.engine_fixtures import (
    make_engine,
    reference_greedy,
    run_to_completion,
    tiny_model,
)
from worker.attention import select, selftest
from worker.attention.metal import kernel as metal_kernel
from worker.attention.paged import BACKENDS, AttentionBackend, BackendUnavailableError
from worker.attention.selftest import SelfTestResult
from worker.attention.tiles import tiled_attention

PROMPT = [(5 * i + 2) % 97 for i in range(21)]


def raising(*args, **kwargs):
    raise RuntimeError("[metal_kernel] pipeline compile failed")


def wrong(*args, **kwargs):
    return tiled_attention(*args, **kwargs) + 0.5


@pytest.fixture
def fake_metal(monkeypatch):
    """Pretend Metal is here, with `run` as the kernel; returns a setter for `run`."""
    monkeypatch.setattr(metal_kernel, "metal_reason", lambda: None)

    def install(run, verdict=None):
        backend = AttentionBackend("metal", run, lambda: None, BACKENDS["mlx"].prepare)
        monkeypatch.setitem(BACKENDS, "metal", backend)

        def verify(**shape):
            if verdict is not None:
                return verdict
            return selftest.self_test(run, **shape, batch=2, context=40)

        monkeypatch.setattr(selftest, "verify_metal_backend", verify)
        # the variants' own self-test (emulated in test_metal_variants): record who asked
        monkeypatch.setattr(
            selftest, "verify_metal_variants", lambda **kw: variants.append(kw) or {}
        )

    variants = []
    install.variants = variants
    return install


def serves_correctly(engine, model) -> None:
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=6))
    assert run_to_completion(engine)["a"] == reference_greedy(model, PROMPT, 6)


@pytest.mark.parametrize(
    "candidate, why", [(raising, "raised RuntimeError"), (wrong, "")], ids=["fails", "wrong"]
)
def test_a_failing_or_wrong_kernel_falls_back_to_mlx_ops_and_says_why(fake_metal, candidate, why):
    fake_metal(candidate)
    model = tiny_model("llama")
    engine = make_engine(model)
    report = engine.attention_report
    assert engine.backend.name == "mlx" and report.backend == "mlx"
    assert report.self_test.startswith("failed: ") and why in report.self_test
    serves_correctly(engine, model)


def test_a_kernel_that_passes_is_used(fake_metal):
    fake_metal(tiled_attention, SelfTestResult(True, "matches, faster: 1 vs 2 ms", 1.0, 2.0, 0.0))
    model = tiny_model("qwen3")
    engine = make_engine(model)
    assert engine.backend.name == "metal"
    assert engine.attention_report.self_test.startswith("passed")
    assert (engine.attention_report.candidate_ms, engine.attention_report.reference_ms) == (1, 2)
    assert len(fake_metal.variants) == 1  # split-K and prefix-grouped were self-tested too
    serves_correctly(engine, model)


def test_metal_insisted_on_where_it_is_wrong_or_missing_stops_the_worker(fake_metal, monkeypatch):
    fake_metal(wrong)
    with pytest.raises(BackendUnavailableError, match="--attention-backend metal: self-test"):
        make_engine(tiny_model("llama"), attention_backend="metal")
    monkeypatch.setattr(metal_kernel, "metal_reason", lambda: "no Metal here")
    with pytest.raises(BackendUnavailableError, match="no Metal here"):
        make_engine(tiny_model("llama"), attention_backend="metal")


def test_without_metal_auto_is_mlx_ops_and_says_so():
    if mx.metal.is_available():
        pytest.skip("this machine has Metal")
    engine = make_engine(tiny_model("llama"))
    assert engine.backend.name == "mlx"
    assert engine.attention_report.self_test.startswith("not run: Metal is not available")
    backend, report = select.select_backend("mlx", engine.shape, 8)
    assert backend.name == "mlx" and report.self_test == "not run: mlx requested"


def test_a_quantized_kv_worker_self_tests_and_uses_the_quantized_kernel(fake_metal):
    """--kv-bits 8 with the real kernel body run by the SIMT emulator as "Metal": the self-test
    quantizes its pools to the worker's layout (so the quantized variant is what is checked and
    pre-warmed), `metal` is used (only slower here: it is emulated), and the engine's greedy
    output equals the MLX-ops quantized path's."""
    import functools

    from tests.support.metal_emulator import EmulatedKernel, require_compiler
    from tests.unit.worker.quant.conftest import tiny_quantizable_model
    from worker.attention.metal.kernel import paged_attention_metal

    require_compiler()
    emulated = functools.partial(paged_attention_metal, kernel_factory=EmulatedKernel)
    seen = []

    def recording(*args, **kwargs):
        seen.append(hasattr(args[1], "packed"))
        kwargs.pop("tiles", None)  # the stand-in backend prepares as MLX ops does
        return emulated(*args, **kwargs)

    fake_metal(recording)
    model = tiny_quantizable_model("llama")
    engine = make_engine(model, kv_bits=8, attention_backend="metal")
    report = engine.attention_report
    assert engine.backend.name == "metal" and report.kv_layout == "q8g64"
    assert report.self_test.startswith("passed: slower") or report.self_test.startswith(
        "passed: matches"
    ), report.self_test
    assert seen and all(seen)  # self-test and pre-warm ran on quantized pools only
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=4))
    reference = make_engine(model, kv_bits=8, attention_backend="mlx")
    reference.add_request("a", PROMPT, SamplingParams(max_tokens=4))
    assert run_to_completion(engine) == run_to_completion(reference)
