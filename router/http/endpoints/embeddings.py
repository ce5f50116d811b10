"""POST /v1/embeddings: the body checked and tokenized, one Embed to a worker of the model,
the vectors back in OpenAI's form. A chat model is a 400 (router/errors.py WRONG_TASK)."""

from __future__ import annotations

import uuid

from aiohttp import web

from router.api.embeddings.parse import parse_embeddings
from router.api.embeddings.render import embeddings_reply
from router.errors import embedding_failed, no_workers, not_an_embedding_model, overloaded
from router.http import app_keys
from router.http.access_log import note
from router.http.body import json_object_body
from router.http.generate import parse_off_loop
from router.http.security import charge_tokens
from router.routing.dispatcher import NoWorkerAvailable, Overloaded


async def embeddings(request: web.Request) -> web.Response:
    app = request.app
    body = await json_object_body(request)
    served = app[app_keys.MODELS].for_request(body)
    if served.embedding is None or served.embed_jobs is None:
        raise not_an_embedding_model(served.id)
    req = await parse_off_loop(
        app, parse_embeddings, body, served.tokenizer, served.embedding, served.id
    )
    request_id = f"embd-{uuid.uuid4().hex}"
    note(request, request_id=request_id, model=served.id, stream=False)
    try:
        job = served.embed_jobs.start(request_id, req.inputs, req.dimensions)
    except Overloaded:
        raise overloaded() from None
    except NoWorkerAvailable:
        raise no_workers(served.id) from None
    try:
        answer = await job.future
    finally:
        served.embed_jobs.cancel(job)  # the client left before the answer: abort it there
    if answer.error is not None:
        raise embedding_failed(answer.error)
    served.metrics.usage(req.prompt_tokens, 0, 0)
    note(request, prompt_tokens=req.prompt_tokens, completion_tokens=0, cached_tokens=0)
    await charge_tokens(request, req.prompt_tokens, 0)
    reply = embeddings_reply(answer.vectors, req.encoding_format, served.id, req.prompt_tokens)
    return web.json_response(reply)
