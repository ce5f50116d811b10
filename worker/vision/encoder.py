"""The vision side of a vision-language model, from mlx-vlm: its image processor and its
`get_input_embeddings` (vision tower, projector, the merge at the image tokens), no forked
model files. The language model stays mlx-lm's, over our paged KV: mlx-vlm's merged input
embeddings fed to mlx-lm's text backbone give logits equal to mlx-vlm's own language model
(max difference 0.0 on tiny Gemma 3 and Mistral 3; tests/unit/worker/models/test_vision.py).
Qwen-VL's language model also needs the image tokens' 3-D positions (`rope_index`, numpy;
`worker/vision/mrope.py`) and, Qwen3-VL, its deepstack features (`encode`;
`worker/vision/deepstack.py`).

`prepare_prompt` (decoding, the image processor, the rope index) is host work that touches no
device array: the worker loop runs it on its own threads before it queues the request
(`worker/vision/preparing.py`), never on the engine thread. `encode` calls
`get_input_embeddings`, which for Mistral 3 and the Qwen families reads a few values on the
host (token counts): once per image prompt, on the engine thread, at the step whose chunk first
reaches an image, when no step is in flight (the engine runs it before that step's forward,
so a tower that fails fails only its request).

mlx-vlm pulls a lot (datasets, opencv, mlx-audio), so it is the optional `vision` extra;
without it a vision model is served as text and image requests get a 400 saying so.
"""

from __future__ import annotations

import io
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from shared.models.vision import (
    IMAGE_KEY_BASE,
    MROPE_FAMILIES,
    VisionSpec,
    has_vision,
    read_config,
    vision_spec,
)
from shared.sampling import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    import mlx.nn as nn

    from shared.protocol import ImageInput

log = logging.getLogger(__name__)

NO_EXTRA = (
    "the workers run without the vision extra: install it with pip install 'mlx-fleet[vision]'"
)


@dataclass
class Pixels:
    """A prompt's images, preprocessed (host arrays): what the vision tower takes."""

    values: np.ndarray  # (images, channels, height, width); Qwen-VL: (patches, features)
    extras: dict  # e.g. Pixtral's image_sizes, Qwen-VL's image_grid_thw


@dataclass
class PreparedImages:
    """A prompt's images made ready before its request is queued: the pixels and, M-RoPE
    families, the prompt's positions (3, prompt length) and rope delta."""

    pixels: Pixels
    rope: tuple[np.ndarray, int] | None


