"""Resolving --model, the cache of converted GGUFs, the compute dtype, the OpenBLAS preload."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared import blas
from shared.models.loading import resolve_compute_dtype
from shared.models.store import ModelNotFound, context_length, resolve_model
from tests.support.gguf_fixtures import tiny_llama, vocabulary, write_tiny_gguf


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_FLEET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_gguf_is_converted_once_and_reused(tmp_path, private_cache):
    path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama(len(vocabulary())))
    steps = []
    first = resolve_model(str(path), steps.append)
    assert first.is_relative_to(private_cache)
    assert any("converted" in s for s in steps)  # progress was reported
    steps.clear()
    assert resolve_model(str(path), steps.append) == first
    assert steps == []  # no second conversion
    assert context_length(first) == 256


def test_local_directory_is_used_as_is(tmp_path, private_cache):
    path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama(len(vocabulary())))
    converted = resolve_model(str(path))
    assert resolve_model(str(converted)) == converted


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("/definitely/not/here.gguf", "not found"),
        ("./nothing-like-this", "model not found"),
    ],
)
def test_bad_model_specs_are_clear_errors(spec, message, private_cache):
    with pytest.raises(ModelNotFound, match=message):
        resolve_model(spec)


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ModelNotFound, match="config.json"):
        resolve_model(str(tmp_path))


def test_corrupt_gguf_is_a_model_error(tmp_path, private_cache):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ModelNotFound):
        resolve_model(str(bad))


def test_repo_id_without_network_is_a_clear_error(private_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(private_cache / "hf"))
    with pytest.raises(ModelNotFound, match="Hugging Face"):
        resolve_model("no-such-org/no-such-model")


def test_compute_dtype_is_float32_on_cpu():
    from shared.models.loading import metal_available

    assert resolve_compute_dtype("auto") == ("quantized" if metal_available() else "float32")
    assert resolve_compute_dtype("float16") == "float16"
    with pytest.raises(ValueError, match="compute dtype"):
        resolve_compute_dtype("int3")


def test_blas_switch(monkeypatch, tmp_path):
    fake = tmp_path / "libblas.so.3"
    fake.write_bytes(b"")
    for switch in ("MLX_FLEET_BLAS", "MLX_FLEET_OPENBLAS"):  # the new name and the older one
        env = {switch: str(fake), "LD_PRELOAD": "/x.so"}
        if sys.platform.startswith("linux"):
            assert blas.blas_path(env) == str(fake)
            assert blas.preload_env(env)["LD_PRELOAD"] == f"{fake}:/x.so"
            assert blas.blas_name(env) == "libblas.so.3"
        for off in ("0", "off", "false"):
            assert blas.blas_path({switch: off}) is None
            assert blas.blas_name({switch: off}) == "off"
            assert blas.preload_env({switch: off, "LD_PRELOAD": "/x.so"})["LD_PRELOAD"] == "/x.so"
    # the new name wins over the older one
    assert blas.blas_path({"MLX_FLEET_BLAS": "0", "MLX_FLEET_OPENBLAS": str(fake)}) is None


@pytest.mark.skipif(
    blas.mkl_path() is None or not blas.intel_cpu(), reason="no oneMKL wheel, or not an Intel CPU"
)
def test_mkl_preferred_and_its_threads_set():
    env = {"LD_PRELOAD": ""}
    assert blas.blas_path(env) == str(blas.mkl_path())
    assert blas.blas_name(env) == "mkl"
    assert blas.preload_env(env)["MKL_THREADING_LAYER"] == "INTEL"
    assert blas.preload_env(env | {"MKL_THREADING_LAYER": "GNU"})["MKL_THREADING_LAYER"] == "GNU"
    assert blas.blas_path({"MLX_FLEET_BLAS": "openblas"}) in (*blas.OPENBLAS, None)
    assert blas.blas_path({"MLX_FLEET_BLAS": "mkl"}) == str(blas.mkl_path())


@pytest.mark.skipif(blas.blas_path() is None, reason="no BLAS to preload here")
def test_entry_point_reexecs_with_blas():
    code = (
        "import os; from shared.blas import reexec_with_blas, blas_active, active_blas;"
        "reexec_with_blas(); print(blas_active(), os.environ.get('_MLX_FLEET_REEXECED'),"
        " active_blas())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLX_FLEET_BLAS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "1", blas.blas_name(env)]  # the library it preloaded
    env["MLX_FLEET_BLAS"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "None", "off"]
