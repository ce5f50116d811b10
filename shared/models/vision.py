"""Images in a prompt, as the router and the worker both see them.

A vision-language model's prompt holds, where an image goes, a run of image tokens (plus the
family's markers around them: a start and end token, row breaks); the worker puts the image's
embeddings at those positions. How many tokens an image becomes is the processor's rule, read
here from the model's config so the router can expand a prompt without the vision tower.

Prefix caching must tell images apart, so the token ids at image positions are replaced, on
the wire and in every cache, by *image keys*: ids at or above `IMAGE_KEY_BASE` (no vocabulary
comes near 2**30) drawn from a hash of the decoded pixels and the position in the image. The
same image gives the same keys, so a repeated screenshot hits the worker's radix cache and the
router's index like any other prefix; a different image behind the same placeholder tokens
gives other keys and never does (SGLang pads image tokens with a hash the same way; vLLM
adds the image hash to the block hash). Each key carries 30 bits of (hash, position), so a
block of k image tokens carries 30·k bits of the image's hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

IMAGE_KEY_BASE = 1 << 30
_KEY_MASK = IMAGE_KEY_BASE - 1

# families whose image tokens we place; the text backbone of each is mlx-lm's, the vision
# tower and projector mlx-vlm's (greedy output equal to mlx-vlm's, checked in the tests)
VISION_FAMILIES = ("gemma3", "mistral3", "qwen2_5_vl", "qwen2_vl", "qwen3_vl")
# of those, the families whose language model places image tokens at 3-D (M-RoPE) positions
MROPE_FAMILIES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")


def image_hash(pixels: bytes, mode: str, size: tuple[int, int]) -> int:
    """64-bit content hash of a decoded image (its pixels, mode and size, not its file
    bytes: the same picture as PNG and as a re-saved PNG hash alike)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{mode}:{size[0]}x{size[1]}:".encode())
    h.update(pixels)
    return int.from_bytes(h.digest(), "little")


def image_keys(content_hash: int, count: int) -> list[int]:
    """The ids standing for an image's `count` tokens in caches and block hashes."""
    keys = []
    for position in range(count):
        h = hashlib.blake2b(digest_size=8)
        h.update(content_hash.to_bytes(8, "little"))
        h.update(position.to_bytes(4, "little"))
        keys.append(IMAGE_KEY_BASE | (int.from_bytes(h.digest(), "little") & _KEY_MASK))
    return keys


def is_image_key(token_id: int) -> bool:
    return token_id >= IMAGE_KEY_BASE


