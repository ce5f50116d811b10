"""A rendered chat prompt's image marks -> the model's image tokens -> image keys.

What the model's processor does (HF's and mlx-vlm's): the chat text holds the model's
placeholder where each image goes; each placeholder is replaced, as text, by the image's
expansion (`VisionSpec.expand`: its image tokens and their markers), then the text is
tokenized. We do the same, then check that the image-token ids found are exactly the images'
counts, in order, and replace them by each image's keys (shared.models.vision.image_keys) for
routing and the worker's caches; what a user is shown (/tokenize, counts) keeps the real ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.chat.images.parts import MARK, MARK_OPEN
from router.errors import bad_image, no_vision
from shared.models.vision import image_keys
from shared.protocol import ImageInput

if TYPE_CHECKING:
    from router.chat.images.decode import DecodedImage
    from shared.models.vision import VisionSpec


@dataclass(frozen=True)
class PromptImages:
    """A request's decoded images, by the key of their source (ImageSource.key)."""

    by_key: Mapping[str, DecodedImage] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.by_key)


NO_IMAGES = PromptImages()


@dataclass(frozen=True)
class PlacedPrompt:
    """The prompt's real token ids (shown to users), the ids sent and hashed (image keys at
    the image positions), and the images in prompt order."""

    token_ids: list[int]
    keyed_ids: list[int]
    images: tuple[ImageInput, ...]


def vision_spec_of(tokenizer, model: str | None = None, param: str | None = None) -> VisionSpec:
    """The model's VisionSpec; 400 saying why when it takes no images (`param`: the image)."""
    if tokenizer.vision is not None:
        return tokenizer.vision
    name = f"model '{model}'" if model else "this model"
    if tokenizer.vision_error:
        raise no_vision(f"{name} does not take images: {tokenizer.vision_error}", param)
    raise no_vision(f"{name} does not take images (it has no vision tower); send text only", param)


def count_marks(messages: Sequence[dict]) -> int:
    return sum(m["content"].count(MARK_OPEN) for m in messages if isinstance(m["content"], str))


def place_images(
    text: str, expected: int, images: PromptImages, spec: VisionSpec | None
) -> tuple[str, list[DecodedImage]]:
    """The rendered text with each image mark replaced by its expansion, and the images in
    the order they appear; 400 when the template dropped or repeated one (`expected`: the
    marks the messages held) or the text holds the placeholder itself."""
    keys = MARK.findall(text)
    if not keys and not expected:
        return text, []
    if spec is None:
        raise no_vision("this model does not take images; send text only")
    if len(keys) != expected or text.count(MARK_OPEN) != expected:
        raise bad_image(
            f"the chat template rendered {len(keys)} of the {expected} images; send images "
            "in user messages the template shows",
            "messages",
            "image_placement_failed",
        )
    missing = [k for k in keys if k not in images.by_key]
    if missing:
        raise bad_image("an image of the conversation could not be read", "messages")
    ordered = [images.by_key[k] for k in keys]
    pieces = MARK.sub(spec.placeholder, text).split(spec.placeholder)
    if len(pieces) != len(ordered) + 1:
        raise _marker_typed(spec, len(pieces) - 1 - len(ordered))
    out = [pieces[0]]
    for image, piece in zip(ordered, pieces[1:], strict=True):
        try:
            out += [spec.expand(image.width, image.height), piece]
        except ValueError as exc:  # the processor's size rule refuses it (Qwen: aspect > 200)
            raise bad_image(
                f"a {image.width}x{image.height} image cannot be used: {exc}", "messages"
            ) from None
    return "".join(out), ordered


def key_image_tokens(
    token_ids: list[int], images: Sequence[DecodedImage], spec: VisionSpec | None
) -> PlacedPrompt:
    """`token_ids` with each image's tokens replaced by its keys; 400 when the image tokens
    found are not the images' counts (never send a prompt the worker can't match)."""
    if spec is None:
        return PlacedPrompt(token_ids, token_ids, ())
    positions = [i for i, t in enumerate(token_ids) if t == spec.image_token_id]
    counts = [spec.image_tokens(image.width, image.height) for image in images]
    if len(positions) != sum(counts):
        extra = len(positions) - sum(counts)
        if not images:
            raise _marker_typed(spec, extra, token=True)
        raise bad_image(
            f"the prompt holds {len(positions)} image tokens where its {len(images)} images "
            f"make {sum(counts)}: the text must not hold the model's image token "
            f"{spec.image_token!r}",
            "messages",
            "image_placement_failed",
        )
    keyed = list(token_ids)
    slots = iter(positions)
    for image, count in zip(images, counts, strict=True):
        for key in image_keys(image.content_hash, count):
            keyed[next(slots)] = key
    inputs = tuple(ImageInput(i.data, c) for i, c in zip(images, counts, strict=True))
    return PlacedPrompt(token_ids, keyed, inputs)


def _marker_typed(spec: VisionSpec, extra: int, token: bool = False):
    what = spec.image_token if token else spec.placeholder
    return bad_image(
        f"the text holds the model's image marker {what!r} {extra} time(s) more than the "
        "request has images; send images as image parts, not as their marker",
        "messages",
        "image_placement_failed",
    )
