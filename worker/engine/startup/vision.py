"""A vision model's image side, opened after the engine is built (`Engine.from_path`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx

if TYPE_CHECKING:
    from worker.engine.engine import Engine


def open_vision(engine: Engine, model_dir: Path, tokenizer) -> Engine:
    """A vision model's image side (worker/vision), on the intake; or, on the intake, why
    its images are refused (no `vision` extra, a family not served). Returns the engine."""
    from shared.models.loading import resolve_compute_dtype
    from shared.models.vision import has_vision, read_config
    from worker.vision.encoder import open_vision as open_encoder

    if not has_vision(read_config(model_dir)):  # a text model never touches the vision code
        return engine
    name = resolve_compute_dtype(engine.config.compute_dtype)
    dtype = getattr(mx, name) if name != "quantized" else None
    embed = engine.runner.trunk.embedding
    encoder, note = open_encoder(model_dir, embed, dtype, tokenizer.convert_ids_to_tokens)
    if encoder is not None and encoder.mrope is not None:  # Qwen-VL: 3-D image positions
        from worker.vision.mrope import install_mrope

        install_mrope(engine.runner.trunk.module, *encoder.mrope)
    if encoder is not None and encoder.deepstack_layers:  # Qwen3-VL
        from worker.vision.deepstack import install_deepstack

        install_deepstack(engine.runner.trunk.module, encoder.deepstack_layers)
    engine.intake.vision = encoder
    engine.intake.vision_note = note or engine.intake.vision_note
    return engine
