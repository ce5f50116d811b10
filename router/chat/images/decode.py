"""An image part's bytes checked and decoded: base64, size, format, pixels, content hash.

The router decodes every image once: the worker's processor needs only the file, but the
router must know the image's size (how many tokens it becomes) and its content hash (the keys
that stand for its tokens in the prefix index). The pixel count is read from the header and
checked before anything is decoded, so a small file that would inflate to gigabytes (a
decompression bomb) is refused unread.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass

from router.errors import bad_image, no_vision
from shared.models.vision import image_hash

# what the router reads and every mlx-vlm processor takes (through Pillow); a GIF is read
# as its first frame
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_WHITESPACE = str.maketrans("", "", " \t\r\n")


@dataclass(frozen=True)
class ImageLimits:
    """The router's image settings (shared/config/router_section.py declares them)."""

    max_images: int = 8
    max_image_bytes: int = 20 * 2**20
    max_request_image_bytes: int = 32 * 2**20
    max_image_pixels: int = 40_000_000

    @classmethod
    def of(cls, config) -> ImageLimits:
        return cls(
            config.max_images,
            config.max_image_bytes,
            config.max_request_image_bytes,
            config.max_image_pixels,
        )


@dataclass(frozen=True)
class DecodedImage:
    data: bytes  # the file as sent: what the worker's processor reads
    width: int
    height: int
    content_hash: int  # shared.models.vision.image_hash of its RGB pixels


def file_bytes(text: str, param: str, limits: ImageLimits) -> bytes:
    """The file a base64 text holds; 400 when it is not base64 or decodes too large (checked
    on its length first, so an oversized one is never decoded)."""
    if len(text) // 4 * 3 > limits.max_image_bytes + 2:
        raise too_large(len(text) // 4 * 3, param, limits)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        try:  # MIME-style base64 wrapped in lines
            data = base64.b64decode(text.translate(_WHITESPACE), validate=True)
        except (binascii.Error, ValueError):
            raise bad_image(f"{param} is not valid base64", param) from None
    if not data:
        raise bad_image(f"{param} holds no image (empty)", param)
    return data


def too_large(size: int, param: str, limits: ImageLimits):
    return bad_image(
        f"{param}: the image is {size} bytes, more than the {limits.max_image_bytes} allowed "
        "per image (the router's max_image_bytes)",
        param,
        "image_too_large",
    )


def decode_image(data: bytes, param: str, limits: ImageLimits) -> DecodedImage:
    """`data` read as an image: its size, format and pixel count checked, then its pixels
    hashed. 400 for anything that is not an image we take."""
    if len(data) > limits.max_image_bytes:
        raise too_large(len(data), param, limits)
    try:
        from PIL import Image
    except ImportError:  # the router reads images with Pillow, part of the vision extra
        raise no_vision(
            "this router cannot read images: install Pillow (pip install 'mlx-fleet[vision]')",
            param,
        ) from None
    with warnings.catch_warnings():  # we check the pixel count ourselves, below
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError:
            raise _too_many_pixels(param, limits, None) from None
        except Exception:  # Pillow raises many kinds (UnidentifiedImageError, OSError, ...)
            raise bad_image(f"{param} is not an image Pillow can read", param) from None
        if image.format not in FORMATS:
            raise bad_image(
                f"{param}: {image.format} images are not supported (send one of "
                f"{', '.join(FORMATS)})",
                param,
                "unsupported_image_format",
            )
        width, height = image.size
        if width * height > limits.max_image_pixels:
            raise _too_many_pixels(param, limits, (width, height))
        try:
            rgb = image.convert("RGB")
        except Exception:  # truncated or corrupt pixel data behind a good header
            raise bad_image(f"{param}: the image could not be decoded", param) from None
    return DecodedImage(data, width, height, image_hash(rgb.tobytes(), "RGB", rgb.size))


def _too_many_pixels(param: str, limits: ImageLimits, size: tuple[int, int] | None):
    what = f"{size[0]}x{size[1]} pixels" if size else "too many pixels"
    return bad_image(
        f"{param}: the image has {what}, more than the {limits.max_image_pixels} allowed "
        "(the router's max_image_pixels)",
        param,
        "image_too_large",
    )
