"""The memory estimate placement counts (shared/placement/footprint.py): weights as a worker
holds them, checked against the parameters mlx-lm loads; a corrupt file never breaks it."""

from __future__ import annotations

import shutil

import mlx.core as mx
from mlx.utils import tree_flatten

from shared.placement.footprint import RUNTIME_BYTES, estimate, weight_bytes
from tests.support.tp_group import save_tiny_model


def test_float32_weights_are_four_bytes_a_parameter(tmp_path):
    from mlx_lm import load

    tiny = save_tiny_model(tmp_path / "tiny", seed=1)
    model, _ = load(str(tiny))
    params = sum(v.size for _, v in tree_flatten(model.parameters()) if isinstance(v, mx.array))
    assert weight_bytes(tiny, float32=True) == 4 * params
    on_disk = weight_bytes(tiny)
    assert estimate(tiny, 100) == on_disk + 100 + RUNTIME_BYTES


def test_quantized_weights_are_counted_unpacked(default_model_dir):
    """The default model is 4-bit (8-bit embeddings): 135 M parameters, 540 MB in float32."""
    assert 130e6 < weight_bytes(default_model_dir, float32=True) / 4 < 140e6
    assert weight_bytes(default_model_dir) < 110e6  # the packed file


def test_a_corrupt_weights_file_falls_back_to_its_size(tmp_path):
    tiny = save_tiny_model(tmp_path / "tiny", seed=1)
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    (broken / "model.safetensors").write_bytes(b"\x07" * 4096)  # a header length of petabytes
    assert weight_bytes(broken, float32=True) == 2 * 4096
