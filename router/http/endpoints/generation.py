"""The generation endpoints: OpenAI chat, completions and Responses, Anthropic messages. Each is
its API adapter handed to the one skeleton (router/http/generate.py)."""

from __future__ import annotations

from aiohttp import web

from router.api.anthropic.adapter import MESSAGES
from router.api.openai.adapter import CHAT, COMPLETIONS
from router.api.responses.adapter import ResponsesApi
from router.http.body import json_object_body
from router.http.endpoints.stored_responses import keep, view_for
from router.http.generate import generate


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """Text completions; with n > 1, every choice (router/text/pieces.choice_pieces)."""
    return await generate(request, COMPLETIONS)


async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic Messages, whole or as named server-sent events."""
    return await generate(request, MESSAGES)


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI Responses, whole or as named events; kept in the router's store (store: true),
    as the request's API key's own, before the client sees the reply's end."""
    view = await view_for(request, await json_object_body(request))
    return await generate(request, ResponsesApi(view), before_end=lambda: keep(request, view))
