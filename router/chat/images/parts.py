"""Image parts as each API spells them, and the mark that stands for one in the chat text.

OpenAI chat: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,...",
"detail": "auto"}}`; Responses: `{"type": "input_image", "image_url": "data:..."}`; Anthropic:
`{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "..."}}`.
Each becomes an ImageSource (base64 text or an http(s) URL). A content parser writes the
source's *mark* where the image goes; the prompt builder (router/chat/images/placement.py)
turns marks into the model's image tokens. A mark is a private-use character around a key of
the source's text, so the same image sent twice has the same mark and is decoded once.

The key is Python's string hash, on purpose: marks never leave the process, the hash is
keyed per process (no one can make two images collide) and cached on the string, so the
content parser's second look at a part the router already read costs nothing. Measured on a
26 MiB base64 string: hash() 9 ms, blake2b 58 ms (and slicing the payload out of its data URL
another 18 ms, so the payload is only sliced where it is decoded, off the loop).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from router.errors import bad_image, bad_request

IMAGE_PARTS = ("image_url", "input_image", "image")  # OpenAI chat, Responses, Anthropic
DETAILS = ("auto", "low", "high")  # accepted; the model's processor decides the resolution
MARK_OPEN, MARK_CLOSE = "\U000f0000", "\U000f0001"
MARK = re.compile(f"{MARK_OPEN}([0-9a-f]{{16}}){MARK_CLOSE}")
_URL_SCHEMES = ("http://", "https://")


@dataclass(frozen=True)
class ImageSource:
    """Where one image part's file is: base64 text from `start` on in `text` (a data URL or
    an Anthropic base64 block's data), or an http(s) URL (`text`) to fetch."""

    param: str  # the field that holds it, for errors
    text: str  # the field's string as sent
    inline: bool  # base64 in `text`; else `text` is a URL
    start: int = 0  # where the base64 starts (after a data URL's comma)

    @property
    def base64(self) -> str | None:
        return self.text[self.start :] if self.inline else None

    @property
    def url(self) -> str | None:
        return None if self.inline else self.text

    @property
    def key(self) -> str:
        return f"{hash(self.text) & 0xFFFF_FFFF_FFFF_FFFF:016x}"

    @property
    def mark(self) -> str:
        return f"{MARK_OPEN}{self.key}{MARK_CLOSE}"


def is_image_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PARTS


def image_mark(part: dict, param: str, allowed: bool) -> str:
    """The text an image part becomes in a message; 400 where images are not `allowed`."""
    if not allowed:
        raise bad_request(
            f"{param}: '{part['type']}' parts are accepted in user messages only", param
        )
    return image_source(part, param).mark


def image_source(part: dict, param: str) -> ImageSource:
    """The part's source, checked for shape (its bytes are checked when decoded)."""
    kind = part["type"]
    if kind == "image_url":
        value = part.get("image_url")
        if isinstance(value, dict):
            _detail(value.get("detail"), f"{param}.image_url.detail")
            value = value.get("url")
        return _from_url(value, f"{param}.image_url.url")
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise bad_image(
                f"{param}.file_id: uploaded files are not supported; send the image as a "
                "data URL in image_url",
                f"{param}.file_id",
                "unsupported_image_source",
            )
        _detail(part.get("detail"), f"{param}.detail")
        return _from_url(part.get("image_url"), f"{param}.image_url")
    return _anthropic_source(part.get("source"), f"{param}.source")


def _detail(detail, param: str) -> None:
    if detail is not None and detail not in DETAILS:
        raise bad_request(f"{param} must be one of {', '.join(DETAILS)}", param)


def _from_url(url, param: str) -> ImageSource:
    if not isinstance(url, str) or not url:
        raise bad_image(f"{param} must be a data URL or an http(s) URL (a string)", param)
    if url.startswith(_URL_SCHEMES):
        return ImageSource(param, url, inline=False)
    if not url.startswith("data:"):
        raise bad_image(
            f"{param} must be a data URL (data:image/png;base64,...) or an http(s) URL", param
        )
    comma = url.find(",", 0, 256)  # the header is short; the payload is not searched
    media_type, _, encoding = url[5:comma].rpartition(";") if comma > 0 else ("", "", "")
    if encoding != "base64":
        raise bad_image(f"{param}: a data URL must be base64: data:image/png;base64,...", param)
    _media_type(media_type, param, optional=True)
    return ImageSource(param, url, inline=True, start=comma + 1)


def _anthropic_source(source, param: str) -> ImageSource:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        _media_type(source.get("media_type"), f"{param}.media_type")
        data = source.get("data")
        if not isinstance(data, str):
            raise bad_image(f"{param}.data must be a base64 string", f"{param}.data")
        return ImageSource(f"{param}.data", data, inline=True)
    if kind == "url":
        url = source.get("url")
        if not (isinstance(url, str) and url.startswith(_URL_SCHEMES)):
            raise bad_image(f"{param}.url must be an http(s) URL", f"{param}.url")
        return ImageSource(f"{param}.url", url, inline=False)
    raise bad_image(
        f"{param} must be {{'type': 'base64', 'media_type', 'data'}} or {{'type': 'url', "
        "'url'}}; file sources are not supported",
        param,
        "unsupported_image_source",
    )


def _media_type(media_type, param: str, optional: bool = False) -> None:
    if optional and not media_type:
        return
    if not (isinstance(media_type, str) and media_type.startswith("image/")):
        raise bad_image(f"{param}: {media_type!r} is not an image media type", param)


def user_image_parts(body: dict) -> Iterator[tuple[dict, str]]:
    """The image parts of a body's user messages, in order, with the field naming each: chat
    and Anthropic `messages`, Responses `input` (images elsewhere get their 400 from the
    content parsers)."""
    for key in ("messages", "input"):
        yield from message_image_parts(body.get(key), key)


def message_image_parts(items, key: str) -> Iterator[tuple[dict, str]]:
    if not isinstance(items, list | tuple):  # a body's array, or stored history
        return
    for i, message in enumerate(items):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if message.get("type", "message") != "message" or not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if is_image_part(part):
                yield part, f"{key}[{i}].content[{j}]"
