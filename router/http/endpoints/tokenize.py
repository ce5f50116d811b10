"""Endpoints that count or convert tokens with a model's tokenizer, without generating:
vLLM's /tokenize and /detokenize, Anthropic's /v1/messages/count_tokens (router/api/tokenize.py
holds their shapes)."""

from __future__ import annotations

from aiohttp import web

from router.api import tokenize as shapes
from router.chat.images.parts import user_image_parts
from router.http import app_keys
from router.http.body import json_object_body
from router.http.generate import parse_off_loop
from router.http.images import request_images


async def tokenize(request: web.Request) -> web.Response:
    return await _answer(request, shapes.tokenize, model_optional=True)


async def detokenize(request: web.Request) -> web.Response:
    return await _answer(request, shapes.detokenize, model_optional=True)


async def count_tokens(request: web.Request) -> web.Response:
    return await _answer(request, shapes.count_tokens, model_optional=False)


async def _answer(request: web.Request, shape, model_optional: bool) -> web.Response:
    """`shape(body, tokenizer)` of the body's model (vLLM's endpoints default to the first
    served model when `model` is absent; an unknown one is a 404 either way)."""
    app = request.app
    body = await json_object_body(request)
    models = app[app_keys.MODELS]
    served = models.default if model_optional and body.get("model") is None else None
    if served is None:
        served = models.for_request(body)
    images = await request_images(app, served, list(user_image_parts(body)))
    return web.json_response(await parse_off_loop(app, shape, body, served.tokenizer, images))