class VisionEncoder:
    """Preprocesses a prompt's images (`prepare_prompt`, host work, safe on any thread) and
    computes their embeddings (`encode`, on the device, once per prompt)."""

    def __init__(self, model_dir: Path, spec: VisionSpec, embed_tokens: nn.Module, dtype):
        from mlx.utils import tree_flatten
        from mlx_vlm.utils import load_model
        from transformers import AutoImageProcessor

        self.spec = spec
        self.model = load_model(Path(model_dir), lazy=True)
        language = self.model.language_model.model
        # M-RoPE families: the language model's rotary embedding (no weights), for our
        # layers (worker.vision.mrope), and its apply function; deepstack: how many layers
        self.mrope: tuple[nn.Module, Callable] | None = None
        vision = getattr(self.model.config, "vision_config", None)
        self.deepstack_layers = len(getattr(vision, "deepstack_visual_indexes", None) or ())
        if spec.family in MROPE_FAMILIES:
            rotary = language.layers[0].self_attn.rotary_emb
            self.mrope = (
                rotary,
                sys.modules[type(rotary).__module__].apply_multimodal_rotary_pos_emb,
            )
            config = self.model.config  # what the rope index needs, as plain ints
            self._rope_ids = (
                config.vision_config.spatial_merge_size,
                config.image_token_id,
                config.vision_start_token_id,
            )
        # the language model's own embedding (ours: shared, not loaded twice); its layers
        # are never run here, so they are dropped before anything of them is read
        language.embed_tokens = embed_tokens
        language.layers = []
        if dtype is not None:  # else as saved (quantized, on Metal)
            self.model.set_dtype(dtype)
        mx.eval([v for _, v in tree_flatten(self.model.parameters())])
        if spec.family in MROPE_FAMILIES:  # mlx-vlm's own (numpy) processor, as it runs it
            from mlx_vlm.utils import load_processor

            self.processor = load_processor(Path(model_dir)).image_processor
        else:
            self.processor = AutoImageProcessor.from_pretrained(str(model_dir))

    def prepare_prompt(
        self, token_ids: list[int], images: tuple[ImageInput, ...]
    ) -> PreparedImages:
        """A prompt's images decoded, preprocessed and (M-RoPE) placed: host work only, no
        device array read, safe off the engine thread. InvalidRequest as `prepare`."""
        pixels = self.prepare(images)
        return PreparedImages(pixels, self.rope_index(token_ids, pixels))

    def prepare(self, images: tuple[ImageInput, ...]) -> Pixels:
        """Decode and preprocess; InvalidRequest when an image is not one, or when the token
        count the router gave an image is not what the processor makes of it."""
        from PIL import Image

        decoded = []
        for i, image in enumerate(images):
            try:
                decoded.append(Image.open(io.BytesIO(image.data)).convert("RGB"))
            except Exception as exc:  # PIL raises many kinds on a bad file
                raise InvalidRequest(f"image {i} could not be decoded: {exc}") from None
        kwargs = {"patch_size": self.spec.patch} if self.spec.family == "mistral3" else {}
        try:
            out = self.processor(images=decoded, return_tensors="np", **kwargs)
        except ValueError as exc:  # Qwen-VL's resize refuses an aspect ratio past 200
            raise InvalidRequest(f"the images could not be preprocessed: {exc}") from None
        extras = {k: out[k] for k in ("image_sizes", "image_grid_thw") if k in out}
        for i, image in enumerate(images):
            made = self._tokens(decoded[i], extras, i)
            if made != image.tokens:
                raise InvalidRequest(f"image {i} was given {image.tokens} tokens; it makes {made}")
        return Pixels(np.asarray(out["pixel_values"]), extras)

    def _tokens(self, image, extras: dict, i: int) -> int:
        if "image_sizes" in extras:
            height, width = (int(x) for x in extras["image_sizes"][i])
            return (height // self.spec.patch) * (width // self.spec.patch)
        if "image_grid_thw" in extras:
            return int(np.prod(extras["image_grid_thw"][i])) // self.processor.merge_size**2
        return self.spec.image_tokens(*image.size)

    def _real_ids(self, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(where the image keys are, the ids with the image token there) of a prompt."""
        keys = np.asarray(token_ids) >= IMAGE_KEY_BASE
        return keys, np.where(keys, self.spec.image_token_id, np.asarray(token_ids))

    def rope_index(self, token_ids: list[int], pixels: Pixels) -> tuple[np.ndarray, int] | None:
        """M-RoPE families: the prompt's positions (3, prompt length) and its rope delta
        (a token past the prompt sits at index + delta), by mlx-vlm's `get_rope_index` (index
        arithmetic on the ids and the image grids, in numpy: `image_rope_index`); None for
        the others."""
        if self.mrope is None:
            return None
        from worker.vision.mrope import image_rope_index

        _, ids = self._real_ids(token_ids)
        grids = np.asarray(pixels.extras["image_grid_thw"])
        return image_rope_index(ids, grids, *self._rope_ids)

    def encode(self, token_ids: list[int], pixels: Pixels) -> mx.array:
        """(image tokens, hidden) embeddings, in prompt order, of the prompt's images: rows
        of mlx-vlm's merged input embeddings at the image keys (lazy). Deepstack families
        (Qwen3-VL): (image tokens, 1 + deepstack layers, hidden), the input embeddings then
        what is added to the image tokens' hidden states after each of the first layers."""
        keys, ids = self._real_ids(token_ids)
        ids = ids[None]
        features = self.model.get_input_embeddings(
            mx.array(ids, dtype=mx.int32),
            mx.array(pixels.values),
            mask=mx.ones(ids.shape, dtype=mx.int32),
            **{k: mx.array(v) for k, v in pixels.extras.items()},
        )
        rows = features.inputs_embeds[0, mx.array(np.flatnonzero(keys), dtype=mx.int32)]
        deepstack = getattr(features, "deepstack_visual_embeds", None)
        if not deepstack:
            return rows
        return mx.stack([rows, *(d.astype(rows.dtype) for d in deepstack)], axis=1)


def open_vision(model_dir: Path, embed_tokens: nn.Module, dtype, token_text) -> tuple:
    """(encoder, "") for a vision model this worker can serve images for; (None, why not)
    otherwise ("" for a text model). Logs the reason once."""
    if not has_vision(read_config(model_dir)):
        return None, ""
    try:
        spec = vision_spec(model_dir, token_text)
    except ValueError as exc:
        log.warning("serving this model as text: %s", exc)
        return None, str(exc)
    try:
        import mlx_vlm  # noqa: F401
    except ImportError:
        log.warning("serving this vision model as text: %s", NO_EXTRA)
        return None, NO_EXTRA
    try:
        return VisionEncoder(model_dir, spec, embed_tokens, dtype), ""
    except Exception as exc:  # a checkpoint mlx-vlm cannot load: serve its text, say why
        note = f"the vision tower could not be loaded ({type(exc).__name__}: {exc})"
        log.exception("serving this vision model as text: %s", note)
        return None, note
