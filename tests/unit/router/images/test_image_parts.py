"""Image parts as each API sends them, and their bytes checked and decoded (no model needed)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest

from router.chat.images.decode import ImageLimits, decode_image, file_bytes
from router.chat.images.parts import image_mark, image_source, user_image_parts
from router.errors import ApiError
from shared.models.vision import image_hash
from tests.unit.router.images.conftest import data_url, png

LIMITS = ImageLimits()


def refused(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as caught:
        fn(*args)
    assert caught.value.status == 400
    return caught.value


# ------------------------------------------------------------ each API's part


def test_openai_chat_image_url_with_a_data_url():
    data = png()
    part = {"type": "image_url", "image_url": {"url": data_url(data), "detail": "low"}}
    source = image_source(part, "messages[0].content[1]")
    assert base64.b64decode(source.base64) == data and source.url is None
    assert source.param == "messages[0].content[1].image_url.url"


def test_a_bare_string_image_url_is_taken_too():  # vLLM and some clients send it so
    part = {"type": "image_url", "image_url": data_url(png())}
    assert image_source(part, "p").base64 is not None


def test_responses_input_image_and_anthropic_base64_block():
    data = png()
    responses = {"type": "input_image", "image_url": data_url(data), "detail": "auto"}
    block = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(data).decode(),
        },
    }
    assert image_source(responses, "input[0].content[0]").base64 == data_url(data)[22:]
    source = image_source(block, "messages[0].content[0]")
    assert source.param == "messages[0].content[0].source.data"
    assert image_source(dict(responses), "a").key == image_source(responses, "b").key


def test_http_urls_are_sources_to_fetch():
    for part in (
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_image", "image_url": "http://example.com/cat.png"},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    ):
        source = image_source(part, "p")
        assert source.url.endswith("cat.png") and source.base64 is None


@pytest.mark.parametrize(
    ("part", "param", "code"),
    [
        ({"type": "image_url"}, "p.image_url.url", "invalid_image"),
        ({"type": "image_url", "image_url": {"url": 5}}, "p.image_url.url", "invalid_image"),
        ({"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}, "p.image_url.url", None),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png,abc"}},
            "p.image_url.url",
            "invalid_image",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}},
            "p.image_url.url",
            "invalid_image",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,x", "detail": "max"}},
            "p.image_url.detail",
            None,
        ),
        ({"type": "input_image", "file_id": "file-1"}, "p.file_id", "unsupported_image_source"),
        ({"type": "input_image"}, "p.image_url", "invalid_image"),
        (
            {"type": "image", "source": {"type": "file", "file_id": "f"}},
            "p.source",
            "unsupported_image_source",
        ),
        (
            {"type": "image", "source": {"type": "base64", "media_type": "text/html", "data": "x"}},
            "p.source.media_type",
            "invalid_image",
        ),
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/png"}},
            "p.source.data",
            "invalid_image",
        ),
        (
            {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}},
            "p.source.url",
            "invalid_image",
        ),
        ({"type": "image"}, "p.source", "unsupported_image_source"),
    ],
)
def test_malformed_parts_are_400s_naming_the_field(part, param, code):
    error = refused(image_source, part, "p")
    assert error.param == param
    if code:
        assert error.code == code


def test_an_image_outside_a_user_message_is_refused():
    part = {"type": "image_url", "image_url": {"url": data_url(png())}}
    error = refused(image_mark, part, "messages[0].content[0]", False)
    assert "user messages only" in error.message


def test_only_user_messages_images_are_collected_in_order():
    a, b = ({"type": "image_url", "image_url": {"url": data_url(png(seed=i))}} for i in (1, 2))
    body = {
        "messages": [
            {"role": "system", "content": [a]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, a]},
            {"role": "user", "content": "text only"},
            {"role": "user", "content": [b]},
        ]
    }
    found = list(user_image_parts(body))
    assert [param for _, param in found] == ["messages[1].content[1]", "messages[3].content[0]"]
    assert [part for part, _ in found] == [a, b]


# ------------------------------------------------------------ bytes and pixels


def test_a_decoded_image_has_its_size_and_a_pixel_hash():
    from PIL import Image

    data = png(40, 60)
    image = decode_image(data, "p", LIMITS)
    assert (image.width, image.height, image.data) == (40, 60, data)
    rgb = Image.open(io.BytesIO(data)).convert("RGB")
    assert image.content_hash == image_hash(rgb.tobytes(), "RGB", rgb.size)


def test_the_same_pixels_in_another_format_hash_alike():
    from PIL import Image

    buffer = io.BytesIO()
    Image.open(io.BytesIO(png())).save(buffer, format="WEBP", lossless=True)
    webp = decode_image(buffer.getvalue(), "p", LIMITS)
    assert webp.content_hash == decode_image(png(), "p", LIMITS).content_hash
    assert decode_image(png(seed=1), "p", LIMITS).content_hash != webp.content_hash


def test_bad_base64_is_a_400():
    error = refused(file_bytes, "not base64!!", "p", LIMITS)
    assert error.message == "p is not valid base64" and error.param == "p"


def test_base64_wrapped_in_lines_is_read():
    text = base64.encodebytes(png()).decode()  # MIME style: a newline every 76 characters
    assert file_bytes(text, "p", LIMITS) == png()


def test_an_oversized_image_is_refused_before_its_base64_is_decoded():
    limits = ImageLimits(max_image_bytes=1000)
    error = refused(file_bytes, "A" * 4000, "p", limits)
    assert error.code == "image_too_large" and "1000" in error.message


def test_bytes_that_are_not_an_image_are_a_400():
    error = refused(decode_image, b"hello, I am text", "p", LIMITS)
    assert error.code == "invalid_image" and "not an image" in error.message


def test_a_format_we_do_not_take_is_a_400():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="TIFF")
    error = refused(decode_image, buffer.getvalue(), "p", LIMITS)
    assert error.code == "unsupported_image_format" and "TIFF" in error.message


def test_too_many_pixels_is_a_400():
    error = refused(decode_image, png(40, 60), "p", ImageLimits(max_image_pixels=1000))
    assert error.code == "image_too_large" and "40x60 pixels" in error.message


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height and holds one empty IDAT: a bomb's header."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [8000, 100_000])  # over our limit; over Pillow's own too
def test_a_decompression_bomb_is_refused_from_its_header(side):
    error = refused(decode_image, _png_header_only(side, side), "p", LIMITS)
    assert error.code == "image_too_large"


def test_a_truncated_image_is_a_400():
    data = png(40, 60)
    error = refused(decode_image, data[: len(data) // 2], "p", LIMITS)
    assert error.code == "invalid_image"
