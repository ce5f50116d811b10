"""A request's images, read before its prompt is built: checked against the router's limits,
fetched when they are URLs (only where the operator allows it), decoded and hashed off the
event loop when large. What they become in the prompt is router/chat/images/'s business.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from router.chat.images.decode import ImageLimits, decode_image, file_bytes, too_large
from router.chat.images.parts import image_source
from router.chat.images.placement import NO_IMAGES, PromptImages, vision_spec_of
from router.errors import bad_image, no_vision
from router.http import app_keys

if TYPE_CHECKING:
    from collections.abc import Sequence

    from router.chat.images.parts import ImageSource
    from router.cluster.registry import WorkerState
    from router.routing.models import ServedModel

# Below this many bytes an image is decoded on the loop. Measured here (x86-64, one core): a
# 184 KiB PNG decodes and hashes in 3.4 ms, a 2 MiB one in 28 ms, an 8 MiB one in 113 ms;
# base64 decoding is a third of that. Above ~4 ms of work, a thread.
OFF_LOOP_BYTES = 256 * 1024
VISION_EXTRA = "pip install 'mlx-fleet[vision]'"


async def request_images(
    app: web.Application,
    served: ServedModel,
    parts: Sequence[tuple[dict, str]],
    workers: Sequence[WorkerState] | None = None,
) -> PromptImages:
    """The decoded images of `parts` (each an image part and the field naming it), by their
    source's key; 400 for a model or `workers` (when given: those that would serve it)
    without vision, or an image over a limit or unreadable."""
    if not parts:
        return NO_IMAGES
    vision_spec_of(served.tokenizer, served.id, parts[0][1])
    if workers is not None:
        require_vision_workers(workers, served.id, parts[0][1])
    config = app[app_keys.CONFIG]
    limits = ImageLimits.of(config)
    if len(parts) > limits.max_images:
        param = parts[limits.max_images][1]
        raise bad_image(
            f"the request holds {len(parts)} images, more than the {limits.max_images} "
            "allowed (the router's max_images)",
            param,
            "too_many_images",
        )
    sources: dict[str, ImageSource] = {}
    for part, param in parts:
        source = image_source(part, param)
        sources.setdefault(source.key, source)  # the same image twice is read once
    decoded, total = {}, 0
    for key, source in sources.items():
        data = await _file(source, config, limits)
        total += len(data)
        if total > limits.max_request_image_bytes:
            raise bad_image(
                f"{source.param}: the request's images are over "
                f"{limits.max_request_image_bytes} bytes together (the router's "
                "max_request_image_bytes)",
                source.param,
                "image_too_large",
            )
        decoded[key] = await _off_loop(len(data), decode_image, data, source.param, limits)
    return PromptImages(decoded)


def require_vision_workers(
    workers: Sequence[WorkerState], model: str, param: str | None = None
) -> None:
    """400 when every worker that could serve the request runs without vision (none at all:
    the dispatcher's 503 says so)."""
    if not workers or any(w.info.vision for w in workers):
        return
    why = "; ".join(sorted({w.info.vision_note for w in workers if w.info.vision_note}))
    why = why or "they run without the vision extra"
    hint = "" if VISION_EXTRA in why else f"; start the workers with `{VISION_EXTRA}`"
    raise no_vision(
        f"model '{model}' takes images, but none of its workers does: {why}{hint}", param
    )


def _inline_bytes(source: ImageSource, limits: ImageLimits) -> bytes:
    return file_bytes(source.base64, source.param, limits)


async def _off_loop(size: int, fn, *args):
    if size < OFF_LOOP_BYTES:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


async def _file(source: ImageSource, config, limits: ImageLimits) -> bytes:
    if source.inline:  # the payload is sliced out (a copy) in the thread too, when large
        size = len(source.text) - source.start
        return await _off_loop(size, _inline_bytes, source, limits)
    if not config.image_fetch:
        raise bad_image(
            f"{source.param}: this router does not fetch image URLs (its image_fetch setting "
            "is off); send the image inline: a data URL (data:image/png;base64,...) or a "
            "base64 source",
            source.param,
            "image_url_not_allowed",
        )
    return await fetch_image(source, limits, config.image_fetch_timeout_s)


async def fetch_image(source: ImageSource, limits: ImageLimits, timeout_s: float) -> bytes:
    """The file at `source.url`, read up to the per-image byte limit within `timeout_s`."""
    param, most = source.param, limits.max_image_bytes
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(source.url) as resp,
        ):
            if resp.status != 200:
                raise _fetch_failed(param, f"the server answered HTTP {resp.status}")
            if (resp.content_length or 0) > most:
                raise too_large(resp.content_length, param, limits)
            data = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                data += chunk
                if len(data) > most:
                    raise too_large(len(data), param, limits)
            return bytes(data)
    except asyncio.TimeoutError:
        raise _fetch_failed(param, f"no answer within {timeout_s:g} s") from None
    except (aiohttp.ClientError, ValueError) as e:  # ValueError: a URL aiohttp can't use
        raise _fetch_failed(param, str(e) or type(e).__name__) from None


def _fetch_failed(param: str, why: str):
    return bad_image(f"{param}: the image could not be fetched: {why}", param, "image_fetch_failed")
