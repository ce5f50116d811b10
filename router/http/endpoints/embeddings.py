"""POST /v1/embeddings: the body checked and tokenized, one Embed to a worker of the model,
the vectors back in OpenAI's form. A chat model is a 400 (router/errors.py WRONG_TASK)."""

from __future__ import annotations

import uuid

from aiohttp import web

from router.http.access_log import note
from router.http.body import json_object_body
from router.http.embed import embed
from router.http.security import charge_tokens


async def embeddings(request: web.Request) -> web.Response:
    body = await json_object_body(request)
    request_id = f"embd-{uuid.uuid4().hex}"
    reply, served_id, prompt_tokens = await embed(request.app, body, request_id)
    note(request, request_id=request_id, model=served_id, stream=False)
    note(request, prompt_tokens=prompt_tokens, completion_tokens=0, cached_tokens=0)
    await charge_tokens(request, prompt_tokens, 0)
    return web.json_response(reply)