@dataclass(frozen=True)
class VisionSpec:
    """What a model's processor does to a prompt with images, without the vision tower.

    `placeholder`: the text the prompt holds where an image goes (the chat template's image
    marker); `expand(width, height)` the text it becomes, with `image_tokens(width, height)`
    image tokens (id `image_token_id`) among it."""

    family: str
    image_token_id: int
    image_token: str
    placeholder: str
    tokens_per_image: int = 0  # fixed-size families (Gemma 3)
    boi: str = ""
    eoi: str = ""
    longest_edge: int = 0  # size-dependent families (Pixtral / Mistral 3)
    patch: int = 0  # the vision patch times the spatial merge: one token per patch²
    image_break: str = ""
    image_end: str = ""
    min_pixels: int = 0  # Qwen-VL: the resized image's area bounds (`smart_resize`)
    max_pixels: int = 0

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, columns) of image tokens for an image of this size (Pixtral's rule: fit
        within the longest edge, keeping the aspect, then one token per merged patch;
        Qwen-VL's: resized to multiples of the merged patch with the area within bounds)."""
        if self.family in MROPE_FAMILIES:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

            h, w = smart_resize(height, width, self.patch, self.min_pixels, self.max_pixels)
            return h // self.patch, w // self.patch
        ratio = max(height / self.longest_edge, width / self.longest_edge)
        if ratio > 1:
            height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
        return (height - 1) // self.patch + 1, (width - 1) // self.patch + 1

    def image_tokens(self, width: int, height: int) -> int:
        if self.family == "gemma3":
            return self.tokens_per_image
        rows, cols = self.grid(width, height)
        return rows * cols

    def expand(self, width: int, height: int) -> str:
        if self.family == "gemma3":
            return f"\n\n{self.boi}{self.image_token * self.tokens_per_image}{self.eoi}\n\n"
        if self.family in MROPE_FAMILIES:
            return self.boi + self.image_token * self.image_tokens(width, height) + self.eoi
        rows, cols = self.grid(width, height)
        text = (self.image_token * cols + self.image_break) * rows
        return text[: -len(self.image_break)] + self.image_end


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def has_vision(config: dict) -> bool:
    """A vision-language model's config (a vision tower's settings beside the text ones)."""
    return isinstance(config.get("vision_config"), dict)


def vision_spec(model_dir: Path, token_text: Callable[[int], str]) -> VisionSpec | None:
    """The spec of a model directory; None for a model without vision. Raises ValueError
    naming the family when the model has a vision tower whose images we do not place yet.
    `token_text(id)`: the tokenizer's text of a token id."""
    config = read_config(model_dir)
    if not has_vision(config):
        return None
    family = config.get("model_type", "")
    if family not in VISION_FAMILIES:
        raise ValueError(
            f"images are not served for {family!r} models yet (served: {', '.join(VISION_FAMILIES)})"
        )
    image_id = config.get("image_token_index", config.get("image_token_id"))
    if not isinstance(image_id, int):
        raise ValueError(f"the {family} config names no image token (image_token_index)")
    if family == "gemma3":
        count = config.get("mm_tokens_per_image") or config["text_config"]["mm_tokens_per_image"]
        boi = token_text(config["boi_token_index"])
        return VisionSpec(
            family,
            image_id,
            token_text(image_id),
            placeholder=boi,
            tokens_per_image=count,
            boi=boi,
            eoi=token_text(config["eoi_token_index"]),
        )
    vision = config["vision_config"]
    pre = _preprocessor(model_dir)
    if family in MROPE_FAMILIES:
        return _qwen_spec(config, pre, token_text)
    size = pre.get("size") or {}
    edge = size.get("longest_edge") if isinstance(size, dict) else None
    image = token_text(image_id)
    return VisionSpec(
        family,
        image_id,
        image,
        placeholder=image,
        longest_edge=edge or vision.get("image_size", 1024),
        patch=vision.get("patch_size", 16) * config.get("spatial_merge_size", 1),
        image_break=_token(pre, "image_break_token", "[IMG_BREAK]"),
        image_end=_token(pre, "image_end_token", "[IMG_END]"),
    )


def _qwen_spec(config: dict, pre: dict, token_text: Callable[[int], str]) -> VisionSpec:
    """Qwen-VL: `<|vision_start|>`, the image pads, `<|vision_end|>` (the chat template's
    marker, whose one pad the processor repeats); the pixel bounds read as mlx-vlm's
    processor reads them (`size` then `min_pixels` / `max_pixels`)."""
    vision = config["vision_config"]
    size = pre.get("size")
    size = size if isinstance(size, dict) else {}
    low = pre.get("min_pixels") or size.get("shortest_edge") or 56 * 56
    high = pre.get("max_pixels") or size.get("longest_edge") or 14 * 14 * 4 * 1280
    image_id = config["image_token_id"]
    boi, eoi = (
        token_text(config["vision_start_token_id"]),
        token_text(config["vision_end_token_id"]),
    )
    image = token_text(image_id)
    return VisionSpec(
        config["model_type"],
        image_id,
        image,
        placeholder=boi + image + eoi,
        boi=boi,
        eoi=eoi,
        patch=pre.get("patch_size", vision.get("patch_size", 14))
        * pre.get("merge_size", vision.get("spatial_merge_size", 2)),
        min_pixels=low,
        max_pixels=high,
    )


def _preprocessor(model_dir: Path) -> dict:
    merged: dict = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = Path(model_dir) / name
        if path.exists():
            merged |= json.loads(path.read_text())
    return merged


def _token(config: dict, key: str, default: str) -> str:
    value = config.get(key, default)
    return value if isinstance(value, str) else default


def image_positions(token_ids: Sequence[int]) -> list[int]:
    """Where a prompt's image keys are."""
    return [i for i, t in enumerate(token_ids) if t >= IMAGE_KEY_BASE]
